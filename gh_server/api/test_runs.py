"""/v1/test_runs: create (from a set or cases), list, retrieve, cancel, rerun, delete, results, compare,
attempts; and /v1/attempts/{id}.

A run is created whole in one transaction: the run row, one frozen `run_cases` row per case (the test
case object as it is now, and its start state pinned to the current version and its holder), and every
attempt (`queued`). The scheduler picks them up after `state.wake()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any, cast

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy import delete, insert, or_, select, update
from sqlalchemy.orm import Session

from gh_server import counts, queue_wait, replays, serialize, webhooks
from gh_server import results as res
from gh_server import trajectories as traj
from gh_server.api.common import (
    DB,
    Admin,
    Member,
    Page,
    PageParams,
    check_task_minutes,
    like,
    page_body,
    paginate,
    state_of,
)
from gh_server.api.schemas import Rerun, TestRunCreate
from gh_server.api.test_cases import resolve_case
from gh_server.api.test_sets import get_set
from gh_server.attempts.matching import registry_of
from gh_server.auth import Principal
from gh_server.errors import ApiError, conflict, invalid, not_found
from gh_server.models import (
    Attempt,
    ReplayFrame,
    RunCase,
    StartState,
    StartStateVersion,
    TestCase,
    TestRun,
    TestSet,
    TestSetCase,
    new_id,
    utcnow,
)
from gh_server.settings import Settings

router = APIRouter(tags=["Test runs"])

MAX_ATTEMPTS = 5000
BUILTIN_AGENTS = {"default", "noop", "reference"}


def known_agents(settings: Settings) -> set[str]:
    return BUILTIN_AGENTS | set(settings.agents)


def get_run(session: Session, ident: str) -> TestRun:
    row = session.get(TestRun, ident)
    if row is None:
        raise not_found("test run", ident)
    return row


def freeze_start_state(session: Session, value: str, param: str) -> tuple[dict[str, Any], str | None]:
    """The protocol.StartStateRef a run pins, and the runner that must run it (a state's holder)."""
    if not value.startswith("ss_"):
        return {"kind": "image", "image": value, "start_state_id": None, "version": None}, None
    ss = session.get(StartState, value)
    if ss is None:
        raise invalid(param, f"uses start state {value!r}, which does not exist")
    if ss.version < 1:
        raise invalid(param, f"uses start state {value!r}, which has no saved version yet (status {ss.status})")
    row = session.execute(
        select(StartStateVersion.runner_id, StartStateVersion.registry_ref).where(
            StartStateVersion.start_state_id == ss.id, StartStateVersion.version == ss.version
        )
    ).first()
    ref: dict[str, Any] = {"kind": "state", "image": ss.image, "start_state_id": ss.id, "version": ss.version}
    registry = registry_of(row.registry_ref if row is not None else None)
    if registry is not None:
        # In a registry: any runner pulling from it that has the base image may run it (matching
        # prefers holders). The runner's StartStateRef ignores this key; the scheduler reads it.
        ref["registry"] = registry
        return ref, None
    return ref, (row.runner_id if row is not None else None) or ss.runner_id


def frozen_case(case: TestCase, set_customer: dict[str, Any] | None) -> dict[str, Any]:
    obj = serialize.test_case(case)
    if obj["customer"] is None and set_customer is not None:
        obj["customer"] = set_customer  # the copy a try ran: the set's customer for a case with none
    # Fields the runner's FrozenCase reads flat; the API object keeps them nested too.
    obj["check_script"] = obj["success"].get("check_script")
    return obj


def create_run(
    session: Session,
    *,
    name: str | None,
    test_set_id: str | None,
    agents: list[str],
    items: list[tuple[TestCase | dict[str, Any], int, list[str]]],
    set_customer: dict[str, Any] | None = None,
    metadata: dict[str, str] | None = None,
    rerun_of: str | None = None,
    param: str = "test_case_ids",
    queue_timeout: float | None = None,
    max_minutes: int,
) -> TestRun:
    """items: (a case row, or a frozen case dict when the case is gone), tries, the agents to try it with.
    `max_minutes`: the server's max_task_minutes, which every case's limits.minutes must keep to now
    (the setting may have been lowered since the case was stored)."""
    total = sum(tries * len(ag) for _c, tries, ag in items)
    if total == 0:
        raise invalid(param, "no test cases to run")
    if total > MAX_ATTEMPTS:
        raise invalid(
            "repeat" if param == "test_case_ids" else param,
            f"this run would have {total:,} attempts; the limit is {MAX_ATTEMPTS:,} (fewer cases, agents or tries)",
            attempts=total,
        )
    run = TestRun(
        id=new_id("tr_"),
        name=name,
        test_set_id=test_set_id,
        agents=agents,
        status="queued",
        rerun_of=rerun_of,
        metadata_=dict(metadata or {}),
        queue_timeout_seconds=queue_timeout,
    )
    session.add(run)
    session.flush()
    attempt_rows: list[dict[str, Any]] = []
    now = utcnow()
    for pos, (case, tries, case_agents) in enumerate(items):
        if isinstance(case, TestCase):
            frozen = frozen_case(case, set_customer)
            where = f"{param}[{pos}]" if param == "test_case_ids" else param
            ref, holder = freeze_start_state(session, case.start_state, where)
        else:
            frozen = dict(case)
            ref, holder = freeze_start_state(session, str(frozen.get("start_state")), param)
        check_task_minutes(frozen.get("limits"), max_minutes,
                           f"{param}[{pos}]" if param == "test_case_ids" else param)
        rc = RunCase(
            test_run_id=run.id,
            test_case_id=frozen["test_case_id"],
            position=pos,
            tries=tries,
            case=frozen,
            start_state=ref,
            runner_id=holder,
        )
        session.add(rc)
        session.flush()
        for agent in case_agents:
            for t in range(1, tries + 1):
                attempt_rows.append(
                    {
                        "id": new_id("at_"),
                        "test_run_id": run.id,
                        "run_case_id": rc.id,
                        "test_case_id": frozen["test_case_id"],
                        "agent_id": agent,
                        "try_number": t,
                        "is_last": True,
                        "status": "queued",
                        "runs_on": frozen.get("runs_on") or "vm",
                        "required_runner_id": holder,
                        # Creation order is the queue's order (cases as listed, tries in turn).
                        "created_at": now + timedelta(microseconds=len(attempt_rows)),
                    }
                )
    session.execute(insert(Attempt), attempt_rows)
    return run


@router.post("/v1/test_runs", summary="Start a run of a test set or of test cases against agents")
def create_test_run(body: TestRunCreate, request: Request, s: Session = DB, _p: Principal = Member) -> dict[str, Any]:
    st = state_of(request)
    agents = list(dict.fromkeys(body.agents or ["default"]))
    known = known_agents(st.settings)
    for i, a in enumerate(agents):
        if a not in known:
            raise invalid(f"agents[{i}]", f"unknown agent {a!r} (known: {', '.join(sorted(known))})")
    test_set: TestSet | None = None
    set_repeat: dict[str, int | None] = {}
    cases: list[TestCase] = []
    if body.test_set_id is not None:
        test_set = get_set(s, body.test_set_id)
        members = s.execute(
            select(TestCase, TestSetCase.repeat)
            .join(TestSetCase, TestSetCase.test_case_id == TestCase.id)
            .where(TestSetCase.test_set_id == test_set.id)
            .order_by(TestSetCase.position, TestCase.id)
        ).all()
        for case, rep in members:
            cases.append(case)
            set_repeat[case.id] = rep
        if not cases:
            raise invalid("test_set_id", f"test set {test_set.id} has no test cases")
    else:
        seen: set[str] = set()
        for i, ident in enumerate(body.test_case_ids or []):
            try:
                case = resolve_case(s, ident)
            except ApiError:
                raise invalid(f"test_case_ids[{i}]", f"no test case {ident!r}") from None
            if case.id not in seen:
                seen.add(case.id)
                cases.append(case)
    by_case = body.repeat_by_case or {}
    resolved_rbc: dict[str, int] = {}
    for ident, n in by_case.items():
        try:
            resolved_rbc[resolve_case(s, ident).id] = n
        except ApiError:
            raise invalid("repeat_by_case", f"no test case {ident!r}") from None
    items: list[tuple[TestCase | dict[str, Any], int, list[str]]] = []
    for case in cases:
        # The Evals API's precedence: repeat_by_case, the request's repeat, the case's repeat in the set, the set's.
        tries = (
            resolved_rbc.get(case.id)
            or body.repeat
            or set_repeat.get(case.id)
            or (test_set.repeat if test_set is not None else None)
            or 1
        )
        items.append((case, tries, agents))
    run = create_run(
        s,
        name=body.name,
        test_set_id=test_set.id if test_set else None,
        agents=agents,
        items=items,
        set_customer=test_set.customer if test_set else None,
        metadata=body.metadata,
        queue_timeout=body.queue_timeout,
        max_minutes=st.settings.max_task_minutes,
    )
    s.commit()
    st.wake()
    return serialize.test_run(s, run)


@router.get("/v1/test_runs", summary="List runs, newest first")
def list_test_runs(
    status: str | None = Query(default=None),
    test_set_id: str | None = Query(default=None),
    agent_id: str | None = Query(default=None),
    q: str | None = Query(default=None, max_length=200),
    _p: Principal = Member,
    page: PageParams = Page,
    s: Session = DB,
) -> dict[str, Any]:
    stmt = select(TestRun)
    if status is not None:
        if status not in ("queued", "running", "completed", "cancelled"):
            raise invalid("status", "must be queued, running, completed or cancelled")
        stmt = stmt.where(TestRun.status == status)
    if test_set_id is not None:
        stmt = stmt.where(TestRun.test_set_id == test_set_id)
    if agent_id is not None:
        stmt = stmt.where(TestRun.id.in_(select(Attempt.test_run_id).where(Attempt.agent_id == agent_id).distinct()))
    if q:
        stmt = stmt.where(or_(TestRun.name.ilike(like(q), escape="\\"), TestRun.id == q))
    rows, has_more, nxt, total = paginate(s, stmt, TestRun.created_at, TestRun.id, page)
    computed = res.progress_for(s, rows)
    return page_body([serialize.test_run(s, r, computed[r.id]) for r in rows], has_more, nxt, total)


@router.get("/v1/test_runs/compare", summary="2 to 10 runs side by side; the first is the baseline")
def compare_test_runs(
    ids: str = Query(description="comma-separated run ids"), s: Session = DB, _p: Principal = Member
) -> dict[str, Any]:
    wanted = [i.strip() for i in ids.split(",") if i.strip()]
    if not 2 <= len(wanted) <= 10:
        raise invalid("ids", f"compare takes 2 to 10 runs, not {len(wanted)}")
    if len(set(wanted)) != len(wanted):
        raise invalid("ids", "a run is listed twice")
    runs = [get_run(s, i) for i in wanted]
    return res.compare(s, runs)


@router.get("/v1/test_runs/{test_run_id}", summary="Retrieve a run with its progress and pass rates")
def retrieve_test_run(test_run_id: str, s: Session = DB, _p: Principal = Member) -> dict[str, Any]:
    return serialize.test_run(s, get_run(s, test_run_id))


@router.get("/v1/test_runs/{test_run_id}/agents/{agent_id}", summary="One of the run's agents")
def run_agent(test_run_id: str, agent_id: str, s: Session = DB, _p: Principal = Member) -> dict[str, Any]:
    run = get_run(s, test_run_id)
    if agent_id not in (run.agents or []):
        raise not_found(f"agent in test run {run.id}:", agent_id)
    return {
        "object": "test_run_agent",
        "test_run_id": run.id,
        "agent_id": agent_id,
        "version": None,
        "draft": False,
        "base_version": None,
        "draft_at": None,
        "live_version": 0,
        "agent": None,
    }


def cancel_run(s: Session, run: TestRun) -> bool:
    """Marks the run and its queued attempts cancelled; the scheduler cancels leased/running ones.
    Returns False when it had already ended."""
    if run.status in ("completed", "cancelled"):
        return False
    now = utcnow()
    run.status = "cancelled"
    run.finished_at = now
    s.execute(
        update(Attempt)
        .where(Attempt.test_run_id == run.id, Attempt.status == "queued")
        .values(status="cancelled", finished_at=now)
    )
    return True


@router.post("/v1/test_runs/{test_run_id}/cancel", summary="Cancel the attempts that have not finished")
def cancel_test_run(test_run_id: str, request: Request, s: Session = DB, _p: Principal = Member) -> dict[str, Any]:
    run = get_run(s, test_run_id)
    if run.status == "completed":
        raise conflict(f"Test run {run.id} has already completed.", run_status=run.status)
    if cancel_run(s, run):
        s.flush()
        webhooks.enqueue(s, "test_run.completed", serialize.test_run(s, run))
        s.commit()
        state_of(request).wake()
    return serialize.test_run(s, run)


@router.post("/v1/test_runs/{test_run_id}/rerun", summary="A new run of the pairs with a failed try, an error, or all")
def rerun_test_run(
    test_run_id: str, request: Request, body: Rerun | None = None, s: Session = DB, _p: Principal = Member
) -> dict[str, Any]:
    run = get_run(s, test_run_id)
    only = (body.only if body else None) or "failed"
    rows = s.execute(
        select(RunCase, Attempt.agent_id, Attempt.status, Attempt.outcome, Attempt.assisted)
        .join(Attempt, Attempt.run_case_id == RunCase.id)
        .where(RunCase.test_run_id == run.id, Attempt.is_last.is_(True))
        .order_by(RunCase.position)
    ).all()
    wanted: dict[int, tuple[RunCase, list[str]]] = {}
    for rc, agent, status, outcome, assisted in rows:
        if counts.in_rerun(only, counts.counted_as(status, outcome, assisted)):
            entry = wanted.setdefault(rc.id, (rc, []))
            if agent not in entry[1]:
                entry[1].append(agent)
    if not wanted:
        raise invalid("only", f"test run {run.id} has no (case, agent) pair with a {only} try")
    agent_order = {a: i for i, a in enumerate(run.agents or [])}
    items: list[tuple[TestCase | dict[str, Any], int, list[str]]] = []
    for rc, agents in sorted(wanted.values(), key=lambda x: x[0].position):
        current = s.get(TestCase, rc.test_case_id)
        agents.sort(key=lambda a: agent_order.get(a, 99))
        items.append((current if current is not None else rc.case, rc.tries, agents))
    used = [a for a in run.agents or [] if any(a in ag for _c, _t, ag in items)]
    test_set = s.get(TestSet, run.test_set_id) if run.test_set_id else None
    new = create_run(
        s,
        name=f"{run.name or run.id} (rerun {only})",
        test_set_id=run.test_set_id,
        agents=used,
        items=items,
        set_customer=test_set.customer if test_set else None,
        metadata=dict(run.metadata_ or {}),
        rerun_of=run.id,
        param="only",
        queue_timeout=run.queue_timeout_seconds,
        max_minutes=state_of(request).settings.max_task_minutes,
    )
    s.commit()
    state_of(request).wake()
    return serialize.test_run(s, new)


@router.delete("/v1/test_runs/{test_run_id}", summary="Delete a run and its attempts (admin)")
def delete_test_run(test_run_id: str, request: Request, s: Session = DB, _p: Principal = Admin) -> dict[str, Any]:
    run = get_run(s, test_run_id)
    cancel_run(s, run)
    s.flush()
    # Children first: PostgreSQL enforces the foreign keys even where SQLite's cascade would do it.
    attempt_ids = select(Attempt.id).where(Attempt.test_run_id == run.id)
    s.execute(delete(ReplayFrame).where(ReplayFrame.attempt_id.in_(attempt_ids)))
    s.execute(delete(Attempt).where(Attempt.test_run_id == run.id))
    s.execute(delete(RunCase).where(RunCase.test_run_id == run.id))
    s.delete(run)
    s.commit()
    state_of(request).wake()
    return {"object": "test_run", "test_run_id": test_run_id, "deleted": True}


@router.get(
    "/v1/test_runs/{test_run_id}/results",
    summary="Results per case and agent, breakdowns, timeline",
    response_class=JSONResponse,
)
def run_results(test_run_id: str, s: Session = DB, _p: Principal = Member) -> JSONResponse:
    # A plain JSONResponse: the body is already JSON types, and FastAPI's generic encoding of a
    # 5,000-attempt run's results costs as much as computing them.
    return JSONResponse(res.results(s, get_run(s, test_run_id)))


@router.get(
    "/v1/test_runs/{test_run_id}/export",
    summary="The run's trajectories as a tar.gz: Harbor's ATIF or OSWorld's result layout",
    response_class=StreamingResponse,
)
def export_test_run(test_run_id: str, request: Request, s: Session = DB, _p: Principal = Member,
                    format: traj.ExportFormat = Query(..., description="atif or osworld")) -> StreamingResponse:
    """Streamed as it is made (gh_server/trajectories.py): an attempt's replay is read when its turn comes
    and its frames one at a time, so a long run's export holds one screenshot in memory, not the run."""
    run = get_run(s, test_run_id)
    ids = list(s.scalars(select(Attempt.id).where(Attempt.test_run_id == run.id)
                         .order_by(Attempt.test_case_id, Attempt.agent_id, Attempt.try_number, Attempt.created_at)))
    db = state_of(request).db

    def frame_png(attempt_id: str) -> traj.FramePng:
        def load(seq: int) -> bytes:
            with db() as session:
                row = session.get(ReplayFrame, (attempt_id, seq))
                return row.png if row is not None else b""
        return load

    def attempts() -> Iterator[tuple[dict[str, Any], traj.FramePng]]:
        for aid in ids:
            with db() as session:
                data = replays.replay_data(session, aid, "{seq}")
            if data is not None:  # deleted since the export began
                yield data, frame_png(aid)

    root = f"{run.id}-{format.value}"
    return StreamingResponse(traj.targz_chunks(traj.export_files(format, attempts()), root),
                             media_type="application/gzip",
                             headers={"Content-Disposition": f'attachment; filename="{root}.tar.gz"'})


def _case_keys(s: Session, run_id: str) -> dict[str, str | None]:
    return {
        cid: (case or {}).get("key")
        for cid, case in s.execute(select(RunCase.test_case_id, RunCase.case).where(RunCase.test_run_id == run_id))
    }


def _case_in_run(s: Session, ident: str, keys: dict[str, str | None]) -> str:
    """The case id an attempts filter means: an id of the run's cases, else the case that has this key
    now (keys change; the run keeps its case ids), else the case that had it when the run froze it
    (the case may be gone since). Not a case at all is a 404 rather than an empty page."""
    if ident in keys:
        return ident
    now = s.scalar(select(TestCase.id).where(TestCase.key == ident)) if not ident.startswith("tc_") else None
    if now is not None:
        return now
    frozen = [c for c, k in keys.items() if k == ident]
    if frozen:
        return frozen[0]
    if ident.startswith("tc_") and s.get(TestCase, ident) is not None:
        return ident  # a case this run did not play: no attempts
    raise not_found("test case", ident)


@router.get("/v1/test_runs/{test_run_id}/attempts", summary="A page of the run's attempts (retries included)")
def run_attempts(
    test_run_id: str,
    request: Request,
    test_case_id: str | None = Query(default=None),
    agent_id: str | None = Query(default=None),
    outcome: str | None = Query(default=None),
    _p: Principal = Member,
    page: PageParams = Page,
    s: Session = DB,
) -> dict[str, Any]:
    run = get_run(s, test_run_id)
    keys = _case_keys(s, run.id)
    stmt = select(Attempt).where(Attempt.test_run_id == run.id)
    if test_case_id is not None:
        stmt = stmt.where(Attempt.test_case_id == _case_in_run(s, test_case_id, keys))
    if agent_id is not None:
        stmt = stmt.where(Attempt.agent_id == agent_id)
    if outcome is not None:
        if outcome not in counts.COUNTED:
            raise invalid("outcome", "must be passed, failed, error or assisted")
        stmt = stmt.where(counts.where_counted(cast(counts.Counted, outcome), Attempt.status, Attempt.outcome,
                                               Attempt.assisted))
    rows, has_more, nxt, total = paginate(s, stmt, Attempt.created_at, Attempt.id, page, newest_first=False)
    st = state_of(request)
    base = st.settings.base_url
    waits = queue_wait.reasons_for(s, rows, st.settings.online_window_seconds)
    data = [serialize.attempt(a, keys.get(a.test_case_id), base, st.settings,
                              waits[a.id].as_dict() if a.id in waits else None) for a in rows]
    return page_body(data, has_more, nxt, total)


@router.get("/v1/attempts/{attempt_id}", summary="One attempt, with the copy of the test case it ran")
def retrieve_attempt(attempt_id: str, request: Request, s: Session = DB, _p: Principal = Member) -> dict[str, Any]:
    a = s.get(Attempt, attempt_id)
    if a is None:
        raise not_found("attempt", attempt_id)
    case = s.scalar(select(RunCase.case).where(RunCase.id == a.run_case_id)) or {}
    st = state_of(request)
    wait = queue_wait.reasons_for(s, [a], st.settings.online_window_seconds).get(a.id)
    out = serialize.attempt(a, case.get("key"), st.settings.base_url, st.settings,
                            wait.as_dict() if wait is not None else None)
    test_case = {k: v for k, v in case.items() if k != "check_script"}
    out["test_case"] = test_case
    return out
