"""Imported OSWorld-format tasks validated on the real linux-tiny guest: `gh-runner import osworld
--start-state linux-tiny` on a small directory, then `gh-runner validate`: on every case the check before
prints False, noop fails and the reference fix the test gives passes (OSWorld has no reference fixes).

Covers in the guest: a command's output (exact_match), a file (check_include_exclude), a downloaded file
placed by the setup, `echo password | sudo -S` on a guest without sudo, an expected file embedded in the
check (compare_text_file against cloud_file), postconfig in the check after only, and infeasible on the
agent's answer. A desktop task in the same directory is skipped (needs_desktop).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kit.scratch import scratch_dir

from .conftest import Served, task, write_task

GH_RUNNER = str(Path(sys.executable).parent / "gh-runner")

FIXES = {
    "osw-greeting": "printf 'hello\\n' > /srv/osw/greeting.txt\n",
    "osw-config": "sed -i 's/^debug=1$/mode=prod/' /srv/osw/app.conf\n",
    "osw-sorted": "echo cherry >> /srv/osw/list.txt\n",
}


def tasks(root: Path, served: Served) -> None:
    served.files["/app.conf"] = b"name=shop\ndebug=1\n"
    served.files["/gold.txt"] = b"apple\nbanana\ncherry\n"
    d = root / "os"
    write_task(d, task(id="osw-greeting", instruction="Make /srv/osw/greeting.txt say hello.",
                       config=[{"type": "execute", "parameters": {
                           "command": "mkdir -p /srv/osw && printf 'bye\\n' > /srv/osw/greeting.txt", "shell": True}}],
                       evaluator={"func": "exact_match",
                                  "result": {"type": "vm_command_line", "command": ["cat", "/srv/osw/greeting.txt"]},
                                  "expected": {"type": "rule", "rules": {"expected": "hello\n"}}}))
    write_task(d, task(id="osw-config", instruction="The shop runs in debug mode; switch it to production.",
                       config=[{"type": "download", "parameters": {"files": [
                                   {"url": served.url + "/app.conf", "path": "/srv/osw/app.conf"}]}},
                               {"type": "execute", "parameters": {
                                   "command": "echo password | sudo -S chmod 600 /srv/osw/app.conf", "shell": True}}],
                       evaluator={"func": ["check_include_exclude", "exact_match"], "conj": "and",
                                  "result": [{"type": "vm_file", "path": "/srv/osw/app.conf", "dest": "app.conf"},
                                             {"type": "vm_command_line", "command": "stat -c %a /srv/osw/app.conf",
                                              "shell": True}],
                                  "expected": [{"type": "rule", "rules": {"include": ["mode=prod", "name=shop"],
                                                                          "exclude": ["debug=1"]}},
                                               {"type": "rule", "rules": {"expected": "600\n"}}]}))
    write_task(d, task(id="osw-sorted", instruction="Add cherry to my fruit list /srv/osw/list.txt.",
                       config=[{"type": "execute", "parameters": {
                           "command": "mkdir -p /srv/osw && printf 'banana\\napple\\n' > /srv/osw/list.txt",
                           "shell": True}}],
                       evaluator={"func": "compare_text_file",
                                  "postconfig": [{"type": "execute", "parameters": {
                                      "command": "sort /srv/osw/list.txt > /srv/osw/sorted.txt", "shell": True}}],
                                  "result": {"type": "vm_file", "path": "/srv/osw/sorted.txt", "dest": "s.txt"},
                                  "expected": {"type": "cloud_file", "path": served.url + "/gold.txt",
                                               "dest": "gold.txt"}}))
    write_task(d, task(id="osw-infeasible", instruction="Install Photoshop on this machine.",
                       evaluator={"func": "infeasible"}))
    write_task(d, task(id="osw-desktop", config=[{"type": "launch", "parameters": {"command": ["mousepad"]}}]))


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
    assert "5 tasks: 4 imported, 1 skipped (needs_desktop 1)" in imp.stdout
    data = yaml.safe_load(cases.read_text())
    for case in data["cases"]:  # the reference fixes are the test's: OSWorld gives none
        if case["key"] in FIXES:
            case["metadata"]["reference_fix"] = FIXES[case["key"]]
    cases.write_text(yaml.safe_dump(data))
    report = work / "report.json"
    proc = subprocess.run([GH_RUNNER, "validate", str(cases), "--repeat", "1", "--strict", "--report", str(report),
                           "--images-dir", str(images_dir)], capture_output=True, text=True, timeout=1400)
    by = {d["key"]: d["validation"] for d in json.loads(report.read_text())["validation"]["data"]}
    assert proc.returncode == 0, (by, proc.stdout[-3000:], proc.stderr[-3000:])
    assert {k: v["status"] for k, v in by.items()} == {k: "valid" for k in [*FIXES, "osw-infeasible"]}
