"""Headless Chromium for the replay page tests: load a URL, keep its DOM and a screenshot."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

OUTPUT_DIR = Path(os.environ.get("GH_TEST_OUTPUT_DIR", "/var/tmp/gh-runner-test-output"))
_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
          "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
          "--disable-dev-shm-usage", "--virtual-time-budget=5000"]


@dataclass(frozen=True)
class Loaded:
    dom: str
    screenshot: Path


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def load(url: str, screenshot: Path, *, timeout: float = 120.0) -> Loaded:
    """The page's DOM after its scripts ran, and a PNG screenshot at `screenshot`."""
    exe = chromium()
    if exe is None:
        raise RuntimeError("chromium is not installed (apt-get install chromium)")
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    profile = tempfile.mkdtemp(prefix="gh-chromium-")
    try:
        dom = subprocess.run([exe, *_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
                             capture_output=True, text=True, timeout=timeout, check=True).stdout
        subprocess.run([exe, *_FLAGS, f"--user-data-dir={profile}", f"--screenshot={screenshot}",
                        "--window-size=1280,900", url],
                       capture_output=True, text=True, timeout=timeout, check=True)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    if not screenshot.is_file() or screenshot.stat().st_size == 0:
        raise RuntimeError(f"chromium wrote no screenshot for {url}")
    return Loaded(dom, screenshot)
