"""The clock of a restored guest is the host's for the FIRST script that reads it (providers/qemu/README.md): after
a pooled lease (paused since it was filled, so it lags by that wait too), after a lazy restore, by
either way of setting it (in the first exec, or qemu-ga's guest-set-time), and when the guest
refuses the exec's way (then guest-set-time sets it, and the script still runs once)."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from pathlib import Path

import pytest
from kit.libvirt import LIBVIRT_URI, ensure_libvirtd
from kit.poll import until

from providers.base import MachineOrigin, MachineSource
from providers.qemu import QemuMachine, QemuProvider
from providers.qemu import guest_agent as ga
from providers.qemu import machine as machine_module
from providers.qemu.guest_agent import ClockMode
from providers.qemu.pool import PoolConfig

from .conftest import BOOT_TIMEOUT, our_domains

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

TINY = MachineSource(image="linux-tiny")
# `date -s` takes whole seconds (rounded), `date +%s` prints them (truncated), a TCG guest is slow.
TOLERANCE_S = 2.0
STALE_S = 4 * TOLERANCE_S  # how old the snapshot must be for a stale clock to show


async def first_script_clock_error(m: QemuMachine) -> float:
    """Seconds between the guest's clock and the host's, read by the machine's first script."""
    await m.wait_ready(BOOT_TIMEOUT)
    before = time.time()
    res = await m.run_script("date +%s; echo x >> /root/ran", timeout=60)
    after = time.time()
    assert res.exit_code == 0, res.stderr
    guest = float(res.stdout.split()[0])
    return 0.0 if before - TOLERANCE_S <= guest <= after + TOLERANCE_S else guest - after


async def test_the_first_script_after_a_pooled_lease_or_a_lazy_restore_reads_the_hosts_clock(
        images_dir: Path, state_root: Path, runner_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ensure_libvirtd()
    sd = state_root / f"clock-{secrets.token_hex(3)}"
    sd.mkdir(mode=0o755)
    pooled = QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI, warm_snapshots=True,
                          pool=PoolConfig(per_source=1, total_mib=512, keep=frozenset({TINY})))
    lazy = QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI, warm_snapshots=True)
    lazy_qga = QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI, warm_snapshots=True)
    old_way = QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI, warm_snapshots=True,
                           clock_mode=ClockMode.SET_TIME)
    try:
        await pooled.start()  # builds the warm snapshot, then restores, primes and pauses one machine
        assert pooled.pool is not None
        pool = pooled.pool
        await until(lambda: pool.counts().get(TINY, 0) == 1, BOOT_TIMEOUT * 3, "the pool to fill")
        snap = next((sd / "warm" / "linux-tiny").iterdir())
        created_at = json.loads((snap / "meta.json").read_text())["created_at"]
        # A restored guest's clock stands where the snapshot was saved: only once the snapshot is
        # older than the tolerance does a clock left stale show. (Not synchronisation: time itself
        # has to pass, and a pool on an idle host fills fast enough to beat it.)
        await asyncio.sleep(max(0.0, created_at + STALE_S - time.time()))

        a = await pooled.create_machine("at_clock_pool", TINY, timeout=BOOT_TIMEOUT)
        assert isinstance(a, QemuMachine)
        try:
            assert a.origin == MachineOrigin.POOLED
            assert await first_script_clock_error(a) == 0.0
        finally:
            await a.destroy()

        for p in (lazy, old_way):
            m = await p.create_machine(f"at_clock_{p.clock_mode}", TINY, timeout=BOOT_TIMEOUT)
            assert isinstance(m, QemuMachine)
            try:
                assert m.origin == MachineOrigin.LAZY
                assert await first_script_clock_error(m) == 0.0, p.clock_mode
            finally:
                await m.destroy()

        # A guest that refuses the value (gh-execd's clock_settime, or the qemu-ga wrapper's
        # `date -s`): the clock is set by guest-set-time instead, and the script runs once (it
        # was stopped before the script).
        lazy_qga.resident_exec = False
        monkeypatch.setattr(machine_module, "clock_ms", lambda: 2**64 - 1)  # past what the kernel takes
        monkeypatch.setattr(ga, "clock_arg", lambda: "not-a-time")
        for p in (lazy, lazy_qga):
            m = await p.create_machine(f"at_clock_refused_{p.resident_exec}", TINY, timeout=BOOT_TIMEOUT)
            assert isinstance(m, QemuMachine)
            try:
                assert await first_script_clock_error(m) == 0.0, p.resident_exec
                assert (await m.run_script("cat /root/ran", timeout=30)).stdout == "x\n"
            finally:
                await m.destroy()
    finally:
        for p in (old_way, lazy, lazy_qga, pooled):
            await p.reap(set())
            await p.close()
    assert our_domains() == []
