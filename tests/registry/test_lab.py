"""The whole way, through a real gh-server: a start state built on runner A is pushed to the registry,
and a run's attempts on it are leased to runner B too (which never saw it), B pulls it once, and every
try passes on A's disk; with the registry killed, B refuses (typed) and A, the holder, runs them all:
no error verdicts.

The stack is tests/startstates' (gh-server under uvicorn, real daemons on the QEMU provider); this
module adds a registry and a second runner. Runner A starts alone, so the build lands on it.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from guidinghand import Eager
from kit.libvirt import LIBVIRT_URI
from startstates.conftest import Stack

from registry.server import RegistryProcess

pytestmark = [pytest.mark.libvirt, pytest.mark.slow]

RUN_TIMEOUT = 900.0
MARK = "lab-" + secrets.token_hex(4)


class LabStack(Stack):
    def __init__(self, images_dir: Path, registry: RegistryProcess) -> None:
        super().__init__(images_dir)
        self.registry = registry
        self.runner_b: Any = None
        self._b_task: asyncio.Task[Any] | None = None
        self.name = "lab" + secrets.token_hex(2)

    def _cfg(self, token: str, letter: str) -> Any:
        from gh_runner.config import load_config

        state_dir = self.tmp / f"runner-{letter}"
        state_dir.mkdir(mode=0o755)
        return load_config(flags={"server": self.base_url, "token": token, "name": f"{self.name}{letter}", "slots": 2,
                                  "images_dir": self.images_dir, "state_dir": state_dir, "libvirt_uri": LIBVIRT_URI,
                                  "warm_snapshots": False,
                                  "registry": {"url": self.registry.url, "repository": "lab"}}, env={})

    async def _start_daemon(self, token: str) -> asyncio.Task[Any]:
        from gh_runner.daemon import Daemon
        from gh_runner.provider_factory import make_provider

        cfg = self._cfg(token, "a")
        self.daemon = Daemon(cfg, make_provider(cfg))
        return asyncio.create_task(self.daemon.run())

    async def start_b(self) -> None:
        from gh_runner.daemon import Daemon
        from gh_runner.provider_factory import make_provider

        async with httpx.AsyncClient(base_url=self.base_url, timeout=30,
                                     headers={"Authorization": f"Bearer {self.admin_key}"}) as http:
            r = await http.post("/v1/runners", json={"name": f"{self.name}b"})
            r.raise_for_status()
            cfg = self._cfg(str(r.json()["token"]), "b")
            self.runner_b = Daemon(cfg, make_provider(cfg))
            self._b_task = asyncio.create_task(self.runner_b.run())
            for _ in range(600):
                runners = (await http.get("/v1/runners")).json()["data"]
                if sum(1 for x in runners if x.get("status") == "online") == 2:
                    return
                await asyncio.sleep(0.2)
        raise RuntimeError("runner B did not come online")

    async def stop_b(self) -> None:
        if self.runner_b is not None and self._b_task is not None:
            self.runner_b.request_stop()
            await asyncio.wait_for(asyncio.shield(self._b_task), 240)


@pytest.fixture
def lab(images_dir: Path, tmp_path: Path) -> Iterator[LabStack]:
    reg = RegistryProcess.start(tmp_path / "registry")
    try:
        s = LabStack(images_dir, reg)
        s.start()  # stops what it started when it fails
        try:
            yield s
        finally:
            try:
                s.call(s.stop_b(), timeout=300)
            finally:
                s.stop()
    finally:
        reg.stop()


def by_runner(gh: Eager, run_id: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for a in gh.test_runs.attempts(run_id, limit=100)["data"]:
        out.setdefault(str(a["runner_id"]), []).append(dict(a))
    return out


def test_a_version_saved_on_a_runs_on_b_and_a_dead_registry_makes_no_errors(lab: LabStack) -> None:
    gh = lab.sdk()
    ss = gh.start_states.create("shared through the registry", "linux-tiny",
                                script=f"echo {MARK} > /gh-marker; sync")
    ssid = ss["start_state_id"]
    ready = gh.start_states.wait(ssid, timeout=RUN_TIMEOUT, poll_interval=1)
    assert ready["status"] == "ready", ready
    lab.call(lab.start_b(), timeout=300)
    check = f'if [ "$GH_CHECK_PHASE" = after ] && grep -qx {MARK} /gh-marker; then echo True; else echo False; fi'
    case = gh.test_cases.create("marker from A", "Nothing to do.", ssid,  # type: ignore[arg-type]
                                {"check_script": check}, limits={"minutes": 5})
    case_id = str(case["test_case_id"])

    run = gh.test_runs.create(test_case_ids=[case_id], agents=["noop"], repeat=8)
    done = gh.test_runs.wait(run["test_run_id"], timeout=RUN_TIMEOUT, poll_interval=1)
    attempts = by_runner(gh, run["test_run_id"])
    every = [a for group in attempts.values() for a in group]
    assert [a["error"] for a in every if a["outcome"] != "passed"] == [], every
    assert len(attempts) == 2, f"every attempt ran on one runner: {list(attempts)}"
    b_id = next(rid for rid in attempts if rid != ready["runner_id"])
    fetched = [a["metrics"]["phase_seconds"].get("fetch") for a in attempts[b_id]]
    assert any(f and f > 0 for f in fetched), fetched
    assert lab.runner_b.library.pulls_done == 1
    assert done["status"] == "completed"

    # A second version pushed, then the registry killed: the runner without it cannot pull it and
    # refuses (typed); its holder runs every try. No error verdicts.
    v2 = gh.start_states.create("shared, then the registry goes", "linux-tiny",
                                script=f"echo {MARK} > /gh-marker; sync")
    built = gh.start_states.wait(v2["start_state_id"], timeout=RUN_TIMEOUT, poll_interval=1)
    assert built["status"] == "ready", built
    lab.registry.stop()
    case2 = gh.test_cases.create("marker, registry down", "Nothing to do.", v2["start_state_id"],  # type: ignore[arg-type]
                                 {"check_script": check}, limits={"minutes": 5})
    run2 = gh.test_runs.create(test_case_ids=[str(case2["test_case_id"])], agents=["noop"], repeat=4)
    gh.test_runs.wait(run2["test_run_id"], timeout=RUN_TIMEOUT, poll_interval=1)
    second = by_runner(gh, run2["test_run_id"])
    assert list(second) == [built["runner_id"]], list(second)
    every2 = second[str(built["runner_id"])]
    assert [a["outcome"] for a in every2] == ["passed"] * 4, every2
    assert lab.runner_b.library.pulls_done + lab.daemon.library.pulls_done == 1
    gh.close()
