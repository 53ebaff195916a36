"""Fixtures for the image tests: a scratch directory QEMU (and libvirt-qemu) can reach."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory under /var/tmp (mode 0755, traversable by uid 64055), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="gh-imgtest-", dir="/var/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
