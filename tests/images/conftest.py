"""Fixtures for the image tests: a scratch directory QEMU (and libvirt-qemu) can reach."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.scratch import scratch_dir


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory under /var/tmp (mode 0755, traversable by uid 64055), removed afterwards."""
    with scratch_dir("gh-imgtest-") as d:
        yield d
