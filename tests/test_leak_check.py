"""The suite's leak check (tests/conftest.py) against what scripts/test.sh does beside it."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

import pytest


def test_a_desktop_image_built_beside_the_suite_is_no_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    """scripts/test.sh builds linux-desktop into GH_DESKTOP_IMAGES_DIR while the suite runs: on a host without it
    the new disk was reported as a leak and, under CI, deleted (CI failed on a fresh host with every test passed)."""
    scratch = Path(tempfile.mkdtemp(prefix="gh-leak-check-", dir="/var/tmp"))  # the check looks under /var/tmp
    try:
        desktop_images = scratch / "desktop-images"
        (desktop_images / "linux-desktop").mkdir(parents=True)
        built = desktop_images / "linux-desktop" / "disk.qcow2"
        built.write_bytes(b"")
        left = scratch / "overlay.qcow2"  # what a test would leave: still reported
        left.write_bytes(b"")
        monkeypatch.setenv("GH_DESKTOP_IMAGES_DIR", str(desktop_images))
        spec = importlib.util.spec_from_file_location("gh_leak_check", Path(__file__).parent / "conftest.py")
        assert spec is not None and spec.loader is not None
        check = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(check)  # as the suite's session reads it, with scripts/test.sh's environment
        found = check._new_disks(0.0)
        assert left in found
        assert built not in found
    finally:
        shutil.rmtree(scratch)
