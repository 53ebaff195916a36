"""Scores on real linux-tiny machines (docs/agents.md, "Scores"): a check that prints 0.5 and a case with
weighted checkpoints give the score the docs promise, through gh-server and gh-runner with the official
SDK (attempts, results), and through `gh-runner local` (the table, report.json's attempts with `score`,
`checkpoints` and `check.before_score`, and the server's results the report carries)."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from guidinghand import Eager
from kit.libvirt import domains
from kit.scratch import scratch_dir, traversable_tmpdir

from .procs import Runner, Server, tear_down
from .test_end_to_end import _wait_online

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


# What each case promises: (3 * 1 + 1 * 0 + 4 * 0.25) / 8 = 0.5 after; (4 * 0.25) / 8 = 0.125 before.
PARTS = [{"name": "a", "weight": 3.0, "score": 1.0, "before_score": 0.0},
         {"name": "b", "weight": 1.0, "score": 0.0, "before_score": 0.0},
         {"name": "c", "weight": 4.0, "score": 0.25, "before_score": 0.25}]


def _promised(half: dict[str, Any], parts: dict[str, Any]) -> None:
    assert half["outcome"] == "failed" and half["score"] == 0.5 and half["checkpoints"] is None
    assert half["check"]["before_score"] == 0.0
    assert parts["outcome"] == "failed" and parts["score"] == 0.5 and parts["checkpoints"] == PARTS
    assert parts["check"]["before_score"] == 0.125
    assert parts["check"]["after"] == "a: True\nb: 0\nc: .25"


def _results(res: dict[str, Any]) -> None:
    agent = res["by_agent"]["reference"]
    assert agent["mean_score"] == 0.5 and agent["pass_rate"] == 0.0
    lo, hi = agent["mean_score_ci"]
    assert lo < 0.5 < hi
    assert {r["key"]: r["mean_score"] for r in res["data"]} == {"SCORE-HALF": 0.5, "SCORE-PARTS": 0.5}


@pytest.mark.timeout(900)
def test_scores_through_the_sdk(images_dir: Path) -> None:
    work = traversable_tmpdir("gh-scores-e2e-")
    state_dir = work / "runner-state"
    state_dir.mkdir(mode=0o755)
    config = work / "server.yaml"
    config.write_text(yaml.safe_dump({"runner_grace_seconds": 60}))
    server = Server(work / "server", config, "gh_live_" + secrets.token_urlsafe(24))
    name = "sc" + secrets.token_hex(3)
    runners: list[Runner] = []
    client: Eager | None = None
    try:
        server.wait_healthy()
        client = Eager(api_key=server.api_key, base_url=server.base_url, timeout=60)
        runners.append(Runner(server.base_url, client.runners.create(name)["token"], name, images_dir, state_dir))
        _wait_online(client, name)
        batch = client.test_cases.batch(CASES["cases"])
        ids = {c["key"]: c["test_case_id"] for c in batch["data"]}
        assert client.test_cases.retrieve("SCORE-PARTS")["success"]["checkpoints"][2] == {
            "name": "c", "check_script": "echo .25\n", "weight": 4.0}
        run = client.test_runs.create(test_case_ids=list(ids.values()), agents=["reference"], repeat=1)
        client.test_runs.wait(run["test_run_id"], timeout=600, poll_interval=2)
        listed = {a["key"]: dict(a) for a in client.test_runs.list_all_attempts(run["test_run_id"])}
        _promised(listed["SCORE-HALF"], listed["SCORE-PARTS"])
        assert dict(client.attempts.retrieve(listed["SCORE-PARTS"]["attempt_id"]))["checkpoints"] == PARTS
        _results(dict(client.test_runs.results(run["test_run_id"])))
        assert runners[0].stop(timeout=120) == 0
        assert domains(f"gh-{name}-") == []
    finally:
        tear_down(runners, client, server, name, work)


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
    _promised(by_key["SCORE-HALF"], by_key["SCORE-PARTS"])
    assert data["agents"]["reference"]["mean_score"] == 0.5 and data["agents"]["reference"]["pass_rate"] == 0.0
    _results(data["results"])
    table = proc.stdout[proc.stdout.index("case "):]
    assert any(line.split()[:2] == ["reference", "0.500"] for line in table.splitlines()), table
