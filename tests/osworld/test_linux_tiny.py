"""Imported OSWorld-format tasks validated on the real linux-tiny guest: `gh-runner import osworld
--start-state linux-tiny` on a small directory, then `gh-runner validate`: on every case the check before
prints False, noop fails and the reference agent passes.

linux-tiny carries no gh_osworld (nor python3), and every metric has one implementation, gh_osworld's: a
task with a metric is skipped (needs_gh_osworld), and the tasks it imports are infeasible ones, checked on
the agent's answer. Their setups still run here, in BusyBox: a downloaded file placed, `echo password | sudo
-S` on a guest without sudo, and an `execute` with `until` that fails the setup (an error, never valid)
unless the two did their work. A desktop task in the same directory is skipped (needs_desktop).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.scratch import scratch_dir

from .conftest import Served, task, write_task

GH_RUNNER = str(Path(sys.executable).parent / "gh-runner")
INFEASIBLE = {"func": "infeasible"}


def tasks(root: Path, served: Served) -> None:
    served.files["/app.conf"] = b"name=shop\ndebug=1\n"
    d = root / "os"
    write_task(d, task(id="osw-greeting", instruction="Make /srv/osw/greeting.txt say hello.",
                       evaluator={"func": "exact_match",
                                  "result": {"type": "vm_command_line", "command": ["cat", "/srv/osw/greeting.txt"]},
                                  "expected": {"type": "rule", "rules": {"expected": "hello\n"}}}))
    # The setup proves its own work: the `until` step waits (60 s at most, then the setup fails) for the
    # downloaded file, made mode 600 through the sudo shim.
    write_task(d, task(id="osw-infeasible", instruction="Install Photoshop for the shop's config in /srv/osw.",
                       config=[{"type": "download", "parameters": {"files": [
                                   {"url": served.url + "/app.conf", "path": "/srv/osw/app.conf"}]}},
                               {"type": "execute", "parameters": {
                                   "command": "echo password | sudo -S chmod 600 /srv/osw/app.conf", "shell": True}},
                               {"type": "execute", "parameters": {
                                   "command": 'echo "$(stat -c %a /srv/osw/app.conf) $(grep -c name=shop '
                                              '/srv/osw/app.conf)"', "shell": True, "until": {"stdout": "600 1"}}}],
                       evaluator=INFEASIBLE))
    write_task(d, task(id="osw-desktop", config=[{"type": "launch", "parameters": {"command": ["mousepad"]}}],
                       evaluator=INFEASIBLE))


@pytest.fixture()
def work() -> Iterator[Path]:
    with scratch_dir("gh-osworld-test-") as d:
        yield d


@pytest.mark.timeout(1500)
def test_imported_cases_validate_on_linux_tiny(work: Path, served: Served, images_dir: Path) -> None:
    tasks(work / "osworld", served)
    cases = work / "cases.yaml"
    imp = subprocess.run([GH_RUNNER, "import", "osworld", str(work / "osworld"), "--out", str(cases),
                          "--start-state", "linux-tiny"], capture_output=True, text=True, timeout=120)
    assert imp.returncode == 0, imp.stderr
    assert "osw-desktop: skipped: needs_desktop (needs a desktop session, which linux-tiny does not have)" in imp.stdout
    assert ("osw-greeting: skipped: needs_gh_osworld (its metrics run in gh_osworld, which linux-tiny does not "
            "carry (osworld-desktop does))") in imp.stdout
    assert "3 tasks: 1 imported, 2 skipped (needs_desktop 1, needs_gh_osworld 1)" in imp.stdout
    report = work / "report.json"
    proc = subprocess.run([GH_RUNNER, "validate", str(cases), "--repeat", "1", "--strict", "--report", str(report),
                           "--images-dir", str(images_dir)], capture_output=True, text=True, timeout=1400)
    by = {d["key"]: d["validation"] for d in json.loads(report.read_text())["validation"]["data"]}
    assert proc.returncode == 0, (by, proc.stdout[-3000:], proc.stderr[-3000:])
    assert {k: v["status"] for k, v in by.items()} == {"osw-infeasible": "valid"}
