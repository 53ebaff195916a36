"""Fixtures for the provider tests: a provider on a private state dir, machines always destroyed.

State lives under /var/tmp (QEMU runs as libvirt-qemu and must traverse every parent), never in the
repo nor under pytest's 0700 tmp dirs. Each test module shares one booted machine where tests do
not conflict: the whole project's CI runs on 2 cores.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from providers.base import MachineSource
from providers.qemu import QemuMachine, QemuProvider

LIBVIRT_URI = os.environ.get("GH_TEST_LIBVIRT_URI", "qemu:///system")
BOOT_TIMEOUT = float(os.environ.get("GH_TEST_BOOT_TIMEOUT", "120"))


def ensure_libvirtd() -> None:
    if shutil.which("virsh") is None:
        pytest.skip("libvirt is not installed")
    ok = subprocess.run(["virsh", "-c", LIBVIRT_URI, "version"], capture_output=True, timeout=30).returncode == 0
    if not ok and LIBVIRT_URI == "qemu:///system":
        # The host's way: systemd's units where systemd is PID 1, `libvirtd -d` only where it is not.
        subprocess.run(["bash", str(REPO / "scripts" / "libvirt-up.sh")], capture_output=True, timeout=60, check=True)


@pytest.fixture(scope="session")
def state_root() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="gh-provider-test-", dir="/var/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


REPO = Path(__file__).resolve().parents[2]
RUNNER_NAME = f"provtest{secrets.token_hex(3)}"


def our_domains() -> list[str]:
    out = subprocess.run(["virsh", "-c", LIBVIRT_URI, "list", "--all", "--name"],
                         capture_output=True, text=True, timeout=30, check=False)
    return [n for n in out.stdout.split() if n.startswith(f"gh-{RUNNER_NAME}-")]


@pytest.fixture(scope="session", autouse=True)
def _no_domains_left_behind() -> Iterator[None]:
    """Overrides the suite-wide check for this folder: the same leak check, limited to the domains
    these tests make (runner name "provtest..."), so that running this folder while other engineers'
    tests run on the same host neither fails on, nor destroys, their machines."""
    yield
    if shutil.which("virsh") is None:
        return
    left = our_domains()
    for name in left:
        subprocess.run(["virsh", "-c", LIBVIRT_URI, "destroy", name], capture_output=True, timeout=30)
        subprocess.run(["virsh", "-c", LIBVIRT_URI, "undefine", name, "--nvram"], capture_output=True, timeout=30)
    if left:
        pytest.fail(f"the provider tests left libvirt domains behind: {left}")


@pytest.fixture(scope="session")
def runner_name() -> str:
    return RUNNER_NAME


def make_provider(images_dir: Path, state_root: Path, runner_name: str, sub: str) -> QemuProvider:
    sd = state_root / sub
    sd.mkdir(mode=0o755, exist_ok=True)
    return QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def provider(images_dir: Path, state_root: Path, runner_name: str) -> AsyncIterator[QemuProvider]:
    ensure_libvirtd()
    p = make_provider(images_dir, state_root, runner_name, secrets.token_hex(3))
    await p.start()
    try:
        yield p
    finally:
        await p.reap(set())  # anything a failed test left behind
        await p.close()


class Machines:
    """Creates machines and destroys every one of them at the end, whatever happened."""

    def __init__(self, provider: QemuProvider) -> None:
        self.provider = provider
        self.made: list[QemuMachine] = []

    async def create(self, source: MachineSource | None = None, *, machine_id: str | None = None,
                     ready: bool = True) -> QemuMachine:
        mid = machine_id or f"at_{secrets.token_hex(4)}"
        m = await self.provider.create_machine(mid, source or MachineSource(image="linux-tiny"), timeout=BOOT_TIMEOUT)
        assert isinstance(m, QemuMachine)
        self.made.append(m)
        if ready:
            await m.wait_ready(BOOT_TIMEOUT)
        return m

    async def destroy_all(self) -> None:
        for m in self.made:
            await m.destroy()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def shared_machine(provider: QemuProvider) -> AsyncIterator[QemuMachine]:
    ms = Machines(provider)
    try:
        yield await ms.create()
    finally:
        await ms.destroy_all()


@pytest_asyncio.fixture(loop_scope="module")
async def machines(provider: QemuProvider) -> AsyncIterator[Machines]:
    ms = Machines(provider)
    try:
        yield ms
    finally:
        await ms.destroy_all()
