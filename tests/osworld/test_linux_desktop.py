"""Imported OSWorld-format desktop tasks validated on the real linux-desktop guest: the setup drives the
GUI through the pyautogui shim (xdotool) into a launched, activated Mousepad, and says `python` and
`echo password | sudo -S`. linux-desktop carries no gh_osworld, and every metric has one implementation,
gh_osworld's: the tasks are infeasible ones (checked on the agent's answer), and each setup proves its own
work with a last `execute` with `until` that fails the setup (an error, never valid) unless the steps
before did theirs. `gh-runner validate`: the check before prints False, noop fails, the reference agent
passes.

Runs only with GH_TEST_DESKTOP=1 and a built linux-desktop image (tests/desktop gates the same
way): a desktop machine under TCG takes minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.scratch import scratch_dir

from .conftest import task, write_task

GH_RUNNER = str(Path(sys.executable).parent / "gh-runner")
REPO = Path(__file__).resolve().parents[2]
# linux-desktop's own images dir (scripts/desktop-image.sh), as tests/desktop uses.
IMAGES_DIR = Path(os.environ.get("GH_DESKTOP_IMAGES_DIR", "/var/tmp/gh-runner/desktop-images"))

pytestmark = [pytest.mark.desktop, pytest.mark.libvirt, pytest.mark.slow, pytest.mark.skipif(
    os.environ.get("GH_TEST_DESKTOP") != "1" or not (IMAGES_DIR / "linux-desktop" / "image.yaml").is_file(),
    reason="needs GH_TEST_DESKTOP=1 and a built linux-desktop image")]


def tasks(root: Path) -> None:
    d = root / "os"
    # The author waits for the save to reach the file (a poll with a deadline): Mousepad under TCG on a
    # loaded host may save late. The last step fails the setup unless the typing reached the file.
    typing = ("import pathlib, pyautogui, time\n"
              "pyautogui.typewrite('draft'); time.sleep(0.5); pyautogui.hotkey('ctrl', 's')\n"
              "note, end = pathlib.Path.home() / 'Documents' / 'note.txt', time.monotonic() + 60\n"
              "while 'draft' not in note.read_text() and time.monotonic() < end:\n"
              "    time.sleep(0.2)\n")
    write_task(d, task(id="osw-note", instruction="Fax my draft note to the office.",
                       config=[{"type": "execute", "parameters": {
                                   "command": "mkdir -p ~/Documents && : > ~/Documents/note.txt", "shell": True}},
                               {"type": "launch", "parameters": {"command": ["mousepad",
                                                                             "/home/user/Documents/note.txt"]}},
                               {"type": "activate_window", "parameters": {"window_name": "note.txt"}},
                               {"type": "execute", "parameters": {"command": ["python", "-c", typing]}},
                               {"type": "execute", "parameters": {"command": "cat ~/Documents/note.txt",
                                                                  "shell": True, "until": {"stdout": "draft"}}}],
                       evaluator={"func": "infeasible"}))
    write_task(d, task(id="osw-settings", instruction="Turn on word wrap in VS Code on my phone.",
                       config=[{"type": "execute", "parameters": {
                                   "command": "echo password | sudo -S mkdir -p /opt/osw && mkdir -p "
                                              "~/.config/Code/User && python -c 'import json; print(json.dumps("
                                              "{\"editor.wordWrap\": \"off\", \"editor.fontSize\": 14}))' > "
                                              "~/.config/Code/User/settings.json", "shell": True}},
                               {"type": "execute", "parameters": {
                                   "command": "echo \"$(stat -c %U /opt/osw) $(grep -c '\"editor.wordWrap\": \"off\"' "
                                              "~/.config/Code/User/settings.json)\"",
                                   "shell": True, "until": {"stdout": "root 1"}}}],
                       evaluator={"func": "infeasible"}))


@pytest.fixture()
def work() -> Iterator[Path]:
    with scratch_dir("gh-osworld-desktop-test-") as d:
        yield d


@pytest.mark.timeout(5400)
def test_imported_desktop_cases_validate_on_linux_desktop(work: Path) -> None:
    tasks(work / "osworld")
    cases = work / "cases.yaml"
    imp = subprocess.run([GH_RUNNER, "import", "osworld", str(work / "osworld"), "--out", str(cases),
                          "--start-state", "linux-desktop"],
                         capture_output=True, text=True, timeout=120)
    assert imp.returncode == 0, imp.stderr
    assert "2 tasks: 2 imported, 0 skipped" in imp.stdout
    report = work / "report.json"
    proc = subprocess.run([GH_RUNNER, "validate", str(cases), "--repeat", "1", "--strict", "--slots", "1",
                           "--config", str(REPO / "examples" / "desktop-runner.yaml"), "--report", str(report),
                           "--images-dir", str(IMAGES_DIR)], capture_output=True, text=True, timeout=5300)
    by = {d["key"]: d["validation"] for d in json.loads(report.read_text())["validation"]["data"]}
    assert proc.returncode == 0, (by, proc.stdout[-3000:], proc.stderr[-3000:])
    assert {k: v["status"] for k, v in by.items()} == {"osw-note": "valid", "osw-settings": "valid"}
