"""Machines restored from one memory image do not share their randomness: restored in full, lazily
or handed out by the hot pool, each reads its own bytes from /dev/urandom and its own $RANDOM in its
first script, as two cold boots would. (A case whose setup rolled a die rolled the same number on
12 of 12 machines: the guest kernel's RNG state is in the memory image, and the kernel reseeds it
only when its seed is old by its own clock, which a restore replays.)"""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path

import pytest

from providers.base import MachineOrigin, MachineSource
from providers.qemu import QemuMachine, QemuProvider
from providers.qemu.pool import PoolConfig

from .conftest import BOOT_TIMEOUT, LIBVIRT_URI, ensure_libvirtd, our_domains

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

TINY = MachineSource(image="linux-tiny")
# What a case's setup rolls with: the kernel's RNG, and the shell's own generator (busybox ash seeds
# $RANDOM from its pid, the same on every machine restored from one image, and the wall clock's
# seconds + microseconds, which the first script sets: two machines collide only if those sums do).
ROLL = "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; echo $RANDOM"
# Before the save: a read once the kernel's seed is old (Linux 6.1 reseeds at a read when the seed
# is older than half the uptime, or 60 s), so the image holds a seed the kernel will not renew for
# seconds of guest time after a restore: the deterministic form of what a save at any moment risks.
RESEED_THEN_SAVE = "u=$(cut -d. -f1 /proc/uptime); sleep $((u + 2)); head -c 16 /dev/urandom >/dev/null"


async def _first_roll(p: QemuProvider, source: MachineSource, origin: MachineOrigin,
                      made: list[QemuMachine]) -> tuple[str, str]:
    m = await p.create_machine(f"at_{secrets.token_hex(3)}", source, timeout=BOOT_TIMEOUT * 3)
    assert isinstance(m, QemuMachine)
    made.append(m)
    assert m.origin == origin
    await m.wait_ready(BOOT_TIMEOUT)
    res = await m.run_script(ROLL, timeout=30)
    assert res.exit_code == 0, res.stderr
    urandom, shell = res.stdout.split()
    assert len(urandom) == 32, res.stdout
    return urandom, shell


async def _two_differ(p: QemuProvider, source: MachineSource, origin: MachineOrigin) -> None:
    made: list[QemuMachine] = []
    try:
        a = await _first_roll(p, source, origin, made)
        b = await _first_roll(p, source, origin, made)
    finally:
        for m in made:
            await m.destroy()
    assert a[0] != b[0], f"two {origin} machines read the same /dev/urandom bytes first: {a[0]}"
    assert a[1] != b[1], f"two {origin} machines rolled the same $RANDOM first: {a[1]}"


async def test_machines_from_one_memory_image_read_different_random_numbers(
        images_dir: Path, state_root: Path, runner_name: str) -> None:
    ensure_libvirtd()
    sd = state_root / f"rng-{secrets.token_hex(3)}"
    sd.mkdir(mode=0o755)
    p = QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI)
    try:
        m = await p.create_machine(f"at_{secrets.token_hex(3)}", TINY, timeout=BOOT_TIMEOUT)
        try:
            await m.wait_ready(BOOT_TIMEOUT)
            res = await m.run_script(RESEED_THEN_SAVE, timeout=BOOT_TIMEOUT)
            assert res.exit_code == 0, res.stderr
            await m.save("rng", 1)
        finally:
            await m.destroy()
        await _two_differ(p, MachineSource(image="linux-tiny", start_state_id="rng", version=1),
                          MachineOrigin.RESTORED)
    finally:
        await p.close()

    # The same start state from the hot pool: each machine primed once, paused, then leased.
    state = MachineSource(image="linux-tiny", start_state_id="rng", version=1)
    p = QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI, pool=PoolConfig(per_source=2, total_mib=512))
    try:
        await p.start()
        deadline = time.monotonic() + BOOT_TIMEOUT * 3
        while p.pool is None or p.pool.counts().get(state, 0) < 2:  # both primed and paused
            assert time.monotonic() < deadline, "the pool did not fill"
            await asyncio.sleep(0.1)
        await _two_differ(p, state, MachineOrigin.POOLED)
    finally:
        await p.close()

    # An image's warm snapshot, its RAM mapped private (lazy).
    p = QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI, warm_snapshots=True)
    try:
        await _two_differ(p, TINY, MachineOrigin.LAZY)
    finally:
        await p.close()
    assert our_domains() == []
    assert list((sd / "machines").iterdir()) == []
