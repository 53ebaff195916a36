# mypy: disable-error-code="arg-type,list-item,typeddict-item,misc,index"
"""Case validation (classify, GET /v1/test_runs/{id}/validation, the case's `validation`, results rows
marked) and judge calibration (POST labels, GET /v1/judges/calibration, results marking verdicts of
untrusted judges). The scheduler's writes are made on the rows, as in test_test_runs.py."""

from __future__ import annotations

import httpx
import pytest

from gh_server import calibration, stats
from gh_server.models import Attempt
from gh_server.validation import Sample, classify

from .conftest import Server
from .test_test_runs import _attempts, _case, _complete, _finish


def S(agent: str, outcome: str, before: str | None = "False", phase: str | None = None,
      last: bool = True) -> Sample:
    return Sample(agent, outcome, last, phase, before)


def test_classify_valid_broken_flaky_unvalidated() -> None:
    good = [S("noop", "failed"), S("noop", "failed"), S("reference", "passed"), S("reference", "passed")]
    assert classify(good) == {"status": "valid", "runs": 4, "reasons": []}
    wrong_fix = [S("noop", "failed"), S("reference", "failed"), S("reference", "failed")]
    v = classify(wrong_fix)
    assert v["status"] == "broken" and [(r["reason"], r["count"], r["of"]) for r in v["reasons"]] == [
        ("reference_failed", 2, 2)]
    # A setup that breaks the machine on some machines only: the check before printed True on one (that
    # attempt was an error, retried); every scored try looks fine, and still the case is not deterministic.
    random_setup = [S("noop", "error", "True", "check_before", last=False), S("noop", "failed"),
                    S("reference", "passed"), S("reference", "passed")]
    v = classify(random_setup)
    assert v["status"] == "flaky" and v["reasons"][0]["reason"] == "check_before_true"
    assert (v["reasons"][0]["count"], v["reasons"][0]["of"]) == (1, 4)
    assert classify([S("noop", "passed"), S("reference", "passed")])["status"] == "broken"
    assert classify([S("noop", "error", None, "machine"), S("reference", "passed")])["status"] == "unvalidated"
    assert classify([])["status"] == "unvalidated"
    assert classify([S("noop", "failed"), S("reference", "error", None, "setup"),
                     S("reference", "passed")])["status"] == "flaky"


def test_classify_flags_a_machine_that_scores_above_0_before_the_task() -> None:
    """A fractional score before the task is no error (the try runs), but validation says the setup left
    part of the check done: broken when every machine shows it, flaky when some do."""
    def B(agent: str, outcome: str, score: float) -> Sample:
        return Sample(agent, outcome, True, None, "0.25" if score else "False", before_score=score)

    every = [B("noop", "failed", 0.25), B("reference", "passed", 0.25)]
    v = classify(every)
    assert v["status"] == "broken"
    assert [(r["reason"], r["count"], r["of"]) for r in v["reasons"]] == [("check_before_scored", 2, 2)]
    assert "scored above 0 before the task" in v["reasons"][0]["message"]
    some = [B("noop", "failed", 0.0), B("noop", "failed", 0.5), B("reference", "passed", 0.0)]
    assert classify(some)["status"] == "flaky"
    # A weighted mean of 1 before (every checkpoint done): the check "printed True" before, as today.
    one = Sample("noop", "error", False, "check_before", "check: True", before_score=1.0)
    v = classify([one, B("noop", "failed", 0.0), B("reference", "passed", 0.0)])
    assert [r["reason"] for r in v["reasons"]] == ["check_before_true"]


def _error_before_true(server: Server, attempt_id: str) -> None:
    _finish(server, attempt_id, "error")
    with server.state.db.begin() as s:
        a = s.get(Attempt, attempt_id)
        assert a is not None
        a.check = {"before": "True", "after": None, "passed": None}
        a.metrics = {**(a.metrics or {}), "error_phase": "check_before"}


def test_validation_through_the_api_is_recorded_on_the_case_and_marks_results(server: Server) -> None:
    c = server.admin
    _case(server, "VAL-OK")
    _case(server, "VAL-BROKEN")
    run = c.test_runs.create(test_case_ids=["VAL-OK", "VAL-BROKEN"], agents=["noop", "reference"], repeat=2)
    rid = run["test_run_id"]
    ok_id = c.test_cases.retrieve("VAL-OK")["test_case_id"]
    assert c.test_cases.retrieve("VAL-OK")["validation"]["status"] == "unvalidated"
    http = httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {server.admin_key}"},
                        timeout=30)
    early = http.get(f"/v1/test_runs/{rid}/validation").json()
    assert early["finished"] is False and {d["validation"]["status"] for d in early["data"]} == {"unvalidated"}
    for a in _attempts(server, rid):
        if a.agent_id == "noop":
            _finish(server, a.id, "failed")
        else:
            _finish(server, a.id, "passed" if a.test_case_id == ok_id else "failed")
    _complete(server, rid)
    got = http.get(f"/v1/test_runs/{rid}/validation").json()
    by = {d["key"]: d["validation"] for d in got["data"]}
    assert by["VAL-OK"]["status"] == "valid" and by["VAL-OK"]["runs"] == 4
    assert by["VAL-BROKEN"]["status"] == "broken"
    assert by["VAL-BROKEN"]["reasons"][0]["message"].startswith("reference failed")
    assert got["counts"] == {"valid": 1, "broken": 1, "flaky": 0, "unvalidated": 0}
    stored = c.test_cases.retrieve("VAL-BROKEN")["validation"]
    assert stored["status"] == "broken" and stored["test_run_id"] == rid and stored["at"]
    # Results of any later run mark the rows whose case is not valid.
    later = c.test_runs.create(test_case_ids=["VAL-OK", "VAL-BROKEN"], agents=["noop"])
    rows = {r["key"]: r for r in c.test_runs.results(later["test_run_id"])["data"]}
    assert rows["VAL-OK"]["case_validation"] == "valid" and rows["VAL-OK"]["case_valid"] is True
    assert rows["VAL-BROKEN"]["case_validation"] == "broken" and rows["VAL-BROKEN"]["case_valid"] is False
    bad = http.get(f"/v1/test_runs/{later['test_run_id']}/validation")
    assert bad.status_code == 400 and "noop and reference" in bad.json()["error"]["message"]
    assert http.get("/v1/test_runs/tr_nope/validation").status_code == 404


def test_flaky_setup_is_caught_by_the_check_before(server: Server) -> None:
    c = server.admin
    _case(server, "VAL-RAND")
    rid = c.test_runs.create(test_case_ids=["VAL-RAND"], agents=["noop", "reference"], repeat=2)["test_run_id"]
    ats = _attempts(server, rid)
    _error_before_true(server, ats[0].id)
    for a in ats[1:]:
        _finish(server, a.id, "failed" if a.agent_id == "noop" else "passed")
    _complete(server, rid)
    http = httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {server.admin_key}"},
                        timeout=30)
    (row,) = http.get(f"/v1/test_runs/{rid}/validation").json()["data"]
    assert row["validation"]["status"] == "flaky"
    assert row["validation"]["reasons"][0]["reason"] == "check_before_true"


def _judged(server: Server, attempt_id: str, passed: bool, judge_id: str = "judge-m") -> None:
    with server.state.db.begin() as s:
        a = s.get(Attempt, attempt_id)
        assert a is not None
        a.judge = {"passed": passed, "reason": "r", "judge_id": judge_id, "usage": {"seconds": 1.5, "tokens": 100}}


@pytest.mark.parametrize("n_labels", [9, 12])
def test_labels_and_judge_calibration(server: Server, n_labels: int) -> None:
    c = server.admin
    server.admin.test_cases.create("rubric case", "p", "linux-tiny", {"rubric": "the printer prints"},
                                   key=f"CAL-{n_labels}")
    rid = c.test_runs.create(test_case_ids=[f"CAL-{n_labels}"], agents=["noop"], repeat=n_labels)["test_run_id"]
    ats = _attempts(server, rid)
    http = httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {server.admin_key}"},
                        timeout=30)
    assert http.post(f"/v1/attempts/{ats[0].id}/labels", json={"passed": True}).status_code == 400  # not done
    judge_says = [True] * (n_labels // 2) + [False] * (n_labels - n_labels // 2)
    people_say = list(judge_says)
    people_say[0] = not people_say[0]  # one disagreement
    for a, j, p in zip(ats, judge_says, people_say, strict=True):
        _finish(server, a.id, "passed" if j else "failed")
        _judged(server, a.id, j, f"judge-{n_labels}")  # the server is shared by the parameters
        r = http.post(f"/v1/attempts/{a.id}/labels", json={"passed": p, "note": "looked at the replay"})
        assert r.status_code == 200 and r.json()["passed"] is p
    # Relabelling replaces the label (one per attempt).
    assert http.post(f"/v1/attempts/{ats[1].id}/labels", json={"passed": people_say[1]}).status_code == 200
    assert http.post("/v1/attempts/at_nope/labels", json={"passed": True}).status_code == 404
    assert http.post(f"/v1/attempts/{ats[1].id}/labels", json={"passed": "maybe"}).status_code == 400
    cal = http.get("/v1/judges/calibration").json()
    (j,) = [x for x in cal["data"] if x["judge_id"] == f"judge-{n_labels}"]
    assert (j["labelled"], j["compared"], j["agreed"]) == (n_labels, n_labels, n_labels - 1)
    assert j["rate"] == round((n_labels - 1) / n_labels, 4)
    yes, no = n_labels // 2, n_labels - n_labels // 2
    k = stats.cohen_kappa(yes - 1, 1, 0, no)  # judge yes & person no once
    assert j["kappa"] == round(k.kappa or 0, 4)
    assert j["trusted"] is (None if n_labels < calibration.MIN_LABELS else True)
    _complete(server, rid)
    row = c.test_runs.results(rid)["data"][0]
    assert row["rubric"]["judged"] == n_labels and row["rubric"]["judges"] == {f"judge-{n_labels}": j["trusted"]}
    assert row["rubric"]["untrusted"] == (n_labels if j["trusted"] is not True else 0)
    axes = c.test_runs.results(rid)["by_agent"]["noop"]["axes"]
    verdicts = [1.0 if x else 0.0 for x in judge_says]
    assert axes["behavioural"][f"judge-{n_labels}"] == {"n": n_labels, "mean": round(sum(verdicts) / n_labels, 4),
                                                        "sd": round(stats_sd(verdicts), 4)}
    assert axes["structural"]["checked"] == n_labels  # the check's own verdicts, apart from the judge's
    assert axes["efficiency"]["evaluator"]["judge_seconds"] == 1.5 * n_labels
    assert axes["efficiency"]["evaluator"]["judge_tokens"] == 100 * n_labels


def stats_sd(v: list[float]) -> float:
    import statistics

    return statistics.stdev(v)


def test_trusted_is_false_under_80_percent() -> None:
    assert calibration.trusted(9, 9) is None
    assert calibration.trusted(10, 7) is False and calibration.trusted(10, 8) is True
