"""Two runners, one registry: a start state saved on runner A serves attempts on runner B, which never
saw it; and the faults: a tampered blob, the registry killed.

Real daemons (gh_runner.daemon) on the real QEMU provider and the linux-tiny guest, each with its
own state dir and its own test peer standing in for the control plane (the peer is the clear
boundary: the server's side has its own tests), and a real registry (docker-registry) on loopback.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kit.scratch import traversable_tmpdir

from gh_wire.protocol import Job, Lease, LeaseRefusal
from registry.hosts import WAIT, Host, build_state, run_to_result, start_host, state_lease
from registry.server import RegistryProcess

pytestmark = [pytest.mark.libvirt, pytest.mark.slow]

SSID = "ss_reg" + secrets.token_hex(3)
MARK = "saved-on-A-" + secrets.token_hex(4)


@pytest.fixture
async def runners(images_dir: Path) -> AsyncIterator[Callable[..., Any]]:
    made: list[Host] = []
    # Under /var/tmp with traversable parents: libvirt-qemu must reach the disks.
    root = traversable_tmpdir("gh-registry-test-")

    async def start(letter: str, registry: RegistryProcess, slots: int = 2) -> Host:
        host = await start_host(letter, root, images_dir, registry, slots)
        made.append(host)
        return host

    try:
        yield start
    finally:
        for h in made:
            await h.stop()
        shutil.rmtree(root, ignore_errors=True)


def lease(attempt_id: str, setup: str) -> Lease:
    return state_lease(attempt_id, SSID, setup)


async def save_on(a: Host, registry: RegistryProcess) -> str:
    done = await build_state(a, SSID, f"echo {MARK} > /gh-marker; sync")
    assert done.ok, done.error
    assert done.registry_error is None
    assert done.registry_ref and done.registry_ref.startswith(f"{registry.host}/gh-test/states@sha256:")
    return str(done.registry_ref)


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

    # The control plane's delete reaches B too (gh_server.start_state_jobs.holders): its pulled copy goes.
    await b.peer.send(Job(job_id="jb_reg_del", op="delete", start_state_id=SSID))
    done = await b.peer.wait_type("job_result", timeout=WAIT, where=lambda m: m.job_id == "jb_reg_del")
    assert done.ok, done.error
    assert not (b.state_dir / "states" / SSID).exists()


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
