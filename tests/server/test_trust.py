# mypy: disable-error-code="arg-type,list-item,typeddict-item,misc,index"
"""Results you can trust (docs/server-api.md), through the SDK: Wilson intervals, pass@k and pass^k, flaky
(case, agent) pairs, infrastructure errors counted apart by phase, and paired comparisons (two agents of
a run, and one agent across two runs) with an exact McNemar test and a paired bootstrap interval.

Like test_test_runs.py, the scheduler's writes are made on the rows directly (the API's boundary)."""

from __future__ import annotations

from sqlalchemy import select

from gh_server import stats
from gh_server.models import Attempt

from .conftest import Server
from .test_test_runs import _attempts, _case, _complete, _finish, _retry


def _error_in(server: Server, attempt_id: str, phase: str) -> None:
    _finish(server, attempt_id, "error")
    with server.state.db.begin() as s:
        a = s.get(Attempt, attempt_id)
        assert a is not None and a.metrics is not None
        a.metrics = {**a.metrics, "error_phase": phase}


def _by_pair(server: Server, run_id: str) -> dict[tuple[str, str], list[Attempt]]:
    out: dict[tuple[str, str], list[Attempt]] = {}
    for a in _attempts(server, run_id):
        out.setdefault((a.test_case_id, a.agent_id), []).append(a)
    for v in out.values():
        v.sort(key=lambda a: a.try_number)
    return out


def test_results_carry_intervals_pass_at_k_flaky_and_errors_apart(server: Server) -> None:
    c = server.admin
    t1 = _case(server, "TR-1")["test_case_id"]
    t2 = _case(server, "TR-2")["test_case_id"]
    run = c.test_runs.create(test_case_ids=["TR-1", "TR-2"], agents=["noop", "reference"], repeat=3)
    rid = run["test_run_id"]
    by = _by_pair(server, rid)
    for a in by[(t1, "noop")] + by[(t2, "noop")]:
        _finish(server, a.id, "failed")
    r1 = by[(t1, "reference")]
    _finish(server, r1[0].id, "passed")
    _finish(server, r1[1].id, "failed")  # TR-1 / reference: its tries disagree -> flaky
    _error_in(server, r1[2].id, "setup")  # ours: retried, and the retry counts
    _finish(server, _retry(server, r1[2].id), "passed")
    r2 = by[(t2, "reference")]
    _error_in(server, r2[0].id, "machine")
    for a in r2[1:]:
        _finish(server, a.id, "passed")
    _finish(server, _retry(server, by[(t2, "reference")][0].id), "passed")
    _complete(server, rid)

    res = c.test_runs.results(rid)
    rows = {(r["key"], r["agent_id"]): r for r in res["data"]}
    assert rows[("TR-1", "reference")]["flaky"] is True
    assert rows[("TR-1", "noop")]["flaky"] is False and rows[("TR-2", "reference")]["flaky"] is False
    ref = res["by_agent"]["reference"]
    assert (ref["passed"], ref["failed"], ref["error"]) == (5, 1, 0)  # errors never in the denominator
    lo, hi = stats.wilson(5, 6) or (0, 0)
    assert ref["ci95"] == [round(lo, 4), round(hi, 4)]
    assert ref["pass_at_k"] == {"1": round((2 / 3 + 1) / 2, 4), "2": 1.0, "3": 1.0}
    assert ref["pass_hat_k"] == {"1": round((2 / 3 + 1) / 2, 4), "2": round((1 / 3 + 1) / 2, 4),
                                 "3": round((0 + 1) / 2, 4)}
    assert ref["flaky_cases"] == 1 and ref["infrastructure_errors"] == 2
    assert res["by_agent"]["noop"]["ci95"] == [0.0, round((stats.wilson(0, 6) or (0, 0))[1], 4)]
    infra = res["totals"]["infrastructure"]
    assert infra == {"errors": 2, "attempts": 14, "rate": round(2 / 14, 4), "by_phase": {"machine": 1, "setup": 1}}

    paired = res["paired_agents"]
    assert paired["baseline"] == "noop"
    p = paired["agents"]["reference"]
    assert p["compared"] == 2 and p["mean_difference"] == round((2 / 3 + 1) / 2, 4)
    # Tries paired by case and order: TR-1 (F,F,F) vs (P,F,P) and TR-2 (F,F,F) vs (P,P,P): 0 vs 5 discordant.
    assert p["mcnemar"]["baseline_only"] == 0 and p["mcnemar"]["other_only"] == 5
    assert p["mcnemar"]["p_value"] == round(stats.mcnemar_exact(0, 5).p_value, 6) == 0.0625
    assert p["ci95"][0] <= p["mean_difference"] <= p["ci95"][1]
    assert [x["key"] for x in p["cases"]] == ["TR-1", "TR-2"] and p["cases"][1]["difference"] == 1.0


def test_compare_gains_paired_differences(server: Server) -> None:
    c = server.admin
    _case(server, "PC-1")
    _case(server, "PC-2")
    base = c.test_runs.create(test_case_ids=["PC-1", "PC-2"], agents=["noop"], repeat=2)["test_run_id"]
    new = c.test_runs.create(test_case_ids=["PC-1", "PC-2"], agents=["noop"], repeat=2)["test_run_id"]
    for a in _attempts(server, base):
        _finish(server, a.id, "failed")
    for a in _attempts(server, new):
        _finish(server, a.id, "passed")
    _complete(server, base)
    _complete(server, new)
    cmp = c.test_runs.compare([base, new])
    assert cmp["changes"][new]["improved"] == 2  # what the SDK's type names is unchanged
    p = cmp["paired"][new]["noop"]
    assert p["compared"] == 2 and p["mean_difference"] == 1.0 and p["ci95"] == [1.0, 1.0]
    assert p["mcnemar"] == {"baseline_only": 0, "other_only": 4, "p_value": 0.125, "mid_p": 0.0625}
    with server.state.db() as s:
        assert s.scalar(select(Attempt.id).where(Attempt.test_run_id == new).limit(1)) is not None


def test_a_check_channel_lost_in_task_is_counted_apart(server: Server) -> None:
    """`failed` by the channel rule (gh_wire.vocab.FailReason) is a failure against the agent, shown apart."""
    c = server.admin
    t1 = _case(server, "TR-CH")["test_case_id"]
    rid = c.test_runs.create(test_case_ids=["TR-CH"], agents=["noop"], repeat=2)["test_run_id"]
    first, second = _by_pair(server, rid)[(t1, "noop")]
    _finish(server, first.id, "failed")
    _finish(server, second.id, "failed")
    with server.state.db.begin() as s:
        a = s.get(Attempt, first.id)
        assert a is not None and a.metrics is not None
        a.metrics = {**a.metrics, "failed_reason": "check_channel_lost_in_task"}
    _complete(server, rid)
    res = c.test_runs.results(rid)
    (row,) = res["data"]
    assert row["failed"] == 2 and row["error"] == 0
    assert row["failed_reasons"] == {"check_channel_lost_in_task": 1}
    assert res["by_agent"]["noop"]["failed_reasons"] == {"check_channel_lost_in_task": 1}
