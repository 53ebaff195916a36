"""The hot pool on by default where it pays (gh_runner/poolsize.py): with no `pool:` in the config it is sized
from the slots and the host's free memory, `pool: off` turns it off, explicit sizes are kept, the
provider gets what the rule says, and the daemon's start line says which."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from gh_runner.config import ConfigError, load_config
from gh_runner.poolsize import AUTO_MAX_MIB, PoolPlan, PoolSizing, free_mib, free_mib_at_start, plan_pool
from gh_runner.provider_factory import make_provider

from .peer import Peer


def _config(tmp_path: Path, text: str = "", **flags: Any) -> Any:
    f = tmp_path / "runner.yaml"
    f.write_text(text or "{}\n")
    return load_config({"state_dir": str(tmp_path / "state"), "images_dir": str(tmp_path / "images"), **flags},
                       {}, f)


def test_no_pool_config_sizes_one_from_the_slots_and_free_memory(tmp_path: Path) -> None:
    two = _config(tmp_path, slots=2)
    assert two.pool is None
    assert plan_pool(two, free=8192) == PoolPlan(2, 2048, PoolSizing.AUTO,
                                                 "sized from 2 slot(s) and 8192 MiB free; pool: off turns it off")
    assert plan_pool(_config(tmp_path, slots=16), free=8192).per_source == 4  # a pool per slot, within reason
    assert plan_pool(_config(tmp_path, slots=1), free=1 << 20).total_mib == AUTO_MAX_MIB
    # Where it does not pay: a host short of memory, or nothing to restore from.
    short = plan_pool(two, free=1500)
    assert not short.enabled and "1500 MiB free" in short.describe()
    cold = plan_pool(_config(tmp_path, "warm_snapshots: false\n", slots=2), free=8192)
    assert cold.sizing is PoolSizing.OFF and "warm snapshots are off" in cold.describe()


def test_pool_off_turns_it_off_and_explicit_sizes_are_kept(tmp_path: Path) -> None:
    for text in ("pool: off\n", "pool: 'off'\n", "pool: false\n"):
        plan = plan_pool(_config(tmp_path, text), free=1 << 20)
        assert plan.sizing is PoolSizing.OFF and plan.describe() == "hot pool off (pool: off in the config)", text
    assert plan_pool(_config(tmp_path, "pool:\n  per_source: 0\n  total_mib: 4096\n"), free=1 << 20).sizing \
        is PoolSizing.OFF
    kept = plan_pool(_config(tmp_path, "pool:\n  per_source: 3\n  total_mib: 900\n"), free=100)
    assert (kept.per_source, kept.total_mib, kept.sizing) == (3, 900, PoolSizing.CONFIG)
    with pytest.raises(ConfigError, match="pool"):
        _config(tmp_path, "pool: sometimes\n")


def test_the_provider_gets_the_pool_the_rule_says(tmp_path: Path) -> None:
    free = free_mib_at_start()
    assert free is not None and free == pytest.approx(free_mib(), rel=0.5)
    auto = make_provider(_config(tmp_path, slots=2))
    off = make_provider(_config(tmp_path, "pool: off\n", slots=2))
    want = plan_pool(_config(tmp_path, slots=2))
    assert want.enabled, "this host has memory to spare"
    assert auto.pool is not None  # type: ignore[attr-defined]
    assert (auto.pool.config.per_source, auto.pool.config.total_mib) == (2, want.total_mib)  # type: ignore[attr-defined]
    assert off.pool is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(("text", "says"), [("", "hot pool 2 per source within"),
                                             ("pool: off\n", "hot pool off (pool: off in the config)")])
async def test_the_daemons_start_line_says_how_big_its_pool_is(
        peer: Peer, start_daemon: Any, tmp_path: Path, text: str, says: str) -> None:
    cfg = _config(tmp_path, text)
    with capture_logs() as logs:
        await start_daemon(peer.url, slots=2, pool=cfg.pool)
        await peer.wait_type("hello")
    start = next(e for e in logs if e["event"] == "runner starting")
    assert says in start["pool"]
