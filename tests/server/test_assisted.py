# mypy: disable-error-code="arg-type,list-item,typeddict-item,misc,index"
"""Assisted is not passed (docs/server-api.md, "Assisted attempts"): an attempt a person took over and the
check then scored is counted apart, like an error, everywhere results are read: the API's results, run
progress, pass rates, intervals, pass@k / pass^k, flaky, axes, paired comparisons, case validation and
judge calibration; `gh-runner local`'s table agrees with the API on every count.

As in test_trust.py, the scheduler's and the takeover's writes are made on the rows directly."""

from __future__ import annotations

import httpx
import pytest

from gh_local import report as local_report
from gh_server import stats
from gh_server.models import Attempt, AttemptLabel, RunCase

from .conftest import Server
from .test_test_runs import _attempts, _case, _complete, _finish, _retry
from .test_trust import _by_pair

HOLD = {"by": "alice", "by_key_id": "key_1", "started_at": "2026-12-03T10:00:01.000Z",
        "ended_at": "2026-12-03T10:00:31.000Z", "ended_by": "handed_back", "held_seconds": 30.0,
        "counts": {"keys": 1, "clicks": 1, "typed": 5},
        "events": [{"at": "2026-12-03T10:00:05.000Z", "kind": "click", "x": 10, "y": 20, "button": "left"},
                   {"at": "2026-12-03T10:00:09.000Z", "kind": "typed", "count": 5},
                   {"at": "2026-12-03T10:00:10.000Z", "kind": "key", "keys": "Return"}],
        "events_dropped": 0}


def _assisted(server: Server, attempt_id: str, outcome: str) -> None:
    """A try a person held for a while (as the takeover writes it), then finished with `outcome`."""
    _finish(server, attempt_id, outcome)
    with server.state.db.begin() as s:
        a = s.get(Attempt, attempt_id)
        assert a is not None
        a.assisted, a.takeovers = True, [HOLD]
        if outcome == "error":
            a.metrics = {**(a.metrics or {}), "error_phase": "runner"}


def _http(server: Server) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {server.admin_key}"}, timeout=30)


def _two_agent_run(server: Server, prefix: str) -> str:
    """Two cases, noop and reference, 3 tries each:
    A/noop F F E(assisted, ours: retried) -> F     A/reference P P(assisted) F(assisted)
    B/noop F F(assisted) F                         B/reference P P P"""
    c = server.admin
    ta = _case(server, f"{prefix}-A")["test_case_id"]
    tb = _case(server, f"{prefix}-B")["test_case_id"]
    rid = c.test_runs.create(test_case_ids=[f"{prefix}-A", f"{prefix}-B"], agents=["noop", "reference"],
                             repeat=3)["test_run_id"]
    by = _by_pair(server, rid)
    an = by[(ta, "noop")]
    _finish(server, an[0].id, "failed")
    _finish(server, an[1].id, "failed")
    _assisted(server, an[2].id, "error")  # an assisted try that ended in error: ours, retried
    _finish(server, _retry(server, an[2].id), "failed")
    ar = by[(ta, "reference")]
    _finish(server, ar[0].id, "passed")
    _assisted(server, ar[1].id, "passed")
    _assisted(server, ar[2].id, "failed")
    bn = by[(tb, "noop")]
    _finish(server, bn[0].id, "failed")
    _assisted(server, bn[1].id, "failed")
    _finish(server, bn[2].id, "failed")
    for a in by[(tb, "reference")]:
        _finish(server, a.id, "passed")
    _complete(server, rid)
    return rid


def test_results_count_assisted_tries_apart(server: Server) -> None:
    rid = _two_agent_run(server, "AS")
    res = server.admin.test_runs.results(rid)
    rows = {(r["key"], r["agent_id"]): r for r in res["data"]}
    a_ref = rows[("AS-A", "reference")]
    assert (a_ref["tries"], a_ref["passed"], a_ref["failed"], a_ref["error"], a_ref["assisted"]) == (3, 1, 0, 0, 2)
    assert a_ref["all_passed"] is False  # an assisted pass is not the agent's
    assert a_ref["flaky"] is False  # its one verdict of its own cannot disagree with itself
    assert a_ref["ci95"] == [round(x, 4) for x in stats.wilson(1, 1) or ()]
    assert rows[("AS-B", "noop")]["assisted"] == 1 and rows[("AS-A", "noop")]["assisted"] == 0
    assert rows[("AS-A", "noop")]["error"] == 0  # the assisted error was retried: its retry counts

    ref = res["by_agent"]["reference"]
    assert (ref["tries"], ref["passed"], ref["failed"], ref["error"], ref["assisted"]) == (6, 4, 0, 0, 2)
    assert ref["pass_rate"] == 1.0 and ref["ci95"] == [round(x, 4) for x in stats.wilson(4, 4) or ()]
    assert ref["pass_at_k"] == {"1": 1.0, "2": 1.0, "3": 1.0} and ref["pass_hat_k"] == {"1": 1.0, "2": 1.0, "3": 1.0}
    assert ref["flaky_cases"] == 0
    assert ref["axes"]["structural"]["checked"] == 4  # the check of a person's fix is not the agent's axis
    noop = res["by_agent"]["noop"]
    assert (noop["tries"], noop["passed"], noop["failed"], noop["error"], noop["assisted"]) == (6, 0, 5, 0, 1)
    assert noop["pass_rate"] == 0.0 and noop["infrastructure_errors"] == 1  # the assisted error stays ours

    t = res["totals"]
    assert (t["tries"], t["passed"], t["failed"], t["error"], t["assisted"]) == (12, 4, 5, 0, 3)
    assert t["pass_rate"] == round(4 / 9, 4)
    assert t["infrastructure"]["errors"] == 1
    assert res["timeline"][-1] == {**res["timeline"][-1], "passed": 4, "failed": 5, "error": 0, "assisted": 3}

    # Tries paired by case and order; a try assisted on either side is not a pair.
    p = res["paired_agents"]["agents"]["reference"]
    assert p["compared"] == 2 and p["mean_difference"] == 1.0
    # A: (F,P) (F,-) (F,-); B: (F,P) (-,P) (F,P) -> three pairs, all for reference.
    assert p["mcnemar"]["baseline_only"] == 0 and p["mcnemar"]["other_only"] == 3

    # Run progress (the run object, the runs list, the report page and the console read it) says the same.
    run = server.admin.test_runs.retrieve(rid)
    assert run["progress"] == {"total": 12, "queued": 0, "running": 0, "passed": 4, "failed": 5, "error": 0,
                               "assisted": 3}
    assert run["pass_rate"] == {"noop": 0.0, "reference": 1.0}
    with server.state.db() as s:
        from gh_server.attempts.completion import run_summary

        assert run_summary(s, rid) == (run["progress"], run["pass_rate"])


def test_the_outcome_filter_and_rerun_keep_assisted_tries_apart(server: Server) -> None:
    """The attempts' `outcome` filter counts as results do: `passed` and `failed` leave assisted attempts out,
    `assisted` has them. `rerun only=failed` takes a pair whose try was assisted, passed or failed (the agent
    never earned it); `only=assisted` only those."""
    rid = _two_agent_run(server, "AF")
    c = _http(server)

    def listed(outcome: str) -> list[dict[str, object]]:
        r = c.get(f"/v1/test_runs/{rid}/attempts", params={"outcome": outcome, "limit": 100})
        assert r.status_code == 200, r.text
        return list(r.json()["data"])

    passed, failed, error, assisted = (listed(o) for o in ("passed", "failed", "error", "assisted"))
    assert len(passed) == 4 and not any(a["assisted"] for a in passed)
    assert len(failed) == 5 and not any(a["assisted"] for a in failed)
    assert len(error) == 1 and error[0]["assisted"] is True  # an assisted error stays an error
    assert sorted((a["agent_id"], a["outcome"]) for a in assisted) == [
        ("noop", "failed"), ("reference", "failed"), ("reference", "passed")]
    assert all(a["assisted"] is True for a in assisted)
    bad = c.get(f"/v1/test_runs/{rid}/attempts", params={"outcome": "bogus"})
    assert bad.status_code == 400 and "assisted" in bad.json()["error"]["message"]

    again = c.post(f"/v1/test_runs/{rid}/rerun", json={"only": "assisted"})
    assert again.status_code == 200, again.text
    # (A, reference) and (B, noop): 3 tries each.
    assert again.json()["agents"] == ["noop", "reference"] and again.json()["progress"]["total"] == 6

    # A pair whose only try not passed on its own is an assisted pass: only=failed reruns it.
    _case(server, "AF-P")
    one = server.admin.test_runs.create(test_case_ids=["AF-P"], agents=["reference"], repeat=2)["test_run_id"]
    first, second = _attempts(server, one)
    _finish(server, first.id, "passed")
    _assisted(server, second.id, "passed")
    _complete(server, one)
    re_failed = c.post(f"/v1/test_runs/{one}/rerun", json={"only": "failed"})
    assert re_failed.status_code == 200, re_failed.text
    assert re_failed.json()["agents"] == ["reference"] and re_failed.json()["progress"]["total"] == 2
    assert listed_in(c, one, "passed") == [first.id] and listed_in(c, one, "assisted") == [second.id]


def listed_in(c: httpx.Client, run_id: str, outcome: str) -> list[str]:
    r = c.get(f"/v1/test_runs/{run_id}/attempts", params={"outcome": outcome})
    assert r.status_code == 200, r.text
    return [a["attempt_id"] for a in r.json()["data"]]


def test_an_assisted_try_is_no_pair_across_runs(server: Server) -> None:
    c = server.admin
    _case(server, "AS-C")
    base = c.test_runs.create(test_case_ids=["AS-C"], agents=["noop"], repeat=2)["test_run_id"]
    new = c.test_runs.create(test_case_ids=["AS-C"], agents=["noop"], repeat=2)["test_run_id"]
    for a in _attempts(server, base):
        _finish(server, a.id, "failed")
    first, second = _attempts(server, new)
    _finish(server, first.id, "passed")
    _assisted(server, second.id, "passed")
    _complete(server, base)
    _complete(server, new)
    cmp = c.test_runs.compare([base, new])
    p = cmp["paired"][new]["noop"]
    assert p["compared"] == 1 and p["mcnemar"]["other_only"] == 1 and p["mcnemar"]["baseline_only"] == 0
    (case,) = cmp["cases"]
    assert case["results"][new]["noop"]["assisted"] == 1 and case["results"][new]["noop"]["passed"] == 1


def test_validation_leaves_assisted_verdicts_out(server: Server) -> None:
    """reference passed once on its own and failed once with a person's help: the case is valid, not flaky."""
    c = server.admin
    tid = _case(server, "AS-V")["test_case_id"]
    rid = c.test_runs.create(test_case_ids=["AS-V"], agents=["noop", "reference"], repeat=2)["test_run_id"]
    by = _by_pair(server, rid)
    for a in by[(tid, "noop")]:
        _finish(server, a.id, "failed")
    ref = by[(tid, "reference")]
    _finish(server, ref[0].id, "passed")
    _assisted(server, ref[1].id, "failed")
    _complete(server, rid)
    (row,) = _http(server).get(f"/v1/test_runs/{rid}/validation").json()["data"]
    assert row["validation"]["status"] == "valid", row["validation"]


def test_an_assisted_attempt_is_never_in_judge_calibration(server: Server) -> None:
    c = server.admin
    _case(server, "AS-J")
    rid = c.test_runs.create(test_case_ids=["AS-J"], agents=["noop"], repeat=2)["test_run_id"]
    own, held = _attempts(server, rid)
    _finish(server, own.id, "passed")
    _assisted(server, held.id, "passed")
    judge_id = f"judge-assisted-{rid}"
    with server.state.db.begin() as s:
        for aid in (own.id, held.id):
            a = s.get(Attempt, aid)
            assert a is not None
            a.judge = {"passed": True, "reason": "", "judge_id": judge_id, "usage": None}
            rc = s.get(RunCase, a.run_case_id)
            assert rc is not None
            rc.case = {**(rc.case or {}), "success": {"rubric": "the thing is fixed"}}
    http = _http(server)
    r = http.post(f"/v1/attempts/{held.id}/labels", json={"passed": False})
    assert r.status_code == 409 and r.json()["error"]["code"] == "assisted", r.text
    assert http.post(f"/v1/attempts/{own.id}/labels", json={"passed": True}).status_code == 200
    with server.state.db.begin() as s:  # a label that got there anyway (written directly) is not read
        s.add(AttemptLabel(attempt_id=held.id, passed=False))
    cal = http.get("/v1/judges/calibration").json()
    (mine,) = [j for j in cal["data"] if j["judge_id"] == judge_id]
    assert (mine["labelled"], mine["compared"], mine["agreed"]) == (1, 1, 1)


def test_gh_runner_local_agrees_with_the_api(server: Server) -> None:
    """`gh-runner local` reads the attempts the API lists; its table and its report count what results do."""
    rid = _two_agent_run(server, "AL")
    res = server.admin.test_runs.results(rid)
    listed = _http(server).get(f"/v1/test_runs/{rid}/attempts", params={"limit": 100}).json()["data"]
    assert all("assisted" in a for a in listed)
    counted = [a for a in listed if a["is_last"]]
    rows = local_report.rows_from_attempts(counted)
    for r in res["data"]:
        (mine,) = [x for x in rows if (x.key, x.agent_id) == (r["key"], r["agent_id"])]
        assert (mine.tries, mine.passed, mine.failed, mine.error, mine.assisted) == (
            r["tries"], r["passed"], r["failed"], r["error"], r["assisted"])
    summaries = local_report.summarize_agents(rows, ["noop", "reference"])
    for s in summaries:
        a = res["by_agent"][s.agent_id]
        assert (s.tries, s.passed, s.failed, s.error, s.assisted) == (
            a["tries"], a["passed"], a["failed"], a["error"], a["assisted"])
        assert s.pass_rate == a["pass_rate"]
        assert (round(s.mean_score, 4) if s.mean_score is not None else None) == a["mean_score"]
    table = local_report.render_table(rows, summaries)
    assert table.splitlines()[0].split() == ["case", "agent", "tries", "passed", "failed", "error", "assisted",
                                             "score", "median", "s"]
    assert "[2 assisted]" in table  # reference's summary line
    report = local_report.build_report({"test_run_id": rid, "agents": ["noop", "reference"]}, res, counted)
    assert report["agents"]["reference"]["assisted"] == 2 and report["agents"]["noop"]["assisted"] == 1


def test_the_report_page_shows_assisted_beside_error(server: Server, db_url: str | None) -> None:
    """The results page in Chromium: its counts are the API's, assisted apart in the totals, each agent's
    row, each cell and each try."""
    import re

    chromium = pytest.importorskip("e2e.chromium")
    if chromium.chromium() is None:
        pytest.fail("chromium is not installed (scripts/setup.sh installs it)")
    rid = _two_agent_run(server, "AP")
    res = server.admin.test_runs.results(rid)
    url = _http(server).get(f"/v1/test_runs/{rid}/report_url").json()["url"]
    dom = chromium.load(url, chromium.OUTPUT_DIR / f"report-page-assisted-{'pg' if db_url else 'lite'}.png").dom
    assert 'data-rendered="1"' in dom
    t = res["totals"]
    assert (f'<div id="totals">{t["tries"]} tries: {t["passed"]} passed, {t["failed"]} failed, {t["error"]} error, '
            f'{t["assisted"]} assisted') in dom
    for agent, a in res["by_agent"].items():
        row = re.search(rf'<tr data-agent="{agent}">(.*?)</tr>', dom)
        assert row is not None and f'<td class="assisted">{a["assisted"]}</td>' in row.group(1), agent
    cell = dom[dom.index('data-case="AP-A" data-agent="reference"'):]
    cell = cell[:cell.index("</td>")]
    assert '<span class="rate">100.0%</span>' in cell and "1/1 · 2 assisted" in cell  # 1 of its own, 2 held
    assert cell.count(" (assisted)</a>") == 2 and 'class="passed assisted"' in cell
