"""Scores on a real linux-tiny machine through `gh-runner local` (docs/agents.md, "Scores"): a check
that prints 0.5 and a case with weighted checkpoints give the score the docs promise, in the table,
in report.json's attempts (`score`, `checkpoints`, `check.before_score`) and in the server's results
the report carries (`mean_score`, `mean_score_ci`)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kit.scratch import scratch_dir

GH_RUNNER = str(Path(sys.executable).parent / "gh-runner")

CASES = {
    "agents": ["reference"],
    "repeat": 1,
    "cases": [
        {   # half the job done by the fix: the check says so
            "key": "SCORE-HALF", "name": "half", "prompt": "make both files", "start_state": "linux-tiny",
            "setup_script": "rm -f /tmp/a /tmp/b\n",
            "success": {"check_script": "n=0\n[ -f /tmp/a ] && n=5\necho checking\necho 0.$n\n"},
            "limits": {"minutes": 1},
            "metadata": {"reference_fix": "touch /tmp/a\n", "reference_answer": "done"},
        },
        {   # weighted checkpoints: a (weight 3) done, b (weight 1) not, c prints a fraction before and after
            "key": "SCORE-PARTS", "name": "parts", "prompt": "make both files", "start_state": "linux-tiny",
            "setup_script": "rm -f /tmp/a /tmp/b\n",
            "success": {"checkpoints": [
                {"name": "a", "check_script": "[ -f /tmp/a ] && echo True || echo False\n", "weight": 3},
                {"name": "b", "check_script": "[ -f /tmp/b ] && echo 1 || echo 0\n"},
                {"name": "c", "check_script": "echo .25\n", "weight": 4},
            ]},
            "limits": {"minutes": 1},
            "metadata": {"reference_fix": "touch /tmp/a\n", "reference_answer": "done"},
        },
    ],
}


@pytest.fixture()
def work() -> Iterator[Path]:
    with scratch_dir("gh-scores-test-") as d:
        yield d


@pytest.mark.timeout(900)
def test_scores_through_gh_runner_local(work: Path, images_dir: Path) -> None:
    cases = work / "cases.yaml"
    cases.write_text(yaml.safe_dump(CASES))
    report = work / "out" / "report.json"
    proc = subprocess.run([GH_RUNNER, "local", str(cases), "--report", str(report), "--images-dir", str(images_dir)],
                          capture_output=True, text=True, timeout=850)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    data = json.loads(report.read_text())
    by_key = {a["key"]: a for a in data["attempts"]}
    half, parts = by_key["SCORE-HALF"], by_key["SCORE-PARTS"]
    assert half["outcome"] == "failed" and half["score"] == 0.5 and half["checkpoints"] is None
    assert half["check"]["before_score"] == 0.0
    # (3 * 1 + 1 * 0 + 4 * 0.25) / 8 = 0.5; before the task (3 * 0 + 0 + 4 * 0.25) / 8 = 0.125
    assert parts["outcome"] == "failed" and parts["score"] == 0.5
    assert parts["checkpoints"] == [
        {"name": "a", "weight": 3.0, "score": 1.0, "before_score": 0.0},
        {"name": "b", "weight": 1.0, "score": 0.0, "before_score": 0.0},
        {"name": "c", "weight": 4.0, "score": 0.25, "before_score": 0.25}]
    assert parts["check"]["before_score"] == 0.125
    assert parts["check"]["after"] == "a: True\nb: 0\nc: .25"
    assert data["agents"]["reference"]["mean_score"] == 0.5 and data["agents"]["reference"]["pass_rate"] == 0.0
    res = data["results"]
    assert res["by_agent"]["reference"]["mean_score"] == 0.5
    lo, hi = res["by_agent"]["reference"]["mean_score_ci"]
    assert lo < 0.5 < hi
    assert {r["key"]: r["mean_score"] for r in res["data"]} == {"SCORE-HALF": 0.5, "SCORE-PARTS": 0.5}
    table = proc.stdout[proc.stdout.index("case "):]
    assert any(line.split()[:2] == ["reference", "0.500"] for line in table.splitlines()), table
