"""A full host disk under a real machine: said as that, and nothing of ours left on it.

A real linux-tiny machine whose state dir (and so its overlay) is on a small tmpfs, mounted before QEMU
starts (QEMU runs in libvirt's mount namespace: a tmpfs mounted later, on a host without systemd's shared
propagation, is not the directory QEMU sees). The tmpfs is filled to the last MiB and
the guest writes to its disk. QEMU pauses a guest whose disk write hits ENOSPC; the guest agent call then
fails with libvirt's "domain is not running". The error must say what happened: the host disk is full.
"""

from __future__ import annotations

import contextlib
import io
import secrets
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kit.libvirt import LIBVIRT_URI, ensure_libvirtd
from PIL import Image

from providers.base import MachineSource
from providers.errors import ProviderError
from providers.qemu import QemuMachine, QemuProvider
from providers.qemu.screen import SCREENDUMP_DIR

from .conftest import BOOT_TIMEOUT

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def small_fs(state_root: Path) -> Iterator[Path]:
    mnt = state_root / f"tiny-{secrets.token_hex(3)}"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200m,mode=0755", "tmpfs", str(mnt)], check=True, timeout=30)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True, timeout=30)


def fill(path: Path) -> None:
    """Write zeros until the filesystem is full (ENOSPC ends it)."""
    with contextlib.suppress(OSError), path.open("wb", buffering=0) as f:
        while True:
            f.write(b"\0" * (1 << 16))


@contextlib.asynccontextmanager
async def ready_machine(images_dir: Path, small_fs: Path, runner_name: str) -> AsyncIterator[QemuMachine]:
    """A ready linux-tiny machine whose state dir is on `small_fs`; afterwards the filler is removed and
    nothing of the machine is left."""
    ensure_libvirtd()
    p = QemuProvider(images_dir, small_fs / "state", runner_name, LIBVIRT_URI)
    await p.start()
    m: QemuMachine | None = None
    try:
        made = await p.create_machine(f"at_{secrets.token_hex(4)}", MachineSource(image="linux-tiny"),
                                      timeout=BOOT_TIMEOUT)
        assert isinstance(made, QemuMachine)
        m = made
        await m.wait_ready(BOOT_TIMEOUT)
        yield m
    finally:
        (small_fs / "filler").unlink(missing_ok=True)
        if m is not None:
            await m.destroy()
        await p.reap(keep=set())
        await p.close()


async def test_a_guest_paused_on_a_full_host_disk_is_reported_as_that(
        images_dir: Path, small_fs: Path, runner_name: str) -> None:
    async with ready_machine(images_dir, small_fs, runner_name) as m:
        fill(small_fs / "filler")
        with pytest.raises(ProviderError) as caught:
            await m.run_script("dd if=/dev/zero of=/root/big bs=1M count=150 conv=fsync; sync; echo wrote",
                               timeout=120)
        assert "the host disk is full" in str(caught.value), caught.value


async def test_a_machine_that_cannot_be_made_on_a_full_disk_leaves_no_files(
        images_dir: Path, small_fs: Path, runner_name: str) -> None:
    # Seen in bench/faults.py's disk_full row: the hot pool's refill met the full disk at the
    # machine's first file (owner.json, written before the clean-up on error was armed), and its
    # directory stayed after the runner stopped.
    ensure_libvirtd()
    state = small_fs / "state"
    p = QemuProvider(images_dir, state, runner_name, LIBVIRT_URI)
    await p.start()
    try:
        fill(small_fs / "filler")
        with pytest.raises((ProviderError, OSError)):
            await p.create_machine(f"at_{secrets.token_hex(4)}", MachineSource(image="linux-tiny"),
                                   timeout=BOOT_TIMEOUT)
        left = sorted(str(f.relative_to(state)) for f in (state / "machines").rglob("*"))
        assert left == [], f"a machine that was never made left files: {left}"
    finally:
        (small_fs / "filler").unlink(missing_ok=True)
        await p.reap(keep=set())
        await p.close()


async def test_a_full_host_disk_takes_the_screen_through_libvirt_and_leaves_no_partial_dump(
        images_dir: Path, small_fs: Path, runner_name: str) -> None:
    # QEMU's PPM dump goes to the machine's directory: on a full disk QEMU's write fails part-way.
    async with ready_machine(images_dir, small_fs, runner_name) as m:
        with Image.open(io.BytesIO(await m.screenshot())) as first:  # QEMU's dump, with room for it
            size = first.size
        assert m._ppm_dumps
        fill(small_fs / "filler")
        with Image.open(io.BytesIO(await m.screenshot())) as im:
            im.load()  # whole: libvirt's screenshot, not a truncated dump
            assert im.size == size
        assert not m._ppm_dumps  # libvirt's path from now on, not a failed dump on every look
        assert list((m.dir / SCREENDUMP_DIR).iterdir()) == []  # QEMU's partial dump was removed
