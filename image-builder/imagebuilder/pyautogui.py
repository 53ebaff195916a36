"""pyautogui in a desktop image's root, for agent kind `osworld` (docs/agents.md): the code OSWorld's agents
act with runs as `python3 -c` in the guest, as the signed-in user, on linux-desktop and osworld-desktop.

Debian 12 has no python3-pyautogui. The pins (assets/linux-desktop/pyautogui.txt) are downloaded with their
hashes required and built into wheels by the host's pip (pure Python; the build's own setuptools comes
from PyPI once); both are kept in the build cache, so a rebuild needs no network.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from . import proc
from .pipeline import log

PINS = Path(__file__).parent / "assets" / "linux-desktop" / "pyautogui.txt"
# Where they land in the root: the site dir of Debian's python3 for packages not from Debian.
SITE = "usr/local/lib/python3.11/dist-packages"
# What pyautogui drives X with, and what its screenshots (pyscreeze) are made with: from Debian.
DEBIAN_PACKAGES = ("python3-xlib", "python3-pil")


def install(root: Path, cache: Path) -> None:
    """The pins into the root's site dir, from the wheels in `cache` when they are there."""
    sources = cache / "pyautogui-src"
    wheels = cache / "pyautogui-wheels"
    sources.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    pins = ["--require-hashes", "--no-deps", "-r", str(PINS)]
    names = [line.split("==")[0] for line in PINS.read_text().splitlines() if line and not line.startswith("#")]
    into = [*pip, "install", "--no-index", "--find-links", str(wheels), "--no-deps", "--no-compile",
            "--target", str(root / SITE), *names]
    if wheels.is_dir() and proc.run(into, timeout=600, check=False).returncode == 0:
        shutil.rmtree(root / SITE / "bin", ignore_errors=True)
        return
    cached = proc.run([*pip, "download", "--no-index", "--find-links", str(sources), "-d", str(sources), *pins],
                      timeout=120, check=False)
    if cached.returncode != 0:
        log(f"downloading {PINS.name}'s pins into {sources}")
        proc.run([*pip, "download", "-d", str(sources), *pins], timeout=600)
    shutil.rmtree(wheels, ignore_errors=True)
    proc.run([*pip, "wheel", "--find-links", str(sources), "-w", str(wheels), *pins], timeout=600)
    proc.run(into, timeout=600)
    shutil.rmtree(root / SITE / "bin", ignore_errors=True)


# Run as the signed-in user in the build's proof: pyautogui drives the session's display, at the screen's size.
PROOF = 'python3 -c "import pyautogui, pytweening; w, h = pyautogui.size(); assert w * h > 0"'
