"""On the real linux-tiny guest through `gh-runner local`: an agent stopped by limits.minutes in
the middle of an exec is checked (failed), not an error retried twice."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kit.scratch import scratch_dir

from . import chromium
from .test_local import GH_RUNNER, _local

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
    with scratch_dir("gh-trust-test-") as d:
        yield d


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
    # report.html beside report.json opens from disk in Chromium, its try linking to the exported replay.
    page = report.with_suffix(".html")
    assert f"page:    {page}" in out
    loaded = chromium.load(page.as_uri(), chromium.OUTPUT_DIR / "report-local.png")
    assert 'data-rendered="1"' in loaded.dom and "SLOW-01" in loaded.dom
    (href,) = re.findall(r'href="([^"/]*replays/[^"]+/index.html)"', loaded.dom)
    assert (page.parent / href).is_file()


@pytest.mark.timeout(1500)
def test_validate_catches_the_broken_and_the_flaky_example(work: Path, images_dir: Path) -> None:
    """examples/validation.yaml on real machines. VAL-FLAKY's setup rolls a die (breaks 1 time in 3): with
    3 tries of each agent it is called valid only if all 6 first machines broke ((1/3)^6, 0.14%) and broken
    only if none of at least 12 machines did ((2/3)^12, 0.8%: a machine that did not break is a `case` error,
    and the same one on the retry's fresh machine ends the try): wrong about 1 run in 100."""
    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "validation.yaml").read_text())
    data["cases"] = [c for c in data["cases"] if c["key"] in ("VAL-BROKEN", "VAL-FLAKY")]
    cases = work / "validation.yaml"
    cases.write_text(yaml.safe_dump(data))
    report = work / "report.json"
    proc = subprocess.run([GH_RUNNER, "validate", str(cases), "--repeat", "3", "--strict", "--report", str(report),
                           "--images-dir", str(images_dir)], capture_output=True, text=True, timeout=1400)
    assert proc.returncode == 3, (proc.stdout[-3000:], proc.stderr[-3000:])  # --strict: a case is not valid
    out = proc.stdout
    assert "validation (noop must fail" in out
    by = {d["key"]: d["validation"] for d in json.loads(report.read_text())["validation"]["data"]}
    assert by["VAL-BROKEN"]["status"] == "broken", by
    assert [r["reason"] for r in by["VAL-BROKEN"]["reasons"]] == ["reference_failed"]
    assert by["VAL-FLAKY"]["status"] == "flaky", by
    assert by["VAL-FLAKY"]["reasons"][0]["reason"] == "check_before_true"
    assert 0 < by["VAL-FLAKY"]["reasons"][0]["count"] < by["VAL-FLAKY"]["reasons"][0]["of"]
    for key in ("VAL-BROKEN", "VAL-FLAKY"):
        assert any(line.split()[:2] == [key, by[key]["status"]] for line in out.splitlines()), out
    # The results (and report.html) mark the rows whose case is not valid.
    marks = {r["key"]: r["case_validation"] for r in json.loads(report.read_text())["results"]["data"]}
    assert marks == {"VAL-BROKEN": "broken", "VAL-FLAKY": "flaky"}
    page = report.with_suffix(".html").read_text()
    assert '"case_validation": "broken"' in page and '"case_validation": "flaky"' in page
