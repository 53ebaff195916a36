"""Warm snapshots on the real thing: machines on an image start from its booted snapshot, its RAM
mapped private (lazy), and are as fresh as a cold boot (nothing another machine wrote, on disk or in
memory, their own disk, the host's clock); a restarted provider reuses the snapshot it kept, and
the full restore of the same snapshot (the fallback) works too."""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import time
from pathlib import Path

import pytest
from kit.libvirt import LIBVIRT_URI, ensure_libvirtd

from providers.base import MachineOrigin, MachineSource
from providers.qemu import QemuMachine, QemuProvider

from .conftest import BOOT_TIMEOUT, our_domains

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

CLOCK_TOLERANCE_S = 2.0


async def _guest_clock_error(m: QemuMachine) -> float:
    """0 when the guest's clock, read by a script, is within the tolerance of the host's while the
    script ran (bracketed: on a loaded host the answer takes seconds to come back); else how far off."""
    before = time.time()
    res = await m.run_script("date +%s", timeout=30)
    after = time.time()
    assert res.exit_code == 0, res.stderr
    guest = float(res.stdout.strip())
    return 0.0 if before - CLOCK_TOLERANCE_S <= guest <= after + CLOCK_TOLERANCE_S else guest - after


async def test_machines_from_one_warm_snapshot_are_fresh_and_separate(
        images_dir: Path, state_root: Path, runner_name: str) -> None:
    ensure_libvirtd()
    sd = state_root / f"warm-{secrets.token_hex(3)}"
    sd.mkdir(mode=0o755)
    p = QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI, warm_snapshots=True)
    made: list[QemuMachine] = []
    try:
        a = await p.create_machine(f"at_{secrets.token_hex(3)}", MachineSource(image="linux-tiny"),
                                   timeout=BOOT_TIMEOUT * 3)
        assert isinstance(a, QemuMachine)
        made.append(a)
        assert a.origin == MachineOrigin.LAZY
        snaps = list((sd / "warm" / "linux-tiny").iterdir())
        assert len(snaps) == 1 and (snaps[0] / "memory.img").is_file()
        created_at = json.loads((snaps[0] / "meta.json").read_text())["created_at"]
        await a.wait_ready(BOOT_TIMEOUT)
        # What an attempt does to its machine: a file on disk, one in memory (tmpfs), a wrong clock.
        res = await a.run_script("echo a > /root/a-was-here; echo a > /dev/shm/a-mem; date -s '2001-01-01 00:00'",
                                 timeout=30)
        assert res.exit_code == 0, res.stderr

        b = await p.create_machine(f"at_{secrets.token_hex(3)}", MachineSource(image="linux-tiny"),
                                   timeout=BOOT_TIMEOUT)
        assert isinstance(b, QemuMachine)
        made.append(b)
        assert b.origin == MachineOrigin.LAZY
        await b.wait_ready(BOOT_TIMEOUT)
        assert await _guest_clock_error(b) == 0.0
        res = await b.run_script("ls /root/a-was-here /dev/shm/a-mem 2>&1; echo b > /root/b-was-here; sync",
                                 timeout=30)
        assert "No such file" in res.stdout and res.stdout.count("No such file") == 2, res.stdout
        res = await a.run_script("cat /root/b-was-here 2>&1; cat /root/a-was-here", timeout=30)
        assert "No such file" in res.stdout and res.stdout.strip().endswith("a"), res.stdout
        assert a.overlay != b.overlay
    finally:
        for m in made:
            await m.destroy()
        await p.close()

    # A restarted provider uses the snapshot it kept: no new build, the same files. Without lazy
    # restore (the fallback), the same snapshot's memory image is read in full.
    p2 = QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI, warm_snapshots=True, lazy_restore=False)
    # The snapshot's own clock is behind by its age, so only once it is older than the tolerance
    # does the check below tell a clock set after restore from the saved one. (Not synchronisation:
    # time itself has to pass, and restores are fast enough to beat it.)
    await asyncio.sleep(max(0.0, created_at + 3 * CLOCK_TOLERANCE_S - time.time()))
    try:
        c = await p2.create_machine(f"at_{secrets.token_hex(3)}", MachineSource(image="linux-tiny"),
                                    timeout=BOOT_TIMEOUT)
        try:
            assert c.origin == MachineOrigin.RESTORED
            assert json.loads((snaps[0] / "meta.json").read_text())["created_at"] == created_at
            await c.wait_ready(BOOT_TIMEOUT)
            assert await _guest_clock_error(c) == 0.0
            res = await c.run_script("ls /root/a-was-here /root/b-was-here 2>&1", timeout=30)
            assert res.stdout.count("No such file") == 2, res.stdout
        finally:
            await c.destroy()
    finally:
        await p2.reap(set())
        await p2.close()
    assert our_domains() == []
    assert list((sd / "machines").iterdir()) == []


async def test_a_start_state_saved_from_a_lazy_machine_restores_without_the_snapshot(
        images_dir: Path, state_root: Path, runner_name: str) -> None:
    ensure_libvirtd()
    sd = state_root / f"warm-{secrets.token_hex(3)}"
    sd.mkdir(mode=0o755)
    p = QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI, warm_snapshots=True)
    try:
        a = await p.create_machine(f"at_{secrets.token_hex(3)}", MachineSource(image="linux-tiny"),
                                   timeout=BOOT_TIMEOUT * 3)
        assert isinstance(a, QemuMachine)
        try:
            assert a.origin == MachineOrigin.LAZY
            await a.wait_ready(BOOT_TIMEOUT)
            assert (await a.run_script("echo kept > /root/state-file; echo mem > /dev/shm/state-mem",
                                       timeout=30)).exit_code == 0
            await a.save("ss_fromlazy", 1, with_memory=True)
            # The machine carries on after its save (restored from the image it just wrote).
            assert (await a.run_script("cat /root/state-file", timeout=30)).stdout.strip() == "kept"
        finally:
            await a.destroy()
        # The version's memory image must not lean on the snapshot's RAM file: remove the snapshot.
        shutil.rmtree(sd / "warm")
        b = await p.create_machine(f"at_{secrets.token_hex(3)}",
                                   MachineSource(image="linux-tiny", start_state_id="ss_fromlazy", version=1),
                                   timeout=BOOT_TIMEOUT)
        try:
            assert b.origin == MachineOrigin.RESTORED
            await b.wait_ready(BOOT_TIMEOUT)
            res = await b.run_script("cat /root/state-file /dev/shm/state-mem", timeout=30)
            assert res.stdout.split() == ["kept", "mem"], res.stdout
        finally:
            await b.destroy()
    finally:
        await p.reap(set())
        await p.close()
    assert our_domains() == []
