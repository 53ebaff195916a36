"""`gh-runner selftest --image linux-desktop` passes with its GUI-level steps (gh_runner/selftest.py): a
per-user xfconf setting as the signed-in user, elevated; a screenshot of a desktop (not a console);
text typed into a GUI field and read back; a click where aimed; a key chord; memory save and warm
start; nothing left behind. Run through the real command, as an operator would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from kit.libvirt import LIBVIRT_URI, REPO, ensure_libvirtd

from .conftest import DESKTOP_TEST_TIMEOUT_S

pytestmark = [pytest.mark.desktop, pytest.mark.desktop_smoke, pytest.mark.libvirt, pytest.mark.slow,
              pytest.mark.timeout(DESKTOP_TEST_TIMEOUT_S)]

STEPS = ["machine", "user_setting", "verdict", "env", "screenshot", "typing", "click", "key_chord", "warm_start",
         "cleanup"]


def test_selftest_passes_on_linux_desktop_with_gui_steps(desktop_images_dir: Path) -> None:
    ensure_libvirtd()
    with tempfile.TemporaryDirectory(prefix="gh-desktop-selftest-", dir="/var/tmp") as d:
        os.chmod(d, 0o755)
        report = Path(d) / "report.json"
        p = subprocess.run(
            [str(Path(sys.executable).with_name("gh-runner")), "selftest", "--image", "linux-desktop",
             "--images-dir", str(desktop_images_dir), "--state-dir", str(Path(d) / "state"),
             "--libvirt-uri", LIBVIRT_URI, "--name", "desktest-st", "--json", str(report)],
            capture_output=True, text=True, timeout=3000, cwd=REPO, check=False)
        assert p.returncode == 0, p.stdout + p.stderr
        results = json.loads(report.read_text())
        assert [r["step"] for r in results] == STEPS
        by_step = {r["step"]: r["detail"] for r in results}
        assert "of a desktop" in by_step["screenshot"]
        assert "xfconf" in by_step["user_setting"] and "elevated" in by_step["user_setting"]
        assert "ctrl+alt+t" in by_step["key_chord"]
