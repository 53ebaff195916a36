"""Fixtures shared by the whole suite.

Area fixtures live in each folder's own conftest.py (tests/provider, tests/runner, tests/server,
tests/e2e, ...). This file holds only what every area needs: where the images are, and the check
that nothing is left behind in libvirt after the session.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

IMAGES_DIR = Path(os.environ.get("GH_IMAGES_DIR", "/var/tmp/gh-runner/images"))
LIBVIRT_URI = os.environ.get("GH_TEST_LIBVIRT_URI", "qemu:///system")


def gh_domains() -> list[str]:
    """Every libvirt domain whose name starts with gh- (ours), running or defined."""
    if shutil.which("virsh") is None:
        return []
    out = subprocess.run(
        ["virsh", "-c", LIBVIRT_URI, "list", "--all", "--name"],
        capture_output=True, text=True, timeout=30, check=False,
    )
    return [n for n in out.stdout.split() if n.startswith("gh-")]


@pytest.fixture(scope="session")
def images_dir() -> Path:
    """The directory holding the built linux-tiny image (scripts/setup.sh builds it)."""
    if not (IMAGES_DIR / "linux-tiny" / "image.yaml").is_file():
        pytest.fail(f"no linux-tiny image in {IMAGES_DIR}: run scripts/setup.sh (or image-builder/build)")
    return IMAGES_DIR


@pytest.fixture(scope="session", autouse=True)
def _no_domains_left_behind() -> Iterator[None]:
    before = set(gh_domains())
    yield
    left = sorted(set(gh_domains()) - before)
    if left:
        for name in left:  # clean up so the next run starts clean, then fail loudly
            subprocess.run(["virsh", "-c", LIBVIRT_URI, "destroy", name], capture_output=True, timeout=30)
            subprocess.run(["virsh", "-c", LIBVIRT_URI, "undefine", name, "--nvram"],
                           capture_output=True, timeout=30)
        pytest.fail(f"the suite left libvirt domains behind: {left}")
