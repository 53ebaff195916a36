"""libvirt for the tests that make real machines: the daemon up, our domains by name, a folder's leak check.

The whole suite's leak check (every new gh- domain, every new disk file) is in tests/conftest.py's session
hooks. A folder whose tests make machines adds `leak_check` for its own runner name: it removes what that
folder left and fails the session there, so that running one folder beside other people's tests on a
shared host neither fails on, nor destroys, their machines.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from providers.qemu import QemuProvider

LIBVIRT_URI = os.environ.get("GH_TEST_LIBVIRT_URI", "qemu:///system")
REPO = Path(__file__).resolve().parents[2]


def virsh(*args: str, check: bool = False, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["virsh", "-c", LIBVIRT_URI, *args], capture_output=True, text=True, timeout=timeout,
                          check=check)


def domains(prefix: str = "gh-", *, check: bool = False) -> list[str]:
    """The libvirt domains, running or defined, whose names start with `prefix` (ours are gh-<runner>-...).
    None where virsh is not installed. `check`: a failing virsh raises instead of reading as none."""
    if shutil.which("virsh") is None:
        return []
    return [n for n in virsh("list", "--all", "--name", check=check).stdout.split() if n.startswith(prefix)]


def remove_domains(names: list[str]) -> None:
    """Destroy and undefine each (a transient domain is gone at destroy; its undefine fails, unseen)."""
    for name in names:
        virsh("destroy", name)
        virsh("undefine", name, "--nvram")


def ensure_libvirtd() -> None:
    """libvirtd answering at LIBVIRT_URI, started the host's way (scripts/libvirt-up.sh: systemd's units
    where systemd is PID 1, `libvirtd -d` only where it is not) when the system one is down."""
    if shutil.which("virsh") is None:
        pytest.fail("libvirt is not installed (scripts/setup.sh installs it)")
    if virsh("version").returncode != 0 and LIBVIRT_URI == "qemu:///system":
        subprocess.run(["bash", str(REPO / "scripts" / "libvirt-up.sh")], capture_output=True, timeout=60, check=True)


@asynccontextmanager
async def started(provider: QemuProvider) -> AsyncIterator[QemuProvider]:
    """The provider started; when the block ends, whatever a failed test left reaped and the provider closed."""
    await provider.start()
    try:
        yield provider
    finally:
        await provider.reap(set())
        await provider.close()


def leak_check(prefix: str, tests: str) -> Any:
    """A session-wide autouse fixture for a conftest.py: after the session, the domains named `prefix...`
    are removed and, if there were any, the session fails naming them ("`tests` left ... behind").

        _no_domains_left_behind = leak_check(f"gh-{RUNNER_NAME}-", "the provider tests")
    """

    @pytest.fixture(scope="session", autouse=True)
    def _no_domains_left_behind() -> Iterator[None]:
        yield
        left = domains(prefix)
        remove_domains(left)
        if left:
            pytest.fail(f"{tests} left libvirt domains behind: {left}")

    return _no_domains_left_behind
