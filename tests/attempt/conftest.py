"""Fixtures of the attempt tests: the provider double and a recording link (see fakes.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from .fakes import FakeLink, FakeProvider, guest_scripts

LIBVIRT_URI = os.environ.get("GH_TEST_LIBVIRT_URI", "qemu:///system")
OUR_DOMAINS = "gh-attempttest"  # the runner name the integration tests give their provider


def our_domains() -> list[str]:
    if shutil.which("virsh") is None:
        return []
    out = subprocess.run(["virsh", "-c", LIBVIRT_URI, "list", "--all", "--name"],
                         capture_output=True, text=True, timeout=30, check=False)
    return [n for n in out.stdout.split() if n.startswith(OUR_DOMAINS)]


@pytest.fixture
def provider() -> FakeProvider:
    p = FakeProvider()
    guest_scripts(p)
    return p


@pytest.fixture
def link() -> FakeLink:
    return FakeLink()


@pytest.fixture(scope="session", autouse=True)
def _no_domains_left_behind() -> Iterator[None]:
    """Overrides the suite-wide check for this folder: the same leak check, limited to the domains
    these tests make (runner name "attempttest..."), so that running this folder while other
    engineers' tests run on the same host neither fails on, nor destroys, their machines."""
    yield
    left = our_domains()
    if left:
        for name in left:
            subprocess.run(["virsh", "-c", LIBVIRT_URI, "destroy", name], capture_output=True, timeout=30)
            subprocess.run(["virsh", "-c", LIBVIRT_URI, "undefine", name, "--nvram"], capture_output=True, timeout=30)
        pytest.fail(f"the attempt tests left libvirt domains behind: {left}")
