# mypy: disable-error-code="arg-type,list-item,typeddict-item,misc,index"
"""Scores beside verdicts on the server (docs/server-api.md, "Scores"): checkpoints on a case, a runner's
result becoming an attempt's `score`, `checkpoints` and `check.before_score` (the intake's real path),
`mean_score` and `mean_score_ci` in results, paired comparisons on scores."""

from __future__ import annotations

import pytest
from guidinghand import InvalidRequestError

from gh_server.attempts.intake import apply_result
from gh_server.attempts.lease import frozen_case
from gh_server.models import Attempt
from gh_wire import protocol

from .conftest import Server
from .test_test_runs import _attempts, _complete, _finish


def _scored(server: Server, attempt_id: str, after: float, before: float = 0.0,
            checkpoints: list[tuple[str, float, float]] | None = None) -> None:
    """The attempt as a runner of this version reports it: the check's score, or its checkpoints'."""
    with server.state.db.begin() as s:
        a = s.get(Attempt, attempt_id)
        assert a is not None
        a.status, a.runner_id = "checking", "rn_scores"
    result = protocol.AttemptResult(
        attempt_id=attempt_id, outcome="passed" if after == 1.0 else "failed",
        check_before=protocol.CheckOutput(exit_code=0, stdout_tail=str(before), score=before, verdict="False"),
        check_after=protocol.CheckOutput(exit_code=0, stdout_tail=str(after), score=after,
                                         verdict="True" if after == 1.0 else "False"),
        checkpoints=None if checkpoints is None else [
            protocol.CheckpointScore(name=n, weight=w, score=sc, before_score=0.0) for n, w, sc in checkpoints])
    with server.state.db.begin() as s:
        assert apply_result(s, "rn_scores", result).applied


def test_checkpoints_are_validated_on_create(server: Server) -> None:
    c = server.admin
    bad = [
        ({"checkpoints": [{"name": "a", "check_script": "echo 1"}, {"name": "a", "check_script": "echo 0"}]},
         "unique"),
        ({"checkpoints": [{"name": "a", "check_script": "echo 1", "weight": 0}]}, "greater than 0"),
        ({"checkpoints": [{"name": "a", "check_script": "echo 1", "weight": -1}]}, "greater than 0"),
        ({"checkpoints": [{"name": "a", "check_script": " "}]}, "needs a check_script"),
        ({"checkpoints": [{"name": "no spaces", "check_script": "echo 1"}]}, "letters"),
        ({"check_script": "echo False", "checkpoints": [{"name": "check", "check_script": "echo 1"}]},
         "'check'"),
    ]
    for i, (success, phrase) in enumerate(bad):
        with pytest.raises(InvalidRequestError) as e:
            c.test_cases.create("n", "p", "linux-tiny", success, key=f"CP-BAD-{i}")
        assert e.value.status == 400 and phrase in e.value.message, (success, e.value.message)
    tc = c.test_cases.create("n", "p", "linux-tiny", {"check_script": "echo False", "checkpoints": [
        {"name": "files", "check_script": "echo 0.5", "weight": 3}, {"name": "mail", "check_script": "echo 1"}]},
        key="CP-OK")
    assert tc["success"]["checkpoints"] == [{"name": "files", "check_script": "echo 0.5", "weight": 3.0},
                                           {"name": "mail", "check_script": "echo 1", "weight": 1.0}]
    # The runner gets the check_script first, as the checkpoint `check` of weight 1.
    frozen = frozen_case({"success": tc["success"]})
    assert [(x.name, x.check_script, x.weight) for x in frozen.checkpoints] == [
        ("check", "echo False", 1.0), ("files", "echo 0.5", 3.0), ("mail", "echo 1", 1.0)]
    # A PATCH is checked on the merged case too.
    with pytest.raises(InvalidRequestError) as e:
        c.test_cases.update("CP-OK", success={"checkpoints": [{"name": "check", "check_script": "echo 1"}]})
    assert e.value.status == 400 and "'check'" in e.value.message
    only = c.test_cases.create("n", "p", "linux-tiny", {"checkpoints": [{"name": "a", "check_script": "echo 1"}]},
                               key="CP-ONLY")
    assert only["success"]["check_script"] is None


def test_scores_reach_the_attempt_and_results(server: Server) -> None:
    c = server.admin
    for k in ("SC-1", "SC-2"):
        c.test_cases.create(k, "p", "linux-tiny", {"check_script": "echo False"}, key=k)
    rid = c.test_runs.create(test_case_ids=["SC-1", "SC-2"], agents=["noop"], repeat=3)["test_run_id"]
    by_case: dict[str, list[Attempt]] = {}
    for a in _attempts(server, rid):
        by_case.setdefault(a.test_case_id, []).append(a)
    one, two = (by_case[c.test_cases.retrieve(k)["test_case_id"]] for k in ("SC-1", "SC-2"))
    _scored(server, one[0].id, 0.5, before=0.25)
    _scored(server, one[1].id, 1.0)
    _finish(server, one[2].id, "error")  # counts in no mean
    _scored(server, two[0].id, 0.75, checkpoints=[("check", 1.0, 1.0), ("files", 3.0, 2 / 3)])
    _scored(server, two[1].id, 0.0)
    _scored(server, two[2].id, 0.25)
    with server.state.db.begin() as s:  # assisted: counts in no mean either
        a = s.get(Attempt, two[2].id)
        assert a is not None
        a.assisted = True
    _complete(server, rid)

    at = c.attempts.retrieve(one[0].id)
    assert at["score"] == 0.5 and at["outcome"] == "failed" and at["checkpoints"] is None
    assert at["check"]["before_score"] == 0.25 and at["check"]["passed"] is False
    at = c.attempts.retrieve(two[0].id)
    assert at["score"] == 0.75
    assert at["checkpoints"] == [{"name": "check", "weight": 1.0, "score": 1.0, "before_score": 0.0},
                                 {"name": "files", "weight": 3.0, "score": 2 / 3, "before_score": 0.0}]
    assert c.attempts.retrieve(one[2].id)["score"] is None  # an error has none

    res = c.test_runs.results(rid)
    rows = {r["key"]: r for r in res["data"]}
    assert rows["SC-1"]["mean_score"] == 0.75 and rows["SC-2"]["mean_score"] == 0.375
    agent = res["by_agent"]["noop"]
    assert agent["mean_score"] == round((0.5 + 1 + 0.75 + 0) / 4, 4) and agent["pass_rate"] == 0.25
    lo, hi = agent["mean_score_ci"]
    assert 0 < lo < agent["mean_score"] < hi < 1
    assert res["totals"]["mean_score"] == agent["mean_score"]
    # The run object, beside its pass rate per agent (and in the list of runs).
    assert c.test_runs.retrieve(rid)["mean_score"] == {"noop": agent["mean_score"]}
    listed = [r for r in c.test_runs.list(limit=100)["data"] if r["test_run_id"] == rid]
    assert listed[0]["mean_score"] == {"noop": agent["mean_score"]}


def test_compare_pairs_scores(server: Server) -> None:
    c = server.admin
    for k in ("PS-1", "PS-2"):
        c.test_cases.create(k, "p", "linux-tiny", {"check_script": "echo False"}, key=k)
    runs = [c.test_runs.create(test_case_ids=["PS-1", "PS-2"], agents=["noop"], repeat=1)["test_run_id"]
            for _ in range(2)]
    for rid, score in zip(runs, (0.25, 0.75), strict=True):
        for a in _attempts(server, rid):
            _scored(server, a.id, score)
        _complete(server, rid)
    p = c.test_runs.compare(runs)["paired"][runs[1]]["noop"]
    assert p["mean_difference"] == 0.0  # no pass on either side: the pass rates are the same
    assert p["score"]["compared"] == 2 and p["score"]["mean_difference"] == 0.5
    assert p["score"]["ci95"] == [0.5, 0.5]


def test_an_older_runners_verdict_is_its_score_and_an_error_has_none(server: Server) -> None:
    """A runner before scores sends `verdict` only: the server scores True 1 and False 0."""
    c = server.admin
    c.test_cases.create("OLD", "p", "linux-tiny", {"check_script": "echo False"}, key="SC-OLD")
    rid = c.test_runs.create(test_case_ids=["SC-OLD"], agents=["noop"], repeat=3)["test_run_id"]
    passed, failed, broken = _attempts(server, rid)
    for a in (passed, failed, broken):
        with server.state.db.begin() as s:
            row = s.get(Attempt, a.id)
            assert row is not None
            row.status, row.runner_id = "checking", "rn_old"
    old = {"exit_code": 0, "stdout_tail": "False", "verdict": "False"}
    raw = [{"attempt_id": passed.id, "outcome": "passed", "check_before": old,
            "check_after": {**old, "stdout_tail": "True", "verdict": "True"}},
           {"attempt_id": failed.id, "outcome": "failed", "check_before": old, "check_after": old},
           {"attempt_id": broken.id, "outcome": "error", "error": "the check script printed 'x'",
            "check_before": old, "check_after": {"exit_code": 0, "stdout_tail": "x"}}]
    for r in raw:
        with server.state.db.begin() as s:
            assert apply_result(s, "rn_old", protocol.AttemptResult.model_validate(r)).applied
    assert [c.attempts.retrieve(a.id)["score"] for a in (passed, failed)] == [1.0, 0.0]
    assert c.attempts.retrieve(passed.id)["check"]["before_score"] == 0.0
    with server.state.db() as s:
        row = s.get(Attempt, broken.id)
        assert row is not None and row.score is None and row.checkpoints is None


def test_a_result_that_left_the_checkpoints_out_is_told_apart(server: Server) -> None:
    """A runner before scores ignores a lease's checkpoints (docs/protocol.md, "Scores"): its result has no
    score and no checkpoints, and the intake (gh_server/attempts/intake.py) makes it our error."""
    from gh_server.attempts.intake import checkpoints_ignored, unscored_checkpoints

    c = server.admin
    c.test_cases.create("n", "p", "linux-tiny", {"check_script": "echo False", "checkpoints": [
        {"name": "a", "check_script": "echo 1"}]}, key="SC-IGN")
    c.test_cases.create("n", "p", "linux-tiny", {"check_script": "echo False"}, key="SC-PLAIN")
    rid = c.test_runs.create(test_case_ids=["SC-IGN", "SC-PLAIN"], agents=["noop"], repeat=1)["test_run_id"]
    ign_id = c.test_cases.retrieve("SC-IGN")["test_case_id"]
    for a in _attempts(server, rid):
        with server.state.db.begin() as s:
            row = s.get(Attempt, a.id)
            assert row is not None
            row.status, row.runner_id = "checking", "rn_old"
    old = protocol.CheckOutput(exit_code=0, stdout_tail="True", verdict="True")
    new = protocol.CheckOutput(exit_code=0, stdout_tail="True", verdict="True", score=1.0)
    assert unscored_checkpoints(protocol.AttemptResult(attempt_id="x", outcome="passed", check_after=old))
    assert unscored_checkpoints(protocol.AttemptResult(attempt_id="x", outcome="passed", check_absent=True))
    assert not unscored_checkpoints(protocol.AttemptResult(attempt_id="x", outcome="passed", check_after=new))
    assert not unscored_checkpoints(protocol.AttemptResult(attempt_id="x", outcome="error", check_after=old))
    with server.state.db() as s:
        got = {a.test_case_id == ign_id: checkpoints_ignored(s, "rn_old", a.id) for a in _attempts(server, rid)}
    assert got == {True: True, False: False}
