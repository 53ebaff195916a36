"""Two runners, one registry: a start state saved on runner A serves attempts on runner B, which never
saw it; and the faults: a tampered blob, the registry killed.

Real daemons (gh_runner.daemon) on the real QEMU provider and the linux-tiny guest, each with its
own state dir and its own test peer standing in for the control plane (the peer is the clear
boundary: the server's side has its own tests), and a real registry (docker-registry) on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from runner.peer import Peer

from gh_runner.config import RunnerConfig
from gh_runner.daemon import Daemon
from gh_wire.protocol import FrozenCase, Job, Lease, LeaseRefusal, StartStateRef, TaskEnd
from providers.qemu import QemuProvider  # type: ignore[attr-defined]
from registry.server import RegistryProcess

pytestmark = [pytest.mark.libvirt, pytest.mark.slow]

WAIT = 300.0  # a loaded 2-core host under TCG
SSID = "ss_reg" + secrets.token_hex(3)
MARK = "saved-on-A-" + secrets.token_hex(4)


class Runner:
    def __init__(self, name: str, peer: Peer, daemon: Daemon, task: asyncio.Task[int], state_dir: Path) -> None:
        self.name = name
        self.peer = peer
        self.daemon = daemon
        self.task = task
        self.state_dir = state_dir


@pytest.fixture
async def runners(images_dir: Path) -> AsyncIterator[Callable[..., Any]]:
    made: list[Runner] = []
    # Under /var/tmp with traversable parents: libvirt-qemu must reach the disks.
    root = Path(tempfile.mkdtemp(prefix="gh-registry-test-", dir="/var/tmp"))
    root.chmod(0o755)  # noqa: ASYNC240 - fixture set-up

    async def start(letter: str, registry: RegistryProcess, slots: int = 2) -> Runner:
        peer = Peer(heartbeat_interval=1.0, dead_after=30.0)
        await peer.start()
        state = root / letter
        name = f"regt{letter.lower()}-{secrets.token_hex(2)}"
        cfg = RunnerConfig(
            server=peer.url, token=SecretStr(Peer.token), name=name, slots=slots, state_dir=state,
            images_dir=images_dir, reap_interval=3600, drain_grace=30, warm_snapshots=False,
            registry={"url": registry.url, "repository": "gh-test", "ca_file": registry.ca_file,
                      "credentials_file": registry.credentials_file, "cache_mib": 1024},
        )
        provider = QemuProvider(images_dir, state, name)
        daemon = Daemon(cfg, provider)
        r = Runner(letter, peer, daemon, asyncio.create_task(daemon.run()), state)
        made.append(r)
        await peer.wait_type("hello", timeout=WAIT)
        return r

    try:
        yield start
    finally:
        for r in made:
            r.daemon.request_stop()
        for r in made:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(r.task, 120)
            r.peer.kill()
            await r.peer.stop()
        shutil.rmtree(root, ignore_errors=True)


def lease(attempt_id: str, setup: str) -> Lease:
    case = FrozenCase(test_case_id="tc_reg", name="from the registry", prompt="nothing to do",
                      setup_script=setup, check_script="echo False")
    return Lease(attempt_id=attempt_id, agent_id="ag_noop", case=case,
                 start_state=StartStateRef(kind="state", image="linux-tiny", start_state_id=SSID, version=1))


async def save_on(a: Runner, registry: RegistryProcess) -> str:
    await a.peer.send(Job(job_id="jb_" + secrets.token_hex(4), op="build", start_state_id=SSID, version=1,
                          source=StartStateRef(kind="image", image="linux-tiny"),
                          script=f"echo {MARK} > /gh-marker; sync", script_timeout=120))
    done = await a.peer.wait_type("job_result", timeout=WAIT)
    assert done.ok, done.error
    assert done.registry_error is None
    assert done.registry_ref and done.registry_ref.startswith(f"{registry.host}/gh-test/states@sha256:")
    return str(done.registry_ref)


async def run_to_result(r: Runner, attempt_id: str) -> Any:
    await r.peer.wait_type("lease_accept", timeout=WAIT, where=lambda m: m.attempt_id == attempt_id)
    await r.peer.wait_type("attempt_status", timeout=WAIT,
                           where=lambda m: m.attempt_id == attempt_id and m.status == "running")
    await r.peer.send(TaskEnd(attempt_id=attempt_id, answer="done"))
    fin = await r.peer.wait_type("attempt_result", timeout=WAIT, where=lambda m: m.result.attempt_id == attempt_id)
    return fin.result


async def test_a_state_saved_on_one_runner_serves_another(secure_registry: RegistryProcess,
                                                          runners: Callable[..., Any]) -> None:
    a = await runners("A", secure_registry)
    b = await runners("B", secure_registry)
    await save_on(a, secure_registry)
    assert not (b.state_dir / "states" / SSID).exists()

    # Two leases at once on B, which lacks the version: one pull serves both; both run on A's disk.
    check_marker = f"grep -qx {MARK} /gh-marker"
    await b.peer.send(lease("at_reg_b1", check_marker))
    await b.peer.send(lease("at_reg_b2", check_marker))
    results = await asyncio.gather(run_to_result(b, "at_reg_b1"), run_to_result(b, "at_reg_b2"))
    for res in results:
        assert res.error is None, res.error
        assert res.outcome == "failed"  # the setup found A's marker; the check said False: no error
        assert next(iter(res.metrics.phase_seconds)) == "fetch" and res.metrics.phase_seconds["fetch"] > 0
        assert res.metrics.machine_origin == "restored"  # A's memory image came along
    assert b.daemon.library is not None and b.daemon.library.pulls_done == 1
    assert (b.state_dir / "states" / SSID / "v1" / "disk.qcow2").is_file()
    assert list((b.state_dir / "fetch").iterdir()) == []

    # Held now: the next lease does not pull again.
    await b.peer.send(lease("at_reg_b3", check_marker))
    res = await run_to_result(b, "at_reg_b3")
    assert res.error is None and res.metrics.phase_seconds.get("fetch") == 0.0
    assert b.daemon.library.pulls_done == 1


async def test_tampered_blob_and_dead_registry_are_refusals(plain_registry: RegistryProcess,
                                                           runners: Callable[..., Any]) -> None:
    a = await runners("A", plain_registry)
    c = await runners("C", plain_registry)
    await save_on(a, plain_registry)
    assert c.daemon.library is not None

    # A blob whose bytes no longer match its digest: refused, typed, nothing kept on C.
    _digest, manifest = await c.daemon.library.registry.get_manifest("gh-test/states", f"{SSID}.v1")
    disk = next(d for d in manifest.layers if d.annotations.get("org.opencontainers.image.title") == "disk.qcow2")
    data = plain_registry.blob_file(disk.digest)
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    await c.peer.send(lease("at_reg_bad", "true"))
    r = await c.peer.wait_type("lease_refuse", timeout=WAIT, where=lambda m: m.attempt_id == "at_reg_bad")
    assert r.code == LeaseRefusal.REGISTRY_INVALID
    assert disk.digest in r.reason and "expected" in r.reason
    assert not (c.state_dir / "states" / SSID).exists()
    assert list((c.state_dir / "fetch").iterdir()) == []
    assert c.daemon.busy == 0

    # The registry killed: refused within the bound, typed, and no attempt result at all (no error verdict).
    plain_registry.stop()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await c.peer.send(lease("at_reg_down", "true"))
    r = await c.peer.wait_type("lease_refuse", timeout=WAIT, where=lambda m: m.attempt_id == "at_reg_down")
    assert r.code == LeaseRefusal.REGISTRY_UNAVAILABLE
    assert loop.time() - t0 < 15.0  # the manifest look-up's bound (10 s) and the connect timeout
    assert c.peer.of_type("attempt_result") == []
    assert not (c.state_dir / "states" / SSID).exists()
    # A, the holder, still serves the version with the registry down.
    await a.peer.send(lease("at_reg_a", f"grep -qx {MARK} /gh-marker"))
    res = await run_to_result(a, "at_reg_a")
    assert res.error is None and res.outcome == "failed"
