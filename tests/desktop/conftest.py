"""Fixtures for the desktop tests: the real linux-desktop image (built here when missing, as CI
needs), one provider with warm snapshots for the whole session (a desktop snapshot is a boot to
the signed-in session plus a 2 GiB memory save: made once), and a shared machine per module.

The image build is instant when the image is current (`image-builder/build` checks its version);
when it is missing it takes 10-15 minutes on a 2-core host, which is why the fixture is
session-scoped and the build's own output is shown on failure.
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

REPO = Path(__file__).resolve().parents[2]
# linux-desktop lives in its own images dir (scripts/desktop-image.sh says why), linux-tiny linked in.
IMAGES_DIR = Path(os.environ.get("GH_DESKTOP_IMAGES_DIR", "/var/tmp/gh-runner/desktop-images"))
LIBVIRT_URI = os.environ.get("GH_TEST_LIBVIRT_URI", "qemu:///system")
IMAGE = "linux-desktop"
# A restore is seconds; a cold boot of the desktop to its session is minutes under TCG.
BOOT_TIMEOUT = float(os.environ.get("GH_TEST_DESKTOP_BOOT_TIMEOUT", "1800"))
BUILD_TIMEOUT = 3600
# A desktop test's first machine may wait for the image build and the warm snapshot (a boot to the
# painted session and a 2 GiB save): minutes under TCG, more on a loaded host. pytest-timeout's
# 600 s default cut the first test of each module there.
DESKTOP_TEST_TIMEOUT_S = BUILD_TIMEOUT + 2 * BOOT_TIMEOUT
RUNNER_NAME = f"desktest{secrets.token_hex(3)}"


def ensure_libvirtd() -> None:
    if shutil.which("virsh") is None:
        pytest.fail("libvirt is not installed (scripts/setup.sh installs it)")
    ok = subprocess.run(["virsh", "-c", LIBVIRT_URI, "version"], capture_output=True, timeout=30).returncode == 0
    if not ok and LIBVIRT_URI == "qemu:///system":
        subprocess.run(["bash", str(REPO / "scripts" / "libvirt-up.sh")], capture_output=True, timeout=60, check=True)


@pytest.fixture(scope="session")
def desktop_images_dir() -> Path:
    """The images dir with a current linux-desktop in it, built now if it is missing or stale."""
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "desktop-image.sh")],
        env={**os.environ, "GH_DESKTOP_IMAGES_DIR": str(IMAGES_DIR)},
        capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False)
    if proc.returncode != 0:
        pytest.fail(f"building {IMAGE} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return IMAGES_DIR


def our_domains() -> list[str]:
    out = subprocess.run(["virsh", "-c", LIBVIRT_URI, "list", "--all", "--name"],
                         capture_output=True, text=True, timeout=30, check=False)
    return [n for n in out.stdout.split() if n.startswith(f"gh-{RUNNER_NAME}-")]


@pytest.fixture(scope="session", autouse=True)
def _no_domains_left_behind() -> Iterator[None]:
    """The suite's leak check limited to these tests' own domains (runner name "desktest...")."""
    yield
    if shutil.which("virsh") is None:
        return
    left = our_domains()
    for name in left:
        subprocess.run(["virsh", "-c", LIBVIRT_URI, "destroy", name], capture_output=True, timeout=30)
    if left:
        pytest.fail(f"the desktop tests left libvirt domains behind: {left}")


@pytest.fixture(scope="session")
def desktop_state() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="gh-desktop-test-", dir="/var/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest_asyncio.fixture(loop_scope="session", scope="session")
async def desktop_provider(desktop_images_dir: Path, desktop_state: Path) -> AsyncIterator[QemuProvider]:
    ensure_libvirtd()
    p = QemuProvider(desktop_images_dir, desktop_state, RUNNER_NAME, LIBVIRT_URI, warm_snapshots=True)
    await p.start()
    try:
        yield p
    finally:
        await p.reap(set())
        await p.close()


async def new_desktop(provider: QemuProvider) -> QemuMachine:
    m = await provider.create_machine(f"at_{secrets.token_hex(4)}", MachineSource(image=IMAGE),
                                      timeout=BOOT_TIMEOUT)
    assert isinstance(m, QemuMachine)
    try:
        await m.wait_ready(BOOT_TIMEOUT)
    except BaseException:
        await m.destroy()
        raise
    return m


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def desktop(desktop_provider: QemuProvider) -> AsyncIterator[QemuMachine]:
    """One signed-in desktop shared by a module's tests (each leaves it as it found it)."""
    m = await new_desktop(desktop_provider)
    try:
        yield m
    finally:
        await m.destroy()
