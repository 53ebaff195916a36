"""The attempt modules' pure parts and its DB steps on a real SQLite schema (the API's migrations)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gh_server import db
from gh_server.agents.base import AgentError
from gh_server.agents.models import parse_verdict
from gh_server.attempts import completion, intake, lease, matching, states
from gh_server.dbqueue import DbQueue
from gh_server.models import Attempt, RunCase, Runner, TestCase, TestRun, utcnow
from gh_server.settings import Settings
from gh_wire import protocol
from gh_wire.vocab import ErrorCause


def caps(rid: str = "rn_a", *, labels: tuple[str, ...] = (), images: tuple[str, ...] = ("linux-tiny",),
         held: tuple[tuple[str, int], ...] = (), free: int = 1) -> matching.RunnerCaps:
    return matching.RunnerCaps(rid, rid, frozenset(labels), frozenset(images), frozenset(held), free)


IMAGE = {"kind": "image", "image": "linux-tiny"}


@pytest.mark.parametrize(("runs_on", "ss", "pin", "runner", "ok"), [
    ("vm", IMAGE, None, caps(), True),
    ("vm", IMAGE, None, caps(images=()), False),  # vm = a runner with a hypervisor (advertises images)
    ("vm", {"kind": "image", "image": "win10"}, None, caps(), False),
    ("lenovo", IMAGE, None, caps(labels=("lenovo",)), True),
    ("lenovo", IMAGE, None, caps(labels=("lab",)), False),
    ("vm", {"kind": "state", "image": "linux-tiny", "start_state_id": "ss_1", "version": 2}, None,
     caps(held=(("ss_1", 2),)), True),
    ("vm", {"kind": "state", "image": "linux-tiny", "start_state_id": "ss_1", "version": 3}, None,
     caps(held=(("ss_1", 2),)), False),
    ("vm", IMAGE, "rn_b", caps("rn_a"), False),
    ("vm", IMAGE, "rn_a", caps("rn_a"), True),
])
def test_runner_can_run(runs_on: str, ss: dict[str, Any], pin: str | None, runner: matching.RunnerCaps,
                        ok: bool) -> None:
    assert matching.runner_can_run(matching.Candidate("at_1", runs_on, ss, pin), runner) is ok


def test_pick_runner_spreads_load_and_skips_refusers() -> None:
    a, b, c = caps("rn_a", free=2), caps("rn_b", free=5), caps("rn_c", free=0)
    cand = matching.Candidate("at_1", "vm", IMAGE, None)
    assert matching.pick_runner(cand, [a, b, c], lambda *_: False) is b
    assert matching.pick_runner(cand, [a, b, c], lambda att, rid: rid == "rn_b") is a
    assert matching.pick_runner(cand, [c], lambda *_: False) is None  # full


def test_pick_runner_prefers_a_runner_with_the_source_in_its_hot_pool() -> None:
    cold = caps("rn_cold", free=5)
    hot = matching.RunnerCaps("rn_hot", "rn_hot", frozenset(), frozenset(["linux-tiny"]), frozenset([("ss_1", 2)]), 1,
                           hot=frozenset([("image", "linux-tiny"), ("state", "ss_1", "2")]))
    full_hot = matching.RunnerCaps("rn_full", "rn_full", frozenset(), frozenset(["linux-tiny"]), frozenset(), 0,
                                hot=frozenset([("image", "linux-tiny")]))
    image = matching.Candidate("at_1", "vm", IMAGE, None)
    state = matching.Candidate("at_2", "vm", {"kind": "state", "image": "linux-tiny", "start_state_id": "ss_1",
                                           "version": 2}, None)
    assert matching.pick_runner(image, [cold, hot, full_hot], lambda *_: False) is hot
    assert matching.pick_runner(state, [cold, hot], lambda *_: False) is hot
    assert matching.pick_runner(image, [cold, hot], lambda att, rid: rid == "rn_hot") is cold
    other = matching.Candidate("at_3", "vm", {"kind": "image", "image": "linux-tiny-2"}, None)
    wide = caps("rn_wide", images=("linux-tiny-2",), free=3)
    assert matching.pick_runner(other, [hot, wide], lambda *_: False) is wide


def test_refusal_list_expires() -> None:
    t = [100.0]
    rl = matching.RefusalList(backoff=30, clock=lambda: t[0])
    rl.add("at_1", "rn_a")
    assert rl("at_1", "rn_a") and not rl("at_1", "rn_b") and not rl("at_2", "rn_a")
    t[0] += 31
    assert not rl("at_1", "rn_a")
    rl.prune()
    assert rl._until == {}


def test_refusal_list_reads_the_code() -> None:
    """How long a refusal keeps an attempt off a runner depends on why; an unwell runner gets nothing."""
    t = [100.0]
    rl = matching.RefusalList(backoff=30, clock=lambda: t[0])
    rl.add("at_busy", "rn_a", protocol.LeaseRefusal.NO_SLOT)
    rl.add("at_img", "rn_a", protocol.LeaseRefusal.IMAGE_MISSING)
    rl.add("at_disk", "rn_b", protocol.LeaseRefusal.DISK_LOW)
    # The runner is unwell: every attempt skips it, not only the refused one; other runners are untouched.
    assert rl("at_disk", "rn_b") and rl("at_other", "rn_b") and not rl("at_other", "rn_a")
    assert rl("at_busy", "rn_a") and rl("at_img", "rn_a")
    t[0] += matching.SHORT_BACKOFF_S + 1  # a slot frees soon: offered again before a code-less refusal's 30 s
    assert not rl("at_busy", "rn_a") and rl("at_img", "rn_a") and rl("at_other", "rn_b")
    t[0] += matching.UNWELL_BACKOFF_S
    assert not rl("at_other", "rn_b") and rl("at_img", "rn_a")  # missing image: still kept off for long
    t[0] += matching.LONG_BACKOFF_S
    assert not rl("at_img", "rn_a")
    rl.prune()
    assert rl._until == {}
    assert set(matching.BACKOFF_S) == set(protocol.LeaseRefusal)  # every code has its backoff


def test_pick_runner_skips_a_runner_that_refused_as_unwell() -> None:
    rl = matching.RefusalList(clock=lambda: 0.0)
    a, b = caps("rn_a", free=4), caps("rn_b", free=1)
    cand = matching.Candidate("at_2", "vm", IMAGE, None)
    assert matching.pick_runner(cand, [a, b], rl) is a
    rl.add("at_1", "rn_a", protocol.LeaseRefusal.HYPERVISOR_DOWN)
    assert matching.pick_runner(cand, [a, b], rl) is b
    rl2 = matching.RefusalList(clock=lambda: 0.0)
    rl2.add("at_1", "rn_a", protocol.LeaseRefusal.NO_SLOT)  # busy, not unwell: other attempts still go to it
    assert matching.pick_runner(cand, [a, b], rl2) is a


def test_frozen_case_carries_only_what_the_runner_needs() -> None:
    case = {"test_case_id": "tc_1", "key": "K-1", "name": "n", "prompt": "p", "setup_script": "s",
            "success": {"check_script": "c", "rubric": None}, "limits": {"minutes": 3, "steps": None},
            "runs_on": "lab", "customer": {"facts": {"pw": {"secret": "x"}}}, "metadata": {"reference_fix": "f"}}
    fc = lease.frozen_case(case)
    assert (fc.check_script, fc.limits.minutes, fc.runs_on, fc.key) == ("c", 3, "lab", "K-1")
    dumped = protocol.encode(fc)
    assert '"x"' not in dumped and "reference_fix" not in dumped


@pytest.fixture
def dbs() -> Iterator[sessionmaker[Session]]:
    with tempfile.TemporaryDirectory() as d:
        engine = db.make_engine(Settings(data_dir=Path(d)))
        db.upgrade(engine)
        yield db.make_sessionmaker(engine)
        engine.dispose()


def seed(s: Session, n: int = 1) -> list[str]:
    s.add(Runner(id="rn_a", name="a", token_hash="h", slots=4, images=[{"name": "linux-tiny"}]))
    s.add(TestRun(id="tr_1", agents=["noop"], status="queued"))
    s.flush()
    rc = RunCase(test_run_id="tr_1", test_case_id="tc_1", case={"success": {"check_script": "x"}}, start_state=IMAGE)
    s.add(rc)
    s.flush()
    ids = [f"at_{i}" for i in range(n)]
    for aid in ids:
        s.add(Attempt(id=aid, test_run_id="tr_1", run_case_id=rc.id, test_case_id="tc_1", agent_id="noop",
                      try_number=1, created_at=utcnow()))
    s.commit()
    return ids


def test_lease_pass_claims_oldest_within_free_slots(dbs: sessionmaker[Session]) -> None:
    with dbs() as s:
        ids = seed(s, 6)
        p = lease.lease_pass(s, ["rn_a"], lambda *_: False, lease.RunCaseCache(), False)
        s.commit()
        assert [g.attempt_id for g in p.grants] == ids[:4]  # FIFO, 4 slots
        assert s.get(TestRun, "tr_1").status == "running"  # type: ignore[union-attr]
        again = lease.lease_pass(s, ["rn_a"], lambda *_: False, lease.RunCaseCache(), False)
        assert again.grants == []  # no free slot left: the DB count, not the runner's word


def test_runner_caps_read_the_hot_pool_from_the_hello(dbs: sessionmaker[Session]) -> None:
    with dbs.begin() as s:
        s.add(Runner(id="rn_h", name="h", token_hash="hh", slots=2,
                     images=[{"name": "linux-tiny", "pooled": True}, {"name": "other"}],
                     held_versions=[{"start_state_id": "ss_1", "version": 2, "pooled": True},
                                    {"start_state_id": "ss_1", "version": 3}]))
    with dbs() as s:
        (caps_h,) = lease.load_runner_caps(s, ["rn_h"])
    assert caps_h.hot == {("image", "linux-tiny"), ("state", "ss_1", "2")}
    assert caps_h.images == {"linux-tiny", "other"}


def test_fail_attempt_retries_once_even_when_called_twice(dbs: sessionmaker[Session]) -> None:
    with dbs() as s:
        (aid,) = seed(s)
        s.query(Attempt).filter_by(id=aid).update({"status": "running", "runner_id": "rn_a"})
        r1 = states.fail_attempt(s, aid, "boom")
        r2 = states.fail_attempt(s, aid, "boom again")
        s.commit()
        assert r1 is not None and r1.retry_id is not None and r2 is None
        assert s.query(Attempt).count() == 2


def test_a_case_no_runner_may_take_ends_its_run_at_once(dbs: sessionmaker[Session]) -> None:
    # An attempt the lease pass fails itself (a rubric with no judge configured: not retried) marks its
    # run for the completion check now, not at the next full sweep.
    with dbs() as s:
        (aid,) = seed(s)
        rc = s.get(RunCase, s.get(Attempt, aid).run_case_id)  # type: ignore[union-attr]
        rc.case = {"success": {"check_script": None, "rubric": "The printer prints."}}  # type: ignore[union-attr]
        s.commit()
        p = lease.lease_pass(s, ["rn_a"], lambda *_: False, lease.RunCaseCache(), False)
        s.commit()
        assert p.grants == [] and p.failed_runs == {"tr_1"}
        a = s.get(Attempt, aid)
        assert a is not None and a.outcome == "error" and s.query(Attempt).count() == 1  # not retried


def test_retries_stop_at_three_attempts(dbs: sessionmaker[Session]) -> None:
    with dbs() as s:
        (aid,) = seed(s)
        chain = [aid]
        while True:
            s.query(Attempt).filter_by(id=chain[-1]).update({"status": "running", "runner_id": "rn_a"})
            failed = states.fail_attempt(s, chain[-1], "boom")
            assert failed is not None
            if failed.retry_id is None:
                break
            chain.append(failed.retry_id)
        s.commit()
        assert len(chain) == 3
        assert [a.is_last for a in s.query(Attempt).order_by(Attempt.created_at)] == [False, False, True]
        assert completion.complete_runs(s, ["tr_1"]) == ["tr_1"]


def test_apply_result_needs_the_leaseholder(dbs: sessionmaker[Session]) -> None:
    with dbs() as s:
        (aid,) = seed(s)
        s.query(Attempt).filter_by(id=aid).update({"status": "checking", "runner_id": "rn_a"})
        s.commit()
        res = protocol.AttemptResult(attempt_id=aid, outcome="passed")
        other = intake.apply_result(s, "rn_b", res)
        assert not other.applied and other.note == "attempt not leased to this runner"
        ok = intake.apply_result(s, "rn_a", res)
        dup = intake.apply_result(s, "rn_a", protocol.AttemptResult(attempt_id=aid, outcome="failed"))
        s.commit()
        assert ok.applied and not dup.applied
        assert s.get(Attempt, aid).outcome == "passed"  # type: ignore[union-attr]


def test_rubric_only_result_without_judge_is_error(dbs: sessionmaker[Session]) -> None:
    with dbs() as s:
        (aid,) = seed(s)
        s.query(Attempt).filter_by(id=aid).update({"status": "checking", "runner_id": "rn_a"})
        out = intake.apply_result(s, "rn_a", protocol.AttemptResult(attempt_id=aid, outcome="passed",
                                                                    check_absent=True))
        s.commit()
        assert out.outcome == "error" and out.retry_id is not None
        judged = intake.apply_result(s, "rn_a", protocol.AttemptResult(attempt_id=aid, outcome="passed"))
        assert not judged.applied


async def test_dbqueue_isolates_a_failing_job(dbs: sessionmaker[Session]) -> None:
    with dbs() as s:
        seed(s)
    q = DbQueue(dbs)
    await q.start()
    try:
        def good(n: str) -> Any:
            def job(s: Session) -> str:
                s.add(Runner(id=n, name=n, token_hash=n))
                return n
            return job

        def bad(s: Session) -> None:
            s.add(Runner(id="rn_a", name="dup", token_hash="dup"))  # primary key clash
            s.flush()

        results = await asyncio.gather(q.run(good("rn_x")), q.run(bad), q.run(good("rn_y")), return_exceptions=True)
        assert results[0] == "rn_x" and results[2] == "rn_y" and isinstance(results[1], Exception)
        with dbs() as s:
            assert {r.id for r in s.query(Runner)} == {"rn_a", "rn_x", "rn_y"}
    finally:
        await q.stop()


@pytest.mark.parametrize(("text", "want"), [
    ('{"passed": true, "reason": "ok"}', {"passed": True, "reason": "ok"}),
    ('Verdict:\n{"passed": false, "reason": "no"} thanks', {"passed": False, "reason": "no"}),
])
def test_parse_verdict(text: str, want: dict[str, Any]) -> None:
    assert parse_verdict(text) == want


@pytest.mark.parametrize("text", ["yes", '{"passed": "yes"}', "[]"])
def test_parse_verdict_rejects_garbage(text: str) -> None:
    with pytest.raises(AgentError):
        parse_verdict(text)


def _error_chain(s: Session, aid: str, results: list[protocol.AttemptResult]) -> list[str]:
    """Apply each result to the latest attempt of the try, as the runner would; the attempt ids."""
    chain = [aid]
    for res in results:
        s.query(Attempt).filter_by(id=chain[-1]).update({"status": "checking", "runner_id": "rn_a"})
        out = intake.apply_result(s, "rn_a", res.model_copy(update={"attempt_id": chain[-1]}))
        assert out.applied
        if out.retry_id is None:
            break
        chain.append(out.retry_id)
    return chain


def _case_error(phase: str) -> protocol.AttemptResult:
    return protocol.AttemptResult(attempt_id="x", outcome="error", error=f"{phase}: the check printed 'true'",
                                  error_phase=phase, error_cause=ErrorCause.CASE)


def test_a_case_error_that_repeats_on_a_fresh_machine_is_not_retried_again(dbs: sessionmaker[Session]) -> None:
    with dbs() as s:
        (aid,) = seed(s)
        chain = _error_chain(s, aid, [_case_error("check_before")] * 3)
        s.commit()
        assert len(chain) == 2  # one fresh machine more; the same fault there ends the try
        rows = s.query(Attempt).order_by(Attempt.created_at).all()
        assert [(a.outcome, (a.metrics or {}).get("error_cause")) for a in rows] == [("error", "case")] * 2
        assert completion.complete_runs(s, ["tr_1"]) == ["tr_1"]


def test_errors_of_ours_keep_both_retries_and_a_different_case_fault_is_retried(
        dbs: sessionmaker[Session]) -> None:
    ours = protocol.AttemptResult(attempt_id="x", outcome="error", error="machine: did not boot",
                                  error_phase="machine", error_cause=ErrorCause.INFRASTRUCTURE)
    with dbs() as s:
        (aid,) = seed(s)
        assert len(_error_chain(s, aid, [ours] * 3)) == 3
        s.commit()
    with dbs() as s:
        s.add(Attempt(id="at_b", test_run_id="tr_1", run_case_id=s.query(Attempt).first().run_case_id,  # type: ignore[union-attr]
                      test_case_id="tc_1", agent_id="noop", try_number=2, created_at=utcnow()))
        s.commit()
        # A case error, then ours on the retry, then the case's again: never the same fault twice in a row.
        chain = _error_chain(s, "at_b", [_case_error("setup"), ours, _case_error("setup")])
        assert len(chain) == 3


def test_a_run_of_noop_and_reference_records_validation_when_it_completes(dbs: sessionmaker[Session]) -> None:
    with dbs() as s:
        s.add(TestCase(id="tc_v", key="V-1", name="v", prompt="p", start_state="linux-tiny",
                       success={"check_script": "x"}))
        s.add(TestRun(id="tr_v", agents=["noop", "reference"], status="running"))
        s.flush()
        rc = RunCase(test_run_id="tr_v", test_case_id="tc_v", case={"key": "V-1"}, start_state=IMAGE)
        s.add(rc)
        s.flush()
        for agent, outcome in (("noop", "failed"), ("reference", "passed")):
            s.add(Attempt(id=f"at_{agent}", test_run_id="tr_v", run_case_id=rc.id, test_case_id="tc_v",
                          agent_id=agent, try_number=1, status="done", outcome=outcome, created_at=utcnow(),
                          check={"before": "False", "after": "True" if outcome == "passed" else "False"}))
        s.commit()
        assert s.get(TestCase, "tc_v").validation is None  # type: ignore[union-attr]
        assert completion.complete_runs(s, ["tr_v"]) == ["tr_v"]
        s.commit()
        # Recorded at completion, as docs/server-api.md says: nobody had to GET .../validation first.
        v = s.get(TestCase, "tc_v").validation  # type: ignore[union-attr]
        assert v is not None and v["status"] == "valid" and v["test_run_id"] == "tr_v"
