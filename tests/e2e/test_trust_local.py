"""Issue 16 on the real linux-tiny guest through `gh-runner local`: an agent stopped by limits.minutes in
the middle of an exec is checked (failed), not an error retried twice."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .test_local import _local

SLOW_FIX = {
    "key": "SLOW-01",
    "name": "The reference fix runs past the limit",
    "prompt": "Please create /tmp/fixed.",
    "start_state": "linux-tiny",
    "setup_script": "rm -f /tmp/fixed\n",
    "success": {"check_script": "if [ -f /tmp/fixed ]; then echo True; else echo False; fi\n"},
    "limits": {"minutes": 1},
    "runs_on": "vm",
    # Still sleeping when the 1-minute limit stops the task: the exec is in flight.
    "metadata": {"reference_fix": "sleep 100\ntouch /tmp/fixed\n"},
}


@pytest.fixture()
def work() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="gh-trust-test-", dir="/var/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.timeout(900)
def test_limit_mid_exec_is_checked_not_an_error(work: Path, images_dir: Path) -> None:
    cases = work / "slow.yaml"
    cases.write_text(yaml.safe_dump({"agents": ["reference"], "repeat": 1, "cases": [SLOW_FIX]}))
    report = work / "report.json"
    proc = _local([str(cases), "--report", str(report)], images_dir)
    out, err = proc.communicate(timeout=800)
    assert proc.returncode == 0, (out[-3000:], err[-3000:])
    res = json.loads(report.read_text())["results"]
    (row,) = res["data"]
    assert (row["passed"], row["failed"], row["error"]) == (0, 1, 0), row
    assert row["task_ends"] == {"time_limit": 1}
    assert res["totals"]["attempts"] == 1  # never retried: the agent's failure is not ours
    assert res["totals"]["infrastructure"]["errors"] == 0
