# mypy: disable-error-code="arg-type,list-item,typeddict-item,misc,index"
"""Runs through the SDK: creation (tries precedence, 5,000 limit, frozen copies), progress and pass rates,
results, attempts, cancel, rerun, compare, delete, wait.

No runner here: the scheduler's writes (an attempt finishing, an error retried) are made on the rows
directly, the boundary between the API and the scheduler.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from guidinghand import ConflictError, EagerTimeout, InvalidRequestError, NotFoundError, PermissionDeniedError
from sqlalchemy import select

from gh_server.models import Attempt, ReplayFrame, RunCase, TestRun, new_id, utcnow

from .conftest import Server


def _case(server: Server, key: str, **kw: object) -> dict:
    return server.admin.test_cases.create(
        f"name {key}",
        f"prompt {key}",
        kw.pop("start_state", "linux-tiny"),
        {"check_script": "echo False"},
        key=key,
        **kw,
    )


def _attempts(server: Server, run_id: str) -> list[Attempt]:
    with server.state.db() as s:
        return list(s.scalars(select(Attempt).where(Attempt.test_run_id == run_id).order_by(Attempt.created_at)))


def _finish(server: Server, attempt_id: str, outcome: str, seconds: float = 10.0, steps: int = 3) -> None:
    with server.state.db.begin() as s:
        a = s.get(Attempt, attempt_id)
        assert a is not None
        now = utcnow()
        a.status, a.outcome, a.seconds = "done", outcome, seconds
        a.started_at, a.finished_at = now - timedelta(seconds=seconds), now
        a.check = {
            "before": "False",
            "after": "True" if outcome == "passed" else "False",
            "passed": outcome == "passed",
        }
        a.metrics = {"active_seconds": seconds, "steps": steps, "questions": 0, "approvals": 0, "cost_cents": None}
        a.error = "machine did not boot" if outcome == "error" else None
        run = s.get(TestRun, a.test_run_id)
        assert run is not None
        if run.status == "queued":
            run.status, run.started_at = "running", now - timedelta(seconds=60)


def _retry(server: Server, attempt_id: str) -> str:
    """What the scheduler does with an error: a new attempt with retry_of, is_last moved to it."""
    with server.state.db.begin() as s:
        a = s.get(Attempt, attempt_id)
        assert a is not None
        a.is_last = False
        new = Attempt(
            id=new_id("at_"),
            test_run_id=a.test_run_id,
            run_case_id=a.run_case_id,
            test_case_id=a.test_case_id,
            agent_id=a.agent_id,
            try_number=a.try_number,
            retry_of=a.id,
            is_last=True,
            status="queued",
            runs_on=a.runs_on,
        )
        s.add(new)
        return new.id


def _complete(server: Server, run_id: str) -> None:
    with server.state.db.begin() as s:
        run = s.get(TestRun, run_id)
        assert run is not None
        run.status, run.finished_at = "completed", utcnow()


def test_tries_precedence_and_progress(server: Server) -> None:
    c = server.admin
    a, b, d = (_case(server, k) for k in ("R-A", "R-B", "R-D"))
    ts = c.test_sets.create(
        "prec", repeat=2, cases=[{"test_case_id": "R-A", "repeat": 3}, {"test_case_id": "R-B"}, {"test_case_id": "R-D"}]
    )
    run = c.test_runs.create(
        test_set_id=ts["test_set_id"], agents=["noop", "reference"], repeat_by_case={"R-B": 4}, name="prec"
    )
    assert run["object"] == "test_run" and run["test_run_id"].startswith("tr_") and run["status"] == "queued"
    assert run["agents"] == ["noop", "reference"] and run["test_set_id"] == ts["test_set_id"]
    # R-A: the case's repeat in the set (3); R-B: repeat_by_case (4); R-D: the set's repeat (2); x2 agents
    assert run["progress"] == {"total": 18, "queued": 18, "running": 0, "passed": 0, "failed": 0, "error": 0,
                               "assisted": 0}
    assert run["pass_rate"] == {"noop": None, "reference": None}
    tries = {}
    for at in _attempts(server, run["test_run_id"]):
        tries.setdefault((at.test_case_id, at.agent_id), []).append(at.try_number)
    assert sorted(tries[(a["test_case_id"], "noop")]) == [1, 2, 3]
    assert sorted(tries[(b["test_case_id"], "reference")]) == [1, 2, 3, 4]
    assert sorted(tries[(d["test_case_id"], "noop")]) == [1, 2]
    # the request's repeat beats the set's; default agent is "default"
    run2 = server.member.test_runs.create(test_set_id=ts["test_set_id"], repeat=1)
    assert run2["agents"] == ["default"] and run2["progress"]["total"] == 3
    run3 = c.test_runs.create(test_case_ids=["R-A", b["test_case_id"]])
    assert run3["progress"]["total"] == 2 and run3["test_set_id"] is None
    # deleting the set keeps its runs (and their attempts) and its cases
    c.test_sets.delete(ts["test_set_id"])
    kept = c.test_runs.retrieve(run["test_run_id"])
    assert kept["test_set_id"] == ts["test_set_id"] and kept["progress"]["total"] == 18
    assert c.test_cases.retrieve("R-A")["key"] == "R-A"
    # deleting a case keeps the runs that froze it
    c.test_cases.delete("R-D")
    assert c.test_runs.results(run["test_run_id"])["totals"]["tries"] == 18


def test_frozen_copy_and_start_state_ref(server: Server) -> None:
    c = server.admin
    _case(server, "FRZ-1", customer=None)
    ts = c.test_sets.create("frz", customer={"persona": "set persona"}, cases=[{"test_case_id": "FRZ-1"}])
    run = c.test_runs.create(test_set_id=ts["test_set_id"], agents=["noop"])
    c.test_cases.update("FRZ-1", name="edited later", prompt="changed")
    at = _attempts(server, run["test_run_id"])[0]
    detail = c.attempts.retrieve(at.id)
    assert detail["object"] == "attempt" and detail["status"] == "queued" and detail["try"] == 1
    assert detail["test_case"]["name"] == "name FRZ-1" and detail["test_case"]["prompt"] == "prompt FRZ-1"
    assert detail["test_case"]["customer"] == {"persona": "set persona"}
    assert detail["key"] == "FRZ-1" and detail["replay_url"].startswith(server.base_url + f"/v1/attempts/{at.id}/")
    with server.state.db() as s:
        rc = s.scalar(select(RunCase).where(RunCase.test_run_id == run["test_run_id"]))
        assert rc is not None
        assert rc.start_state == {"kind": "image", "image": "linux-tiny", "start_state_id": None, "version": None}
        assert rc.case["check_script"] == "echo False"
    with pytest.raises(NotFoundError):
        c.attempts.retrieve("at_nope")


def test_run_errors(server: Server) -> None:
    c = server.admin
    _case(server, "ERR-1")
    with pytest.raises(InvalidRequestError) as e:
        c.test_runs.create(test_case_ids=["ERR-1"], agents=["nobody"])
    assert e.value.extra["param"] == "agents[0]"
    with pytest.raises(InvalidRequestError) as e:
        c.test_runs.create(test_case_ids=["NOPE-1"])
    assert e.value.extra["param"] == "test_case_ids[0]"
    with pytest.raises(InvalidRequestError) as e:
        c.test_runs.create()
    assert "test_set_id" in e.value.message
    with pytest.raises(InvalidRequestError) as e:
        c.test_runs.create(test_case_ids=["ERR-1"], repeat=21)
    assert e.value.extra["param"] == "repeat"
    with pytest.raises(NotFoundError):
        c.test_runs.create(test_set_id="ts_nope")
    with pytest.raises(NotFoundError):
        c.test_runs.retrieve("tr_nope")


def test_at_most_5000_attempts(server: Server) -> None:
    c = server.admin
    out = c.test_cases.batch(
        [
            {"key": f"BIG-{i}", "name": "n", "prompt": "p", "start_state": "linux-tiny", "success": {"rubric": "r"}}
            for i in range(250)
        ]
    )
    ids = [x["test_case_id"] for x in out["data"]]
    with pytest.raises(InvalidRequestError) as e:  # 250 cases x 2 agents x 11 tries = 5,500
        c.test_runs.create(test_case_ids=ids, agents=["noop", "reference"], repeat=11)
    assert e.value.status == 400 and "5,000" in e.value.message and e.value.extra["attempts"] == 5500
    run = c.test_runs.create(test_case_ids=ids, agents=["noop", "reference"], repeat=10)  # exactly 5,000
    assert run["progress"]["total"] == 5000
    c.test_runs.delete(run["test_run_id"])


def test_results_count_last_attempt_of_each_try(server: Server) -> None:
    c = server.admin
    _case(server, "RES-1", tags=["t1", "t2"], category="CatR")
    _case(server, "RES-2", tags=["t1"])
    run = c.test_runs.create(test_case_ids=["RES-1", "RES-2"], agents=["noop", "reference"], repeat=2)
    rid = run["test_run_id"]
    ats = _attempts(server, rid)
    by = {}
    for at in ats:
        by.setdefault((at.test_case_id.startswith("tc_") and at.test_case_id, at.agent_id), []).append(at)
    case1 = c.test_cases.retrieve("RES-1")["test_case_id"]
    case2 = c.test_cases.retrieve("RES-2")["test_case_id"]
    n1, r1 = by[(case1, "noop")], by[(case1, "reference")]
    n2, r2 = by[(case2, "noop")], by[(case2, "reference")]
    _finish(server, n1[0].id, "failed", 20)
    _finish(server, n1[1].id, "failed", 40)
    _finish(server, r1[0].id, "passed", 10)
    _finish(server, r1[1].id, "error")
    retry = _retry(server, r1[1].id)
    _finish(server, retry, "passed", 30)
    _finish(server, n2[0].id, "error")
    _finish(server, r2[0].id, "passed", 50)
    # n2[1], r2[1] still queued
    got = c.test_runs.retrieve(rid)
    assert got["status"] == "running"
    assert got["progress"] == {"total": 8, "queued": 2, "running": 0, "passed": 3, "failed": 2, "error": 1,
                               "assisted": 0}
    assert got["pass_rate"] == {"noop": 0.0, "reference": 1.0}  # the error never counts
    res = c.test_runs.results(rid)
    assert res["object"] == "test_run_results"
    rows = {(r["key"], r["agent_id"]): r for r in res["data"]}
    r = rows[("RES-1", "reference")]
    assert (r["tries"], r["passed"], r["failed"], r["error"], r["all_passed"]) == (2, 2, 0, 0, True)
    assert r["median_seconds"] == 20.0 and r["name"] == "name RES-1" and r["category"] == "CatR"
    r = rows[("RES-1", "noop")]
    assert (r["tries"], r["passed"], r["failed"], r["all_passed"], r["median_seconds"]) == (2, 0, 2, False, 30.0)
    r = rows[("RES-2", "noop")]
    assert (r["tries"], r["error"], r["all_passed"]) == (2, 1, False)
    assert res["by_agent"]["reference"]["pass_rate"] == 1.0 and res["by_agent"]["reference"]["passed"] == 3
    assert res["by_agent"]["noop"]["pass_rate"] == 0.0 and res["by_agent"]["noop"]["error"] == 1
    assert res["by_tag"]["t1"]["reference"]["passed"] == 3 and res["by_tag"]["t2"]["reference"]["tries"] == 2
    assert res["by_category"]["CatR"]["noop"]["failed"] == 2
    assert res["totals"]["tries"] == 8 and res["totals"]["attempts"] == 9
    assert res["totals"]["pass_rate"] == pytest.approx(3 / 5, abs=1e-3)
    assert res["timeline"] and res["timeline"][-1]["passed"] == 3 and res["timeline"][-1]["error"] == 1
    # attempts list: every attempt (retries too), filters, pagination
    allat = list(c.test_runs.list_all_attempts(rid, limit=3))
    assert len(allat) == 9 and len({x["attempt_id"] for x in allat}) == 9
    retried = [x for x in allat if x["retry_of"]]
    assert len(retried) == 1 and retried[0]["outcome"] == "passed" and retried[0]["retry_of"] == r1[1].id
    page = c.test_runs.attempts(rid, outcome="error", include="total_count")
    assert page["total_count"] == 2 and all(x["error"] == "machine did not boot" for x in page["data"])
    assert {x["agent_id"] for x in c.test_runs.attempts(rid, test_case_id="RES-2", agent_id="noop")["data"]} == {"noop"}
    assert len(c.test_runs.attempts(rid, test_case_id="RES-2")["data"]) == 4
    one = c.test_runs.attempts(rid, outcome="passed")["data"][0]
    assert one["check"]["after"] == "True" and one["metrics"]["steps"] == 3 and one["status"] == "done"
    with pytest.raises(InvalidRequestError):
        c.test_runs.attempts(rid, outcome="bogus")
    # rerun only the failed pairs: (RES-1, noop)
    re_failed = server.member.test_runs.rerun(rid, only="failed")
    assert re_failed["agents"] == ["noop"] and re_failed["progress"]["total"] == 2
    re_err = c.test_runs.rerun(rid, only="error")
    assert re_err["progress"]["total"] == 2  # (RES-2, noop) had an error as the last attempt of a try
    re_all = c.test_runs.rerun(rid, only="all")
    assert re_all["progress"]["total"] == 8 and re_all["agents"] == ["noop", "reference"]
    # compare
    _complete(server, rid)
    cmp = server.member.test_runs.compare([rid, re_all["test_run_id"]])
    assert cmp["object"] == "test_run_comparison" and cmp["baseline"] == rid
    assert [r["test_run_id"] for r in cmp["runs"]] == [rid, re_all["test_run_id"]]
    assert cmp["changes"][re_all["test_run_id"]]["compared"] == 0  # nothing scored in the rerun yet
    case_row = next(x for x in cmp["cases"] if x["key"] == "RES-1")
    assert case_row["results"][rid]["reference"]["passed"] == 2
    with pytest.raises(InvalidRequestError) as e:
        c.test_runs.compare([rid])
    assert e.value.extra["param"] == "ids"
    with pytest.raises(InvalidRequestError):
        c.test_runs.compare([rid] + [f"tr_{i}" for i in range(10)])
    with pytest.raises(NotFoundError):
        c.test_runs.compare([rid, "tr_nope"])


def test_compare_changes(server: Server) -> None:
    c = server.admin
    _case(server, "CMP-1")
    base = c.test_runs.create(test_case_ids=["CMP-1"], agents=["noop"])
    new = c.test_runs.create(test_case_ids=["CMP-1"], agents=["noop"])
    _finish(server, _attempts(server, base["test_run_id"])[0].id, "failed")
    _finish(server, _attempts(server, new["test_run_id"])[0].id, "passed")
    cmp = c.test_runs.compare([base["test_run_id"], new["test_run_id"]])
    assert cmp["changes"][new["test_run_id"]] == {"compared": 1, "improved": 1, "regressed": 0, "unchanged": 0}
    assert cmp["cases"][0]["changes"] == {new["test_run_id"]: {"noop": "improved"}}


def test_cancel_wait_delete_and_list(server: Server) -> None:
    c = server.admin
    _case(server, "CAN-1")
    run = c.test_runs.create(test_case_ids=["CAN-1"], agents=["noop"], repeat=3, name="to cancel")
    rid = run["test_run_id"]
    with pytest.raises(EagerTimeout) as e:
        c.test_runs.wait(rid, timeout=0.3, poll_interval=0.1)
    assert e.value.test_run["status"] == "queued"
    out = server.member.test_runs.cancel(rid)
    assert out["status"] == "cancelled" and out["finished_at"] is not None
    assert out["progress"]["queued"] == 0
    assert {a.status for a in _attempts(server, rid)} == {"cancelled"}
    assert c.test_runs.wait(rid, timeout=10, poll_interval=0.1)["status"] == "cancelled"
    assert c.test_runs.cancel(rid)["status"] == "cancelled"  # idempotent
    done = c.test_runs.create(test_case_ids=["CAN-1"], agents=["noop"])
    _finish(server, _attempts(server, done["test_run_id"])[0].id, "passed")
    _complete(server, done["test_run_id"])
    with pytest.raises(ConflictError):
        c.test_runs.cancel(done["test_run_id"])
    listed = c.test_runs.list(status="cancelled", include="total_count")
    assert rid in [r["test_run_id"] for r in listed["data"]]
    assert all(r["status"] == "cancelled" for r in listed["data"])
    assert [r["test_run_id"] for r in c.test_runs.list(q="to cancel")["data"]] == [rid]
    assert rid in [r["test_run_id"] for r in c.test_runs.list_all(agent_id="noop", limit=2)]
    with pytest.raises(InvalidRequestError):
        c.test_runs.list(status="weird")
    with pytest.raises(PermissionDeniedError):
        server.member.test_runs.delete(rid)
    with server.state.db.begin() as s:  # a replay frame the gateway stored: deleting the run removes it too
        s.add(ReplayFrame(attempt_id=_attempts(server, rid)[0].id, seq=0, at=utcnow(), label="first", png=b"x"))
    assert c.test_runs.delete(rid) == {"object": "test_run", "test_run_id": rid, "deleted": True}
    with server.state.db() as s:
        assert s.scalar(select(ReplayFrame.seq).limit(1)) is None
    with pytest.raises(NotFoundError):
        c.test_runs.retrieve(rid)
    assert _attempts(server, rid) == []
    assert server.member.test_runs.agent(done["test_run_id"], "noop")["agent_id"] == "noop"
    with pytest.raises(NotFoundError):
        c.test_runs.agent(done["test_run_id"], "reference")


def test_set_run_and_list_all_start_states(server: Server) -> None:
    c = server.admin
    _case(server, "SR-1")
    ts = c.test_sets.create("runnable", repeat=2, cases=[{"test_case_id": "SR-1"}])
    run = server.member.test_sets.run(ts["test_set_id"], agents=["noop"], name="from set", metadata={"k": "v"})
    assert run["test_set_id"] == ts["test_set_id"] and run["progress"]["total"] == 2
    assert run["name"] == "from set" and run["metadata"] == {"k": "v"}
    assert isinstance(list(c.start_states.list_all(limit=1)), list)


async def test_async_client(server: Server) -> None:
    from guidinghand import AsyncEager, NotFoundError

    c = AsyncEager(api_key=server.admin_key, base_url=server.base_url, max_retries=0, timeout=30)
    try:
        tc = await c.test_cases.create("async", "p", "linux-tiny", {"rubric": "r"}, key="ASYNC-1")
        assert (await c.test_cases.retrieve("ASYNC-1"))["test_case_id"] == tc["test_case_id"]
        run = await c.test_runs.create(test_case_ids=["ASYNC-1"], agents=["reference"])
        assert (await c.test_runs.results(run["test_run_id"]))["totals"]["tries"] == 1
        with pytest.raises(NotFoundError):
            await c.test_runs.retrieve("tr_missing")
    finally:
        await c.close()


def test_results_tell_the_cases_errors_from_ours(server: Server) -> None:
    c = server.admin
    _case(server, "EC-1")
    rid = c.test_runs.create(test_case_ids=["EC-1"], agents=["noop"], repeat=3)["test_run_id"]
    ats = _attempts(server, rid)
    causes = ["case", "infrastructure", None]  # None: an error the runner did not say (ours)
    for a, cause in zip(ats, causes, strict=True):
        _finish(server, a.id, "error")
        with server.state.db.begin() as s:
            row = s.get(Attempt, a.id)
            assert row is not None
            row.metrics = {**(row.metrics or {}), "error_phase": "check_before" if cause == "case" else "machine",
                           **({"error_cause": cause} if cause else {})}
    _complete(server, rid)
    listed = {a["attempt_id"]: a for a in c.test_runs.list_all_attempts(rid)}
    assert [listed[a.id]["error_cause"] for a in ats] == ["case", "infrastructure", "infrastructure"]
    res = c.test_runs.results(rid)
    assert res["totals"]["case_errors"]["errors"] == 1
    assert res["totals"]["case_errors"]["by_phase"] == {"check_before": 1}
    assert res["totals"]["infrastructure"]["errors"] == 2
    assert res["by_agent"]["noop"]["case_errors"] == 1 and res["by_agent"]["noop"]["infrastructure_errors"] == 2
    assert res["by_agent"]["noop"]["pass_rate"] is None  # neither counts against the agent
