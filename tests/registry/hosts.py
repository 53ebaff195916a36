"""Runners that stand in for separate hosts: a real daemon on the real QEMU provider, each with its own
state dir, its own test peer (the control plane's side of the protocol), and the same registry.

Shared by tests/registry/test_two_runners.py and bench/two_hosts.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from runner.peer import Peer

from gh_runner.config import RunnerConfig
from gh_runner.daemon import Daemon
from gh_wire.protocol import FrozenCase, Job, Lease, StartStateRef, TaskEnd
from providers.qemu import QemuProvider  # type: ignore[attr-defined]
from registry.server import RegistryProcess

WAIT = 300.0  # a loaded 2-core host under TCG


@dataclass
class Host:
    name: str
    peer: Peer
    daemon: Daemon
    task: asyncio.Task[int]
    state_dir: Path

    async def stop(self) -> None:
        self.daemon.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self.task), 120)
        self.peer.kill()
        await self.peer.stop()


async def start_host(letter: str, root: Path, images_dir: Path, registry: RegistryProcess, slots: int = 2,
                     repository: str = "gh-test") -> Host:
    peer = Peer(heartbeat_interval=1.0, dead_after=30.0)
    await peer.start()
    state = root / letter
    name = f"regt{letter.lower()}-{secrets.token_hex(2)}"
    cfg = RunnerConfig(
        server=peer.url, token=SecretStr(Peer.token), name=name, slots=slots, state_dir=state,
        images_dir=images_dir, reap_interval=3600, drain_grace=30, warm_snapshots=False,
        registry={"url": registry.url, "repository": repository, "ca_file": registry.ca_file,
                  "credentials_file": registry.credentials_file, "cache_mib": 4096},
    )
    daemon = Daemon(cfg, QemuProvider(images_dir, state, name))
    host = Host(letter, peer, daemon, asyncio.create_task(daemon.run()), state)
    await peer.wait_type("hello", timeout=WAIT)
    return host


async def build_state(host: Host, ssid: str, script: str, version: int = 1) -> Any:
    """A start state built (and so pushed) on `host`; returns the job result."""
    job_id = "jb_" + secrets.token_hex(4)
    await host.peer.send(Job(job_id=job_id, op="build", start_state_id=ssid, version=version,
                             source=StartStateRef(kind="image", image="linux-tiny"), script=script, script_timeout=120))
    return await host.peer.wait_type("job_result", timeout=WAIT, where=lambda m: m.job_id == job_id)


def state_lease(attempt_id: str, ssid: str, setup: str, version: int = 1) -> Lease:
    case = FrozenCase(test_case_id="tc_reg", name="from the registry", prompt="nothing to do",
                      setup_script=setup, check_script="echo False")
    return Lease(attempt_id=attempt_id, agent_id="ag_noop", case=case,
                 start_state=StartStateRef(kind="state", image="linux-tiny", start_state_id=ssid, version=version))


async def finish(host: Host, attempt_id: str) -> Any:
    """Once the lease is accepted: play the agent (end the task at once) and return the result."""
    await host.peer.wait_type("attempt_status", timeout=WAIT,
                              where=lambda m: m.attempt_id == attempt_id and m.status in ("running", "done"))
    await host.peer.send(TaskEnd(attempt_id=attempt_id, answer="done"))
    fin = await host.peer.wait_type("attempt_result", timeout=WAIT, where=lambda m: m.result.attempt_id == attempt_id)
    return fin.result


async def run_to_result(host: Host, attempt_id: str) -> Any:
    await host.peer.wait_type("lease_accept", timeout=WAIT, where=lambda m: m.attempt_id == attempt_id)
    return await finish(host, attempt_id)
