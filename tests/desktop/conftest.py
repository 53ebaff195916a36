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
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from kit.libvirt import LIBVIRT_URI, REPO, ensure_libvirtd, leak_check, started
from kit.scratch import scratch_dir

from providers.base import MachineSource
from providers.qemu import QemuMachine, QemuProvider

# linux-desktop lives in its own images dir (scripts/desktop-image.sh says why), linux-tiny linked in.
IMAGES_DIR = Path(os.environ.get("GH_DESKTOP_IMAGES_DIR", "/var/tmp/gh-runner/desktop-images"))
IMAGE = "linux-desktop"
# A restore is seconds; a cold boot of the desktop to its session is minutes under TCG.
BOOT_TIMEOUT = float(os.environ.get("GH_TEST_DESKTOP_BOOT_TIMEOUT", "1800"))
BUILD_TIMEOUT = 3600
# A desktop test's first machine may wait for the image build and the warm snapshot (a boot to the
# painted session and a 2 GiB save): minutes under TCG, more on a loaded host. pytest-timeout's
# 600 s default cut the first test of each module there.
DESKTOP_TEST_TIMEOUT_S = BUILD_TIMEOUT + 2 * BOOT_TIMEOUT
RUNNER_NAME = f"desktest{secrets.token_hex(3)}"


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


_no_domains_left_behind = leak_check(f"gh-{RUNNER_NAME}-", "the desktop tests")


@pytest.fixture(scope="session")
def desktop_state() -> Iterator[Path]:
    with scratch_dir("gh-desktop-test-") as d:
        yield d


@pytest_asyncio.fixture(loop_scope="session", scope="session")
async def desktop_provider(desktop_images_dir: Path, desktop_state: Path) -> AsyncIterator[QemuProvider]:
    ensure_libvirtd()
    async with started(QemuProvider(desktop_images_dir, desktop_state, RUNNER_NAME, LIBVIRT_URI,
                                    warm_snapshots=True)) as p:
        yield p


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
