"""A destroy that fails (libvirtd restarting) leaks nothing and unlinks nothing
under a live QEMU.

A real linux-tiny machine; the host's real libvirtd is stopped for a few seconds (and started again
the way scripts/libvirt-up.sh starts it, always). `QemuMachine.destroy` once removed the
machine's directory in a `finally`, under the QEMU process that libvirtd's absence leaves running,
and nothing retried the destroy until the next reap (5 minutes later). Now the files stay while the
domain lives, the provider retries the destroy in the background, counts it as a leftover, and
removes the files once the domain is gone. The reaper leaves such a machine alone.

Stops libvirtd once: it disturbs every VM on the host for a few seconds.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest
from kit.libvirt import REPO, ensure_libvirtd

from gh_common.timeouts import within
from providers.base import MachineSource
from providers.errors import ProviderError
from providers.qemu import QemuMachine

from .conftest import BOOT_TIMEOUT, make_provider, our_domains

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(600)]


def qemu_alive(domain: str) -> bool:
    return subprocess.run(["pgrep", "-f", f"guest={domain},"], capture_output=True, timeout=10).returncode == 0


def stop_libvirtd() -> None:
    out = subprocess.run(["pgrep", "-x", "libvirtd"], capture_output=True, text=True, timeout=10)
    for pid in out.stdout.split():
        os.kill(int(pid), signal.SIGTERM)
    deadline = time.monotonic() + 30
    while subprocess.run(["pgrep", "-x", "libvirtd"], capture_output=True, timeout=10).returncode == 0:
        if time.monotonic() > deadline:
            raise AssertionError("libvirtd did not stop within 30 s")
        time.sleep(0.1)


def libvirt_up() -> None:
    subprocess.run(["bash", str(REPO / "scripts" / "libvirt-up.sh")], check=True, capture_output=True, timeout=120)


async def test_a_failed_destroy_keeps_the_files_and_is_retried_until_the_domain_is_gone(
        images_dir: Path, state_root: Path, runner_name: str) -> None:
    ensure_libvirtd()
    p = make_provider(images_dir, state_root, runner_name, f"outage-{secrets.token_hex(3)}")
    await p.start()
    m = await p.create_machine(f"at_{secrets.token_hex(4)}", MachineSource(image="linux-tiny"), timeout=BOOT_TIMEOUT)
    assert isinstance(m, QemuMachine)
    overlay_files = [f for f in m.dir.rglob("*") if f.is_file()]
    assert overlay_files and qemu_alive(m.domain.name)
    try:
        stop_libvirtd()
        try:
            with pytest.raises(ProviderError):
                await m.destroy()
            # QEMU runs on without libvirtd: its overlay must still be there, and the destroy pending.
            assert qemu_alive(m.domain.name)
            assert m.dir.is_dir() and all(f.exists() for f in overlay_files), "files removed under a live QEMU"
            assert p.destroy_leftovers() == 1
            with pytest.raises(ProviderError):  # the reaper cannot list either: it removes nothing
                await p.reap(keep=set())
            assert all(f.exists() for f in overlay_files)
        finally:
            libvirt_up()
        retry = p.reaper.pending_destroy(m.machine_id)
        assert retry is not None
        await within(120, asyncio.shield(retry))  # the background destroy ends once libvirtd answers
        assert p.destroy_leftovers() == 0, "the destroy was not retried to its end"
        assert not m.dir.exists() and not qemu_alive(m.domain.name)
        assert m.domain.name not in our_domains()
    finally:
        libvirt_up()
        await p.reap(keep=set())
        await p.close()
