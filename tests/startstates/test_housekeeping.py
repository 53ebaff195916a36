"""gh_server.start_state_jobs on a real (SQLite) database: idle close and version collection rules.

No runner here: the jobs these passes queue are `runner_jobs` rows, which is what a runner would get.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gh_server import db
from gh_server.app import create_state
from gh_server.models import (
    Attempt,
    RunCase,
    Runner,
    RunnerJob,
    StartState,
    StartStateVersion,
    TestRun,
    utcnow,
)
from gh_server.settings import Settings
from gh_server.start_state_jobs import (
    INSTRUCTION_MINUTES,
    cases_running_on,
    claim_instructions,
    close_idle,
    collect_versions,
    expire_instructions,
    idle_seconds,
    pinned_versions,
)
from gh_server.state import ServerState


@pytest.fixture()
def st() -> Iterator[ServerState]:
    d = Path(tempfile.mkdtemp(prefix="gh-ss-hk-"))
    state = create_state(Settings(data_dir=d))
    db.upgrade(state.engine)
    try:
        yield state
    finally:
        state.engine.dispose()
        shutil.rmtree(d, ignore_errors=True)


def _state(s: Any, ssid: str, *, status: str = "ready", version: int = 1, idle_for: float = 0.0) -> StartState:
    now = utcnow()
    row = StartState(id=ssid, name=ssid, from_="linux-tiny", image="linux-tiny", method="hand", status=status,
                     version=version, runner_id="rn_1", runner_labels=[],
                     opened_at=now - timedelta(seconds=idle_for) if status == "open" else None,
                     created_at=now, updated_at=now)
    s.add(row)
    return row


def _runner(s: Any, held: list[tuple[str, int]]) -> None:
    s.add(Runner(id="rn_1", name="lab", token_hash="x" * 64,
                 held_versions=[{"start_state_id": a, "version": v} for a, v in held]))


def _versions(s: Any, ssid: str, n: int) -> None:
    for v in range(1, n + 1):
        s.add(StartStateVersion(start_state_id=ssid, version=v, runner_id="rn_1", size_bytes=1000))


def _run_on(s: Any, run_id: str, ref: tuple[str, int], *, run_status: str, attempt_status: str) -> None:
    s.add(TestRun(id=run_id, status=run_status, agents=["noop"]))
    s.flush()
    rc = RunCase(test_run_id=run_id, test_case_id="tc_" + run_id, case={},
                 start_state={"kind": "state", "image": "linux-tiny", "start_state_id": ref[0], "version": ref[1]})
    s.add(rc)
    s.flush()
    s.add(Attempt(id="at_" + run_id, test_run_id=run_id, run_case_id=rc.id, test_case_id="tc_" + run_id,
                  agent_id="noop", try_number=1, status=attempt_status))


def _jobs(s: Any, op: str) -> list[RunnerJob]:
    return list(s.scalars(select(RunnerJob).where(RunnerJob.op == op).order_by(RunnerJob.created_at)))


def test_idle_close_keeps_saved_states_and_deletes_never_saved_ones(st: ServerState) -> None:
    with st.db.begin() as s:
        _state(s, "ss_saved", status="open", version=2, idle_for=120)
        _state(s, "ss_unsaved", status="open", version=0, idle_for=120)
        _state(s, "ss_busy", status="open", version=1, idle_for=5)
        recent = _state(s, "ss_typed", status="open", version=1, idle_for=120)
        recent.last_input_at = utcnow()  # input counts, not the opening
        _state(s, "ss_ready", status="ready", version=1)
    with st.db.begin() as s:
        jobs = close_idle(s, idle=60)
    assert len(jobs) == 2
    with st.db() as s:
        saved = s.get(StartState, "ss_saved")
        assert saved is not None and saved.status == "ready" and saved.version == 2
        assert "without input" in (saved.error or "")
        assert s.get(StartState, "ss_unsaved") is None
        for ssid in ("ss_busy", "ss_typed"):
            row = s.get(StartState, ssid)
            assert row is not None and row.status == "open"
        closes = _jobs(s, "close")
        assert sorted(j.start_state_id for j in closes) == ["ss_saved", "ss_unsaved"]
        assert all(j.runner_id == "rn_1" and j.status == "queued" for j in closes)
    with st.db.begin() as s:  # a second pass (or another server process) finds nothing left to do
        assert close_idle(s, idle=60) == []


def test_old_versions_are_collected_only_when_nothing_pins_them(st: ServerState) -> None:
    with st.db.begin() as s:
        _runner(s, [("ss_a", 1), ("ss_a", 2), ("ss_a", 3), ("ss_a", 4)])
        _state(s, "ss_a", version=4)
        _versions(s, "ss_a", 4)
        _run_on(s, "tr_running", ("ss_a", 1), run_status="running", attempt_status="running")
        _run_on(s, "tr_cancelled", ("ss_a", 2), run_status="cancelled", attempt_status="checking")
        _run_on(s, "tr_done", ("ss_a", 3), run_status="completed", attempt_status="done")
    with st.db() as s:
        assert pinned_versions(s) == {("ss_a", 1), ("ss_a", 2)}
        assert cases_running_on(s, "ss_a") == ["tc_tr_cancelled", "tc_tr_running"]
        assert cases_running_on(s, "ss_other") == []
    with st.db.begin() as s:
        jobs = collect_versions(s)
    assert len(jobs) == 1
    with st.db() as s:
        (job,) = _jobs(s, "delete")
        assert (job.start_state_id, job.payload["version"], job.runner_id) == ("ss_a", 3, "rn_1")
        v3 = s.get(StartStateVersion, ("ss_a", 3))
        assert v3 is not None and v3.deleted_at is not None
        runner = s.get(Runner, "rn_1")
        assert runner is not None
        assert [h["version"] for h in runner.held_versions] == [1, 2, 4]  # 4 is current: never collected
    with st.db.begin() as s:
        assert collect_versions(s) == []  # already collected, the others still pinned
    with st.db.begin() as s:
        for run in s.scalars(select(TestRun)):
            run.status = "completed"
        for a in s.scalars(select(Attempt)):
            a.status = "done"
    with st.db.begin() as s:
        assert len(collect_versions(s)) == 2
    with st.db() as s:
        assert sorted(j.payload["version"] for j in _jobs(s, "delete")) == [1, 2, 3]
        runner = s.get(Runner, "rn_1")
        assert runner is not None and runner.held_versions == [{"start_state_id": "ss_a", "version": 4}]


def test_a_build_from_an_old_version_pins_it(st: ServerState) -> None:
    with st.db.begin() as s:
        _runner(s, [("ss_p", 1), ("ss_p", 2)])
        _state(s, "ss_p", version=2)
        _versions(s, "ss_p", 2)
        s.add(RunnerJob(id="jb_child", runner_id="rn_1", start_state_id="ss_child", op="build", status="sent",
                        payload={"source": {"kind": "state", "image": "linux-tiny", "start_state_id": "ss_p",
                                            "version": 1}}))
    with st.db.begin() as s:
        assert collect_versions(s) == []
    with st.db.begin() as s:
        job = s.get(RunnerJob, "jb_child")
        assert job is not None
        job.status = "done"
    with st.db.begin() as s:
        assert len(collect_versions(s)) == 1


def test_idle_seconds_default_setting_and_override(st: ServerState) -> None:
    assert idle_seconds(st) == 7200.0  # 2 hours (docs/start-states.md)
    st.settings = Settings(data_dir=st.settings.data_dir, start_state_idle_seconds=30)
    assert idle_seconds(st) == 30.0
    st.extras["start_state_idle_seconds"] = 5  # a per-process override (tests, embedding)
    assert idle_seconds(st) == 5.0
    with pytest.raises(ValueError):
        Settings(data_dir=st.settings.data_dir, start_state_idle_seconds=0)


def test_instruction_claimed_once_and_given_up_when_its_agent_never_ends(st: ServerState) -> None:
    with st.db.begin() as s:
        row = _state(s, "ss_i", status="building", version=0)
        row.method, row.instruction, row.agent_id = "instruction", "set it up", "reference"
        s.add(RunnerJob(id="jb_open", runner_id="rn_1", start_state_id="ss_i", op="open", status="sent"))
    with st.db.begin() as s:
        assert claim_instructions(s) == []  # the machine is not open yet
    with st.db.begin() as s:
        job = s.get(RunnerJob, "jb_open")
        assert job is not None
        job.status = "done"
    with st.db.begin() as s:
        (claim,) = claim_instructions(s)
    assert claim["agent_id"] == "reference" and claim["instruction"] == "set it up"
    with st.db.begin() as s:
        assert claim_instructions(s) == []  # claimed: no second agent
        assert expire_instructions(s) == []  # still within its budget
    later = utcnow() + timedelta(minutes=INSTRUCTION_MINUTES + 11)
    with st.db.begin() as s:
        (close,) = expire_instructions(s, now=later)
    with st.db() as s:
        failed = s.get(StartState, "ss_i")
        assert failed is not None and failed.status == "failed" and claim["task_id"] in (failed.error or "")
        job = s.get(RunnerJob, close)
        assert job is not None and job.op == "close"


def test_a_finished_trys_save_points_are_deleted_after_the_retention_but_a_forked_one(st: ServerState) -> None:
    """Issue 51: save points outlive their try on the runner's disk only for `save_point_retention_hours`;
    then each is deleted there (a `delete` job of its id, version 1), but one a start state was made from
    (a fork), which is that start state's now. A collected one is marked, and a fork of it refused."""
    from gh_server.errors import ApiError
    from gh_server.start_state_jobs import collect_save_points
    from gh_server.start_states import from_save_point

    retention = timedelta(hours=st.settings.save_point_retention_hours)
    now = utcnow()
    with st.db.begin() as s:
        _runner(s, [])
        for run_id, ended in (("tr_old", now - retention - timedelta(minutes=1)), ("tr_new", now)):
            _run_on(s, run_id, ("ss_base", 1), run_status="completed", attempt_status="done")
            s.flush()
            a = s.get(Attempt, "at_" + run_id)
            assert a is not None
            a.runner_id, a.finished_at = "rn_1", ended
            a.save_points = [{"save_point_id": f"ss_{run_id}p{n}", "step": 10 * n, "created_at": "x", "bytes": 1}
                             for n in (1, 2, 3)]
        s.flush()
        old = s.get(Attempt, "at_tr_old")
        assert old is not None
        from_save_point(s, old, "ss_tr_oldp2", "forked at step 20")
    with st.db.begin() as s:
        jobs = collect_save_points(s, retention)
    with st.db() as s:
        deletes = _jobs(s, "delete")
        assert sorted((j.start_state_id, j.payload["version"], j.runner_id) for j in deletes) == [
            ("ss_tr_oldp1", 1, "rn_1"), ("ss_tr_oldp3", 1, "rn_1")]
        assert sorted(jobs) == sorted(j.id for j in deletes)
        old = s.get(Attempt, "at_tr_old")
        assert old is not None and old.save_points is not None
        assert [bool(p.get("collected_at")) for p in old.save_points] == [True, False, True]
        new = s.get(Attempt, "at_tr_new")
        assert new is not None and not any(p.get("collected_at") for p in new.save_points or [])
    with st.db.begin() as s:  # a second pass finds nothing left to do
        assert collect_save_points(s, retention) == []
    with st.db.begin() as s:
        old = s.get(Attempt, "at_tr_old")
        assert old is not None
        with pytest.raises(ApiError) as refused:
            from_save_point(s, old, "ss_tr_oldp1", None)
        assert refused.value.status == 409 and refused.value.extra["code"] == "save_point_collected"
        assert from_save_point(s, old, "ss_tr_oldp2", None).id == "ss_tr_oldp2"  # the fork stands
