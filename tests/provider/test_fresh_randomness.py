"""Machines restored from one memory image do not share their randomness: restored in full, lazily
or handed out by the hot pool, each reads its own bytes from /dev/urandom and its own $RANDOM in its
first script, as two cold boots would. (A case whose setup rolled a die rolled the same number on
12 of 12 machines: the guest kernel's RNG state is in the memory image, and the kernel reseeds it
only when its seed is old by its own clock, which a restore replays.) And each restored machine
shows its guest a VM generation ID of its own, the signal on which a kernel with the vmgenid driver
reseeds by itself (linux-tiny's has none; the desktop's Debian kernel does)."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
import uuid
from pathlib import Path

import libvirt
import libvirt_qemu
import pytest
from kit.libvirt import LIBVIRT_URI, ensure_libvirtd

from providers.base import MachineOrigin, MachineSource
from providers.qemu import QemuMachine, QemuProvider
from providers.qemu.pool import PoolConfig
from providers.qemu.saveimage import read_save_image

from .conftest import BOOT_TIMEOUT, our_domains

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
    p = QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI,
                     pool=PoolConfig(per_source=2, total_mib=512, keep=frozenset({state})))
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


# QEMU's vmgenid device: ACPI names the guest address of its buffer VGIA (a DWordConst in an SSDT,
# patched in by the firmware), and the 16-byte GUID sits 40 bytes into that buffer, little-endian
# by field (hw/acpi/vmgenid.c). The guest's driver reads it there when ACPI notifies it.
SSDT_HEX = "for t in /sys/firmware/acpi/tables/SSDT*; do od -An -tx1 -v $t | tr -d ' \\n'; echo; done"
VGIA_DWORD = (b"VGIA" + b"\x0c").hex()
GUID_OFFSET = 40


async def _genids(p: QemuProvider, m: QemuMachine) -> tuple[str, str, str]:
    """The machine's generation ID as libvirt, QEMU and the guest's memory have it."""
    res = await m.run_script(SSDT_HEX, timeout=30)
    assert res.exit_code == 0, res.stderr
    found = [line for line in res.stdout.split() if VGIA_DWORD in line]
    assert len(found) == 1, "the guest's ACPI tables have no vmgenid device"
    at = found[0].index(VGIA_DWORD) + len(VGIA_DWORD)
    addr = int.from_bytes(bytes.fromhex(found[0][at:at + 8]), "little") + GUID_OFFSET

    def read(c: libvirt.virConnect) -> tuple[str, str, str]:
        dom = c.lookupByName(m.domain_name)
        xml = re.search(r"<genid>([^<]+)</genid>", dom.XMLDesc(0))
        qmp = json.loads(libvirt_qemu.qemuMonitorCommand(dom, '{"execute": "query-vm-generation-id"}', 0))
        hmp = libvirt_qemu.qemuMonitorCommand(dom, f"xp /16xb {addr:#x}",
                                              libvirt_qemu.VIR_DOMAIN_QEMU_MONITOR_COMMAND_HMP)
        guest = bytes(int(b, 16) for b in re.findall(r"\b0x([0-9a-f]{2})\b", hmp))
        return (xml.group(1) if xml else "", qmp["return"]["guid"], str(uuid.UUID(bytes_le=guest)))

    return await asyncio.to_thread(p.conn.call, read)


async def test_each_restored_machine_shows_its_guest_a_generation_id_of_its_own(
        images_dir: Path, state_root: Path, runner_name: str) -> None:
    ensure_libvirtd()
    sd = state_root / f"genid-{secrets.token_hex(3)}"
    sd.mkdir(mode=0o755)
    seen: list[str] = []
    for origin, lazy in ((MachineOrigin.LAZY, True), (MachineOrigin.LAZY, True), (MachineOrigin.RESTORED, False)):
        p = QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI, warm_snapshots=True, lazy_restore=lazy)
        try:
            m = await p.create_machine(f"at_{secrets.token_hex(3)}", TINY, timeout=BOOT_TIMEOUT * 3)
            assert isinstance(m, QemuMachine)
            try:
                assert m.origin == origin
                await m.wait_ready(BOOT_TIMEOUT)
                xml, qemu, guest = await _genids(p, m)
                assert xml == qemu == guest, (origin, xml, qemu, guest)
                seen.append(guest)
            finally:
                await m.destroy()
        finally:
            await p.close()
    (snap,) = (sd / "warm" / "linux-tiny").iterdir()
    saved = re.search(r"<genid>([^<]+)</genid>", read_save_image(snap / "memory.img").xml)
    assert saved is not None  # the snapshot machine had one too: a guest's driver sees it change
    assert len({*seen, saved.group(1)}) == 4, (seen, saved.group(1))
    assert our_domains() == []
