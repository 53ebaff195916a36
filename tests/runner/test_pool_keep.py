"""What the hot pool keeps, as configured: `pool.keep` and `pool.keep_leased_s` from the file, the
environment (GH_RUNNER_POOL_KEEP, GH_RUNNER_POOL_KEEP_LEASED_S) and the flags (--pool-keep,
--pool-keep-leased-s), key by key in that order over the file; bad values refused with the key; the
provider's pool given what to keep; gh-runner local's runner keeping its cases' images."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gh_runner.cli import _config_from, build_parser
from gh_runner.config import ConfigError, load_config
from gh_runner.poolsize import PoolSizing, plan_pool
from gh_runner.provider_factory import make_provider
from providers.base import MachineSource
from providers.qemu.pool import KEEP_LEASED_S

FREE = 1 << 20  # MiB: the auto sizes, whatever this host has free


def _config(tmp_path: Path, text: str = "", env: dict[str, str] | None = None, **flags: Any) -> Any:
    f = tmp_path / "runner.yaml"
    f.write_text(text or "{}\n")
    return load_config({"state_dir": str(tmp_path / "state"), "images_dir": str(tmp_path / "images"), **flags},
                       env or {}, f)


def test_nothing_is_kept_unless_the_config_says_and_the_sizes_stay_automatic(tmp_path: Path) -> None:
    plain = plan_pool(_config(tmp_path), free=FREE)
    assert plain.keep == () and plain.keep_leased_s == KEEP_LEASED_S
    kept = plan_pool(_config(tmp_path, "pool:\n  keep: [linux-tiny, linux-desktop, linux-tiny]\n"), free=FREE)
    assert kept.keep == ("linux-tiny", "linux-desktop") and kept.sizing is PoolSizing.AUTO
    assert (kept.per_source, kept.total_mib) == (plain.per_source, plain.total_mib)
    assert "keeps linux-tiny, linux-desktop and what was leased in the last 1800 s" in kept.describe()
    sized = plan_pool(_config(tmp_path, "pool:\n  per_source: 2\n  total_mib: 900\n  keep_leased_s: 60\n"
                              "  keep: linux-tiny\n"), free=FREE)
    assert (sized.per_source, sized.total_mib, sized.sizing) == (2, 900, PoolSizing.CONFIG)
    assert sized.keep == ("linux-tiny",) and sized.keep_leased_s == 60


def test_flags_over_env_over_file_key_by_key_and_off_stays_off(tmp_path: Path) -> None:
    text = "pool:\n  keep: [from-file]\n  keep_leased_s: 120\n"
    env = {"GH_RUNNER_POOL_KEEP": "env-a, env-b"}
    cfg = _config(tmp_path, text, env)
    assert cfg.pool.keep == ["env-a", "env-b"] and cfg.pool.keep_leased_s == 120  # env over the file's key
    cfg = _config(tmp_path, text, {**env, "GH_RUNNER_POOL_KEEP_LEASED_S": "300"}, pool={"keep": "flag-a"})
    assert cfg.pool.keep == ["flag-a"] and cfg.pool.keep_leased_s == 300
    assert _config(tmp_path, "", env).pool.keep == ["env-a", "env-b"]
    off = _config(tmp_path, "pool: off\n", env)
    assert off.pool.keep == ["env-a", "env-b"] and not plan_pool(off, free=FREE).enabled
    args = build_parser().parse_args(["--pool-keep", "linux-tiny,linux-desktop", "--pool-keep-leased-s", "90",
                                      "--config", str(tmp_path / "runner.yaml")])
    cfg = _config_from(args)
    assert cfg.pool.keep == ["linux-tiny", "linux-desktop"] and cfg.pool.keep_leased_s == 90


@pytest.mark.parametrize(("text", "env", "says"), [
    ("pool:\n  keep: [Linux Tiny]\n", {}, "pool.keep: Value error, 'Linux Tiny' is not an image name"),
    ("pool:\n  keep: linux-tiny\n  keep_leased_s: 0\n", {}, "pool.keep_leased_s: Input should be greater than 0"),
    ("pool:\n  kept: [linux-tiny]\n", {}, "pool.kept: unknown key; allowed keys: keep, keep_leased_s, per_source"),
    ("pool:\n  per_source: 2\n", {}, "per_source and total_mib are set together"),
    ("", {"GH_RUNNER_POOL_KEEP": "ok,../x"}, "GH_RUNNER_POOL_KEEP: Value error, '../x' is not an image name"),
    ("", {"GH_RUNNER_POOL_KEEP_LEASED_S": "soon"}, "GH_RUNNER_POOL_KEEP_LEASED_S: Input should be a valid number"),
])
def test_bad_values_are_refused_with_the_key(tmp_path: Path, text: str, env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError) as e:
        _config(tmp_path, text, env)
    assert says in str(e.value)


def test_the_provider_is_told_what_to_keep(tmp_path: Path) -> None:
    p = make_provider(_config(tmp_path, "pool:\n  keep: [linux-tiny]\n  keep_leased_s: 45\n"))
    assert p.pool is not None  # type: ignore[attr-defined]
    assert p.pool.config.keep == frozenset({MachineSource(image="linux-tiny")})  # type: ignore[attr-defined]
    assert p.pool.config.keep_leased_s == 45  # type: ignore[attr-defined]
    assert make_provider(_config(tmp_path)).pool.config.keep == frozenset()  # type: ignore[attr-defined]


def test_local_keeps_its_cases_images_unless_the_pool_is_off(tmp_path: Path) -> None:
    """gh-runner local's runner keeps the images its cases start from (gh_local/local.py)."""
    cfg = _config(tmp_path, "pool:\n  keep: [linux-desktop]\n").keeping(["linux-tiny"])
    assert cfg.pool.keep == ["linux-desktop", "linux-tiny"]
    assert plan_pool(_config(tmp_path).keeping(["linux-tiny"]), free=FREE).keep == ("linux-tiny",)
    off = _config(tmp_path, "pool: off\n").keeping(["linux-tiny"])
    assert not plan_pool(off, free=FREE).enabled
    with pytest.raises(ConfigError, match=r"pool\.keep: .*Not An Image"):
        _config(tmp_path).keeping(["Not An Image"])
