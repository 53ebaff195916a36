"""The scheduler: queued attempts become leases, results become outcomes, retries and finished runs.

Every decision is a row change guarded by the row's status (a lease is `UPDATE attempts SET
status='leased' ... WHERE id=? AND status='queued'`), so several gh-server processes on one
database can share the work: each leases only to the runners connected to it, and the guard keeps
two of them from leasing the same attempt. What lives in memory here is only a cache of frozen
run cases and a short "this runner refused that attempt" list, both safe to lose.

The DB functions take a Session and return plain data; `Scheduler` runs them through the
gateway's `DbQueue` and does the talking (leases, cancels) through the gateway afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, cast

from pydantic import ValidationError
from sqlalchemy import CursorResult, Table, and_, bindparam, func, or_, select, update
from sqlalchemy.orm import Session

from gh_server.models import Attempt, RunCase, Runner, TestRun, new_id, utcnow
from gh_wire import protocol

if TYPE_CHECKING:
    from gh_server.dbqueue import DbQueue

log = logging.getLogger(__name__)

ACTIVE = ("leased", "preparing", "running", "checking")
UNFINISHED = ("queued", *ACTIVE)
MAX_ATTEMPTS_PER_TRY = 3  # the first attempt and 2 retries
REFUSAL_BACKOFF_S = 30.0
HOUSEKEEPING_EVERY_S = 1.0
COMPLETION_CHECK_EVERY_S = 0.2
STATUS_ORDER = {"queued": 0, "leased": 1, "preparing": 2, "running": 3, "checking": 4, "done": 5, "cancelled": 5}


# ---------------------------------------------------------------------------------------------
# Matching (pure)
# ---------------------------------------------------------------------------------------------


@dataclass
class RunnerCaps:
    """What a connected runner can take right now."""

    runner_id: str
    name: str
    labels: frozenset[str]
    images: frozenset[str]
    held: frozenset[tuple[str, int]]
    free: int
    hot: frozenset[tuple[str, ...]] = frozenset()  # sources in the runner's hot pool (see source_key)


@dataclass(frozen=True)
class Candidate:
    attempt_id: str
    runs_on: str
    start_state: dict[str, Any]
    required_runner_id: str | None


def runner_can_run(c: Candidate, r: RunnerCaps) -> bool:
    """The label and the start state, regardless of free slots."""
    if c.required_runner_id is not None and c.required_runner_id != r.runner_id:
        return False
    if c.runs_on == "vm":
        # `vm` is "any virtual machine": a runner that advertises images has a hypervisor.
        if not r.images:
            return False
    elif c.runs_on not in r.labels:
        return False
    ss = c.start_state or {}
    if ss.get("kind") == "state":
        return (str(ss.get("start_state_id")), int(ss.get("version") or 0)) in r.held
    return ss.get("image") in r.images


def source_key(start_state: dict[str, Any]) -> tuple[str, ...]:
    if start_state.get("kind") == "state":
        return ("state", str(start_state.get("start_state_id")), str(int(start_state.get("version") or 0)))
    return ("image", str(start_state.get("image")))


def pick_runner(c: Candidate, runners: Sequence[RunnerCaps], skip: Callable[[str, str], bool]) -> RunnerCaps | None:
    """The matching runner that pools the lease's source (a hot machine: ready in milliseconds,
    not seconds), then the one with the most free slots (spreads load), skipping recent refusers."""
    key = source_key(c.start_state or {})
    best: RunnerCaps | None = None
    best_rank: tuple[bool, int] | None = None
    for r in runners:
        rank = (key in r.hot, r.free)
        if r.free <= 0 or (best_rank is not None and rank <= best_rank):
            continue
        if runner_can_run(c, r) and not skip(c.attempt_id, r.runner_id):
            best, best_rank = r, rank
    return best


class RefusalList:
    """(attempt, runner) pairs not to offer again for a while after a lease_refuse."""

    def __init__(self, backoff: float = REFUSAL_BACKOFF_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._backoff = backoff
        self._clock = clock
        self._until: dict[tuple[str, str], float] = {}

    def add(self, attempt_id: str, runner_id: str) -> None:
        self._until[(attempt_id, runner_id)] = self._clock() + self._backoff
        if len(self._until) > 10_000:
            self.prune()

    def prune(self) -> None:
        now = self._clock()
        for k in [k for k, t in self._until.items() if t <= now]:
            del self._until[k]

    def __call__(self, attempt_id: str, runner_id: str) -> bool:
        t = self._until.get((attempt_id, runner_id))
        return t is not None and t > self._clock()


# ---------------------------------------------------------------------------------------------
# Frozen cases -> lease payloads
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunCaseInfo:
    id: int
    case: dict[str, Any]
    start_state: dict[str, Any]
    runner_id: str | None

    @property
    def rubric(self) -> str | None:
        success = self.case.get("success") or {}
        rubric = success.get("rubric")
        return rubric if isinstance(rubric, str) and rubric.strip() else None


def frozen_case(case: dict[str, Any]) -> protocol.FrozenCase:
    success = case.get("success") or {}
    limits = case.get("limits") or {}
    return protocol.FrozenCase(
        test_case_id=case.get("test_case_id", ""),
        key=case.get("key"),
        name=case.get("name", ""),
        prompt=case.get("prompt", ""),
        setup_script=case.get("setup_script"),
        check_script=success.get("check_script"),
        limits=protocol.Limits(minutes=limits.get("minutes") or 10, steps=limits.get("steps")),
        runs_on=case.get("runs_on") or "vm",
    )


@dataclass(frozen=True)
class Grant:
    attempt_id: str
    runner_id: str
    test_run_id: str
    agent_id: str
    try_number: int
    run_case_id: int


def lease_message(g: Grant, rc: RunCaseInfo, script_timeout: float) -> protocol.Lease:
    return protocol.Lease(
        attempt_id=g.attempt_id,
        test_run_id=g.test_run_id,
        agent_id=g.agent_id,
        try_number=g.try_number,
        case=frozen_case(rc.case),
        start_state=protocol.StartStateRef.model_validate(rc.start_state),
        script_timeout=script_timeout,
    )


# ---------------------------------------------------------------------------------------------
# DB operations (each takes a Session, returns plain data; the caller commits)
# ---------------------------------------------------------------------------------------------


def load_run_cases(session: Session, ids: Iterable[int]) -> dict[int, RunCaseInfo]:
    wanted = list(set(ids))
    out: dict[int, RunCaseInfo] = {}
    for i in range(0, len(wanted), 500):
        rows = session.execute(
            select(RunCase.id, RunCase.case, RunCase.start_state, RunCase.runner_id).where(
                RunCase.id.in_(wanted[i : i + 500])
            )
        ).all()
        for rid, case, ss, pinned in rows:
            out[rid] = RunCaseInfo(id=rid, case=dict(case or {}), start_state=dict(ss or {}), runner_id=pinned)
    return out


def active_counts(session: Session, runner_ids: Sequence[str]) -> dict[str, int]:
    if not runner_ids:
        return {}
    # By status only (the queue index): the few active rows, not every attempt these runners ever ran.
    rows = session.execute(
        select(Attempt.runner_id, func.count()).where(Attempt.status.in_(ACTIVE)).group_by(Attempt.runner_id)
    ).all()
    wanted = set(runner_ids)
    return {rid: n for rid, n in rows if rid in wanted}


def load_runner_caps(session: Session, runner_ids: Sequence[str]) -> list[RunnerCaps]:
    if not runner_ids:
        return []
    rows = session.scalars(select(Runner).where(Runner.id.in_(list(runner_ids)), Runner.revoked_at.is_(None))).all()
    counts = active_counts(session, [r.id for r in rows])
    caps = []
    for r in rows:
        images = frozenset(str(i.get("name")) for i in (r.images or []) if isinstance(i, dict))
        held = frozenset(
            (str(h.get("start_state_id")), int(h.get("version") or 0))
            for h in (r.held_versions or [])
            if isinstance(h, dict)
        )
        hot = frozenset(
            [("image", str(i.get("name"))) for i in (r.images or []) if isinstance(i, dict) and i.get("pooled")]
            + [("state", str(h.get("start_state_id")), str(int(h.get("version") or 0)))
               for h in (r.held_versions or []) if isinstance(h, dict) and h.get("pooled")]
        )
        caps.append(
            RunnerCaps(
                r.id, r.name, frozenset(r.labels or []), images, held, free=max(0, r.slots - counts.get(r.id, 0)),
                hot=hot,
            )
        )
    return caps


_T = cast(Table, Attempt.__table__)
# Built once and run on the connection (not through the ORM): constructing and routing a statement per
# result costs more than executing it.
_RESULT_TARGET = select(
    _T.c.runner_id, _T.c.status, _T.c.outcome, _T.c.test_run_id, _T.c.started_at, _T.c.leased_at
).where(_T.c.id == bindparam("b_id"))


@dataclass
class LeasePass:
    grants: list[Grant] = field(default_factory=list)
    messages: dict[str, protocol.Lease] = field(default_factory=dict)  # by attempt id
    failed_runs: set[str] = field(default_factory=set)  # runs with an attempt errored here (no judge)
    scanned: int = 0
    waited: list[float] = field(default_factory=list)  # seconds each leased attempt was queued


_CLAIM = (
    update(_T)
    .where(_T.c.id == bindparam("b_id"), _T.c.status == "queued")
    .values(status="leased", runner_id=bindparam("runner_id"), leased_at=bindparam("leased_at"))
)


def lease_pass(
    session: Session,
    runner_ids: Sequence[str],
    skip: Callable[[str, str], bool],
    cache: RunCaseCache,
    judge_configured: bool,
    scan_budget: int = 5_000,
    script_timeout: float = 600.0,
) -> LeasePass:
    """Lease queued attempts, oldest first, to these runners' free slots. The caller commits."""
    out = LeasePass()
    runners = load_runner_caps(session, runner_ids)
    free = sum(r.free for r in runners)
    if free <= 0:
        return out
    now = utcnow()
    conn = session.connection()
    after: tuple[datetime, str] | None = None
    started_runs: set[str] = set()
    while free > 0 and out.scanned < scan_budget:
        q = select(
            Attempt.id,
            Attempt.created_at,
            Attempt.runs_on,
            Attempt.required_runner_id,
            Attempt.run_case_id,
            Attempt.test_run_id,
            Attempt.agent_id,
            Attempt.try_number,
        ).where(Attempt.status == "queued")
        if after is not None:
            q = q.where(or_(Attempt.created_at > after[0], and_(Attempt.created_at == after[0], Attempt.id > after[1])))
        page = session.execute(q.order_by(Attempt.created_at, Attempt.id).limit(min(1000, max(64, free * 2)))).all()
        if not page:
            break
        infos = cache.get_many(session, [row.run_case_id for row in page])
        for row in page:
            out.scanned += 1
            rc = infos[row.run_case_id]
            if rc.rubric is not None and not judge_configured:
                # Retrying cannot help: no model will be there to judge the next attempt either.
                if (
                    fail_attempt(
                        session,
                        row.id,
                        "this case has a rubric and no judge model is configured on "
                        "this server (set the judge endpoint in the server settings)",
                        retry=False,
                        now=now,
                        expect_status="queued",
                    )
                    is not None
                ):
                    out.failed_runs.add(row.test_run_id)
                continue
            cand = Candidate(row.id, row.runs_on or "vm", rc.start_state, row.required_runner_id or rc.runner_id)
            r = pick_runner(cand, runners, skip)
            if r is None:
                continue
            grant = Grant(row.id, r.runner_id, row.test_run_id, row.agent_id, row.try_number, row.run_case_id)
            try:
                message = lease_message(grant, rc, script_timeout)
            except ValidationError as e:
                # A frozen copy no runner could take (e.g. written by an older server): say so, once.
                first = e.errors()[0]
                where = ".".join(str(p) for p in first.get("loc", ()))
                why = f"the frozen test case cannot be sent to a runner: {where}: {first.get('msg')}"
                if fail_attempt(session, row.id, why, retry=False, now=now, expect_status="queued") is not None:
                    out.failed_runs.add(row.test_run_id)
                continue
            claimed = conn.execute(_CLAIM, {"b_id": row.id, "runner_id": r.runner_id, "leased_at": now})
            if claimed.rowcount != 1:
                continue  # another process took it
            r.free -= 1
            free -= 1
            started_runs.add(row.test_run_id)
            out.grants.append(grant)
            out.messages[row.id] = message
            out.waited.append((now - row.created_at).total_seconds())
            if free <= 0:
                break
        after = (page[-1].created_at, page[-1].id)
    if started_runs:
        session.execute(
            update(TestRun)
            .where(TestRun.id.in_(list(started_runs)), TestRun.status == "queued")
            .values(status="running", started_at=now)
            .execution_options(synchronize_session=False)
        )
    return out


def release_lease(session: Session, attempt_id: str, runner_id: str) -> bool:
    """Back to the queue (a refused or undeliverable lease). False if it moved on meanwhile."""
    res = session.execute(
        update(Attempt)
        .where(Attempt.id == attempt_id, Attempt.runner_id == runner_id, Attempt.status == "leased")
        .values(status="queued", runner_id=None, leased_at=None)
        .execution_options(synchronize_session=False)
    )
    return cast(CursorResult[Any], res).rowcount == 1


def retry_count(session: Session, attempt: Attempt) -> int:
    """How many attempts this try has had, following the retry_of chain back to the first."""
    n, prev = 1, attempt.retry_of
    while prev is not None and n <= MAX_ATTEMPTS_PER_TRY + 1:
        n += 1
        prev = session.scalar(select(Attempt.retry_of).where(Attempt.id == prev))
    return n


def _retry(session: Session, a: Attempt, now: datetime) -> str | None:
    if retry_count(session, a) >= MAX_ATTEMPTS_PER_TRY:
        return None
    run_status = session.scalar(select(TestRun.status).where(TestRun.id == a.test_run_id))
    if run_status == "cancelled":
        return None
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
        required_runner_id=a.required_runner_id,
        created_at=now,
    )
    a.is_last = False
    session.add(new)
    return new.id


def fail_attempt(
    session: Session,
    attempt_id: str,
    error: str,
    *,
    retry: bool = True,
    now: datetime | None = None,
    expect_status: str | Sequence[str] | None = None,
) -> str | None:
    """Make an unfinished attempt an `error` and queue its retry. Returns the retry's id, if any.

    The UPDATE is guarded by the status it read, so two gh-server processes expiring the same
    runner's attempts cannot both retry one.
    """
    now = now or utcnow()
    a = session.get(Attempt, attempt_id)
    if a is None or a.status in ("done", "cancelled"):
        return None
    if expect_status is not None:
        allowed = (expect_status,) if isinstance(expect_status, str) else tuple(expect_status)
        if a.status not in allowed:
            return None
    res = session.execute(
        update(Attempt)
        .where(Attempt.id == attempt_id, Attempt.status == a.status)
        .values(status="done", outcome="error", error=error[:4000], finished_at=now)
        .execution_options(synchronize_session=False)
    )
    if cast(CursorResult[Any], res).rowcount != 1:
        return None
    session.refresh(a)
    return _retry(session, a, now) if retry else None


@dataclass(frozen=True)
class Applied:
    attempt_id: str
    applied: bool  # False: a resend of a result already applied (or not this runner's)
    test_run_id: str | None = None
    outcome: str | None = None
    retry_id: str | None = None
    note: str | None = None


def _check_text(c: protocol.CheckOutput | None) -> str | None:
    if c is None:
        return None
    text = (c.stdout_tail or "").strip()
    if c.timed_out:
        text = (text + "\n[timed out]").strip()
    elif c.exit_code not in (None, 0) and c.verdict is None:
        text = (text + f"\n[exit code {c.exit_code}] {(c.stderr_tail or '').strip()}").strip()
    return text[-4000:]


_APPLY_RESULT = (
    update(_T)
    .where(_T.c.id == bindparam("b_id"), _T.c.status == bindparam("b_status"))
    .values(
        {
            c: bindparam(c)
            for c in (
                "check",
                "metrics",
                "outcome",
                "error",
                "answer",
                "status",
                "started_at",
                "finished_at",
                "seconds",
                "judge",
            )
        }
    )
)


def error_phase_of(result: protocol.AttemptResult, error: str | None, *, judged_error: bool) -> str | None:
    """The phase an `error` came from (results count infrastructure errors by it); None when not an error."""
    if judged_error:
        return "judge"
    if result.outcome != "error":
        return "judge" if result.check_absent and error else None
    return result.error_phase or "runner"


def apply_result(
    session: Session, runner_id: str, result: protocol.AttemptResult, judge: dict[str, Any] | None = None
) -> Applied:
    """Store a finished attempt once; an `error` is retried. Idempotent by attempt id.

    Core statements, not the ORM: this runs once per finished attempt and is the gateway's
    hottest write (the benchmark's 5,000 results).
    """
    aid = result.attempt_id
    conn = session.connection()
    row = conn.execute(_RESULT_TARGET, {"b_id": aid}).first()
    if row is None:
        return Applied(aid, False, note="unknown attempt")
    if row.runner_id != runner_id:
        return Applied(aid, False, row.test_run_id, note="attempt not leased to this runner")
    if row.status in ("done", "cancelled"):
        return Applied(aid, False, row.test_run_id, row.outcome)
    now = utcnow()
    outcome: str = result.outcome
    error = result.error
    if judge is not None and outcome != "error":
        if judge.get("error"):
            outcome, error = "error", str(judge["error"])
        elif result.check_absent:
            outcome = "passed" if judge.get("passed") else "failed"  # a rubric-only case: the judge decides
        elif outcome == "passed" and not judge.get("passed"):
            outcome = "failed"
    elif result.check_absent and outcome != "error":
        outcome, error = "error", "this case has only a rubric and it was not judged (no judge model configured)"
    after_verdict = result.check_after.verdict if result.check_after else None
    m = result.metrics
    started = row.started_at or result.started_at or row.leased_at
    finished = result.finished_at or now
    values: dict[str, Any] = {
        "check": {
            "before": _check_text(result.check_before),
            "after": _check_text(result.check_after),
            "passed": None if after_verdict is None else after_verdict == "True",
        },
        "metrics": {
            "active_seconds": round(m.active_seconds),
            "steps": m.steps,
            "questions": m.questions,
            "approvals": m.approvals,
            "cost_cents": None,
            "phase_seconds": dict(m.phase_seconds),
            # Why the task ended (agent's side, never an error) and, for an error, the phase it came from.
            "task_end": None if result.task_end is None else {"reason": str(result.task_end),
                                                                "note": (result.task_note or None)},
            "error_phase": error_phase_of(result, error, judged_error=judge is not None and bool(judge.get("error"))),
            "machine_origin": m.machine_origin,
        },
        "outcome": outcome,
        "error": (error or "attempt failed on the runner without a reason")[:4000] if outcome == "error" else None,
        "answer": result.answer,
        "status": "done",
        "started_at": started,
        "finished_at": finished,
        "seconds": max(0.0, (finished - started).total_seconds()) if started is not None else None,
    }
    values["judge"] = None
    if judge is not None and not judge.get("error"):
        values["judge"] = {"passed": bool(judge.get("passed")), "reason": str(judge.get("reason", "")),
                           "judge_id": judge.get("judge_id"), "usage": judge.get("usage")}
    if conn.execute(_APPLY_RESULT, {**values, "b_id": aid, "b_status": row.status}).rowcount != 1:
        return Applied(aid, False, row.test_run_id, note="attempt changed while its result was applied")
    retry_id = None
    if outcome == "error":
        a = session.get(Attempt, aid)
        if a is not None:
            session.refresh(a)
            retry_id = _retry(session, a, now)
    return Applied(aid, True, row.test_run_id, outcome, retry_id)


def apply_status(session: Session, runner_id: str, msg: protocol.AttemptStatus) -> str | None:
    """Move an attempt forward (never back). Returns the new status, or None if ignored."""
    a = session.get(Attempt, msg.attempt_id)
    if a is None or a.runner_id != runner_id:
        return None
    status = msg.status
    if status == "checking" and msg.phase == "check_before":
        # The runner checks the broken machine before the task: for the API the attempt is still
        # preparing, and "running" must still be able to follow (it starts the agent).
        status = "preparing"
    if status == "done" or STATUS_ORDER.get(a.status, 9) >= STATUS_ORDER[status]:
        return None  # `done` comes with the result; a late or repeated status changes nothing
    a.status = status
    if status == "preparing" and a.started_at is None:
        a.started_at = msg.at
    return a.status


@dataclass
class Reconciled:
    resume: list[str]
    lost: list[str]  # the server's attempts the runner no longer has: errored (and retried)
    unwanted: list[str]  # the runner's attempts the server no longer wants: cancel them
    runs: set[str]
    in_task: list[str] = field(default_factory=list)  # resumed attempts in their task phase (need an agent)


def reconcile_in_flight(session: Session, runner_id: str, name: str, in_flight: Sequence[str]) -> Reconciled:
    """After a hello: keep what both sides have, error what the runner lost, cancel the rest."""
    held = set(in_flight)
    rows = session.execute(
        select(Attempt.id, Attempt.test_run_id, Attempt.status).where(
            Attempt.runner_id == runner_id, Attempt.status.in_(ACTIVE)
        )
    ).all()
    ours = {aid: run for aid, run, _ in rows}
    statuses = {aid: status for aid, _, status in rows}
    now = utcnow()
    lost, runs = [], set()
    for aid, run, status in rows:
        if aid in held:
            continue
        if status == "leased" and release_lease(session, aid, runner_id):
            continue  # offered but never started: nothing ran, so it is not an error; it goes back to the queue
        fail_attempt(
            session,
            aid,
            f"runner {name} reconnected without this attempt (it was lost on the runner, e.g. by a restart)",
            now=now,
        )
        lost.append(aid)
        runs.add(run)
    resume = [aid for aid in in_flight if aid in ours]
    unwanted = [aid for aid in in_flight if aid not in ours]
    in_task = [aid for aid in resume if statuses.get(aid) == "running"]
    return Reconciled(resume, lost, unwanted, runs, in_task)


def expire_disconnected(session: Session, grace_s: float, dead_after_s: float) -> tuple[list[str], set[str]]:
    """Attempts of runners gone longer than the grace period become errors (and are retried).

    A runner counts as gone when its socket closed (`session_id` cleared) or when its serving
    process stopped heartbeating it (`last_seen_at` older than the dead-peer bound), so a crashed
    gh-server process does not strand its runners' attempts.
    """
    now = utcnow()
    cutoff = now - timedelta(seconds=grace_s)
    stale = now - timedelta(seconds=grace_s + dead_after_s)
    holders = (
        session.execute(
            select(Attempt.runner_id).where(Attempt.status.in_(ACTIVE), Attempt.runner_id.is_not(None)).distinct()
        )
        .scalars()
        .all()
    )
    if not holders:
        return [], set()
    gone = session.scalars(
        select(Runner).where(
            Runner.id.in_(list(holders)),
            or_(
                and_(
                    Runner.session_id.is_(None), or_(Runner.disconnected_at.is_(None), Runner.disconnected_at < cutoff)
                ),
                Runner.last_seen_at < stale,
                Runner.revoked_at.is_not(None),
            ),
        )
    ).all()
    failed, runs = [], set()
    for r in gone:
        if r.revoked_at is not None:
            reason = f"runner {r.name} was deleted while the attempt ran"
        else:
            reason = f"runner {r.name} disconnected and did not come back within {grace_s:g} s"
        ids = session.execute(
            select(Attempt.id, Attempt.test_run_id).where(Attempt.runner_id == r.id, Attempt.status.in_(ACTIVE))
        ).all()
        for aid, run in ids:
            fail_attempt(session, aid, reason, now=now)
            failed.append(aid)
            runs.add(run)
        if r.session_id is not None and r.last_seen_at is not None and r.last_seen_at < stale:
            r.session_id = None
            r.disconnected_at = r.disconnected_at or now
    return failed, runs


def cancel_attempts_of_cancelled_runs(session: Session) -> list[tuple[str, str]]:
    """(attempt, runner) pairs to send `cancel` to; their rows become `cancelled` (slots free at once)."""
    rows = session.execute(
        select(Attempt.id, Attempt.runner_id, Attempt.status)
        .join(TestRun, TestRun.id == Attempt.test_run_id)
        .where(TestRun.status == "cancelled", Attempt.status.in_(UNFINISHED))
    ).all()
    out = []
    now = utcnow()
    for aid, rid, status in rows:
        session.execute(
            update(Attempt)
            .where(Attempt.id == aid, Attempt.status == status)
            .values(status="cancelled", finished_at=now)
            .execution_options(synchronize_session=False)
        )
        if status != "queued" and rid is not None:
            out.append((aid, rid))
    return out


def complete_runs(session: Session, run_ids: Iterable[str] | None = None) -> list[str]:
    """Runs with nothing left queued or running become `completed`; `test_run.completed` is enqueued."""
    q = select(TestRun).where(TestRun.status.in_(("queued", "running")))
    ids = None if run_ids is None else list(set(run_ids))
    if ids is not None:
        if not ids:
            return []
        q = q.where(TestRun.id.in_(ids))
    done = []
    for run in session.scalars(q).all():
        left = session.scalar(
            select(Attempt.id).where(Attempt.test_run_id == run.id, Attempt.status.in_(UNFINISHED)).limit(1)
        )
        if left is not None:
            continue
        has_any = session.scalar(select(Attempt.id).where(Attempt.test_run_id == run.id).limit(1))
        if has_any is None and run.status == "queued":
            continue  # still being created
        now = utcnow()
        # Guarded by the status read: when two gh-server processes see the run finish, one completes it
        # (and sends its webhook).
        res = session.execute(
            update(TestRun)
            .where(TestRun.id == run.id, TestRun.status == run.status)
            .values(status="completed", started_at=run.started_at or now, finished_at=now)
            .execution_options(synchronize_session=False)
        )
        if cast(CursorResult[Any], res).rowcount != 1:
            continue
        session.refresh(run)
        _enqueue_completed(session, run)
        done.append(run.id)
    return done


def run_summary(session: Session, run_id: str) -> tuple[dict[str, int], dict[str, float | None]]:
    """progress and pass_rate of a run, from the last attempt of each try (errors never count)."""
    rows = session.execute(
        select(Attempt.agent_id, Attempt.status, Attempt.outcome, func.count())
        .where(Attempt.test_run_id == run_id, Attempt.is_last.is_(True))
        .group_by(Attempt.agent_id, Attempt.status, Attempt.outcome)
    ).all()
    progress = {"total": 0, "queued": 0, "running": 0, "passed": 0, "failed": 0, "error": 0}
    per_agent: dict[str, list[int]] = {}
    for agent, status, outcome, n in rows:
        progress["total"] += n
        if status == "queued":
            progress["queued"] += n
        elif status in ACTIVE:
            progress["running"] += n
        elif outcome in ("passed", "failed", "error"):
            progress[outcome] += n
        tally = per_agent.setdefault(agent, [0, 0])
        if outcome == "passed":
            tally[0] += n
        if outcome in ("passed", "failed"):
            tally[1] += n
    pass_rate = {a: (round(p / t, 4) if t else None) for a, (p, t) in per_agent.items()}
    return progress, pass_rate


def _enqueue_completed(session: Session, run: TestRun) -> None:
    try:
        webhooks = importlib.import_module("gh_server.webhooks")
        from gh_server import serialize
    except ImportError:  # the API half is not installed (unit tests of this module alone)
        return
    try:
        payload = serialize.test_run(session, run)
    except Exception:  # the run must complete even if its webhook body cannot be rendered
        log.exception("could not render test_run %s for its webhook", run.id)
        progress, pass_rate = run_summary(session, run.id)
        payload = {
            "object": "test_run",
            "test_run_id": run.id,
            "status": run.status,
            "progress": progress,
            "pass_rate": pass_rate,
        }
    webhooks.enqueue(session, "test_run.completed", payload)


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------


class RunCaseCache:
    """Frozen run cases never change, so they are read once (bounded, LRU)."""

    def __init__(self, size: int = 20_000) -> None:
        self._size = size
        self._items: OrderedDict[int, RunCaseInfo] = OrderedDict()

    def get_many(self, session: Session, ids: Iterable[int]) -> dict[int, RunCaseInfo]:
        ids = list(ids)
        missing = [i for i in ids if i not in self._items]
        if missing:
            for rid, info in load_run_cases(session, missing).items():
                self._items[rid] = info
        out = {}
        for i in ids:
            found = self._items.get(i)
            if found is None:
                found = RunCaseInfo(i, {}, {}, None)  # deleted under us; it will not match any runner
            else:
                self._items.move_to_end(i)
            out[i] = found
        while len(self._items) > self._size:
            self._items.popitem(last=False)
        return out


class LeaseSink(Protocol):
    """What the scheduler needs of the gateway (kept tiny so the loop can be tested alone)."""

    def local_runner_ids(self) -> list[str]: ...

    async def send(self, runner_id: str, msg: Any) -> bool: ...


class Scheduler:
    def __init__(
        self,
        dbq: DbQueue,
        sink: LeaseSink,
        wakeup: asyncio.Event,
        *,
        grace_s: float,
        dead_after_s: float,
        judge_configured: bool = False,
        script_timeout: float = 600.0,
        poll_s: float = 1.0,
    ) -> None:
        self.dbq = dbq
        self.sink = sink
        self.wakeup = wakeup
        self.grace_s = grace_s
        self.dead_after_s = dead_after_s
        self.judge_configured = judge_configured
        self.script_timeout = script_timeout
        self.poll_s = poll_s
        self.refusals = RefusalList()
        self.cache = RunCaseCache()
        self._dirty_runs: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._last_housekeeping = 0.0
        self._last_completion_check = 0.0
        self.passes = 0
        self.on_leased: Callable[[list[float]], None] | None = None  # seconds queued, per lease sent (metrics)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="gh-scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def run_changed(self, run_id: str | None) -> None:
        """An attempt of this run finished: check (soon, coalesced) whether the run is complete."""
        if run_id:
            self._dirty_runs.add(run_id)
            self.wakeup.set()

    def poke(self) -> None:
        self.wakeup.set()

    async def refused(self, attempt_id: str, runner_id: str) -> None:
        self.refusals.add(attempt_id, runner_id)
        await self.dbq.run(lambda s: release_lease(s, attempt_id, runner_id))
        self.wakeup.set()

    async def _loop(self) -> None:
        while True:
            timeout = COMPLETION_CHECK_EVERY_S if self._dirty_runs else self.poll_s
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):  # not wait_for: it can lose a cancel on Python 3.11
                    await self.wakeup.wait()
            self.wakeup.clear()
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("scheduler pass failed; retrying on the next tick")
                await asyncio.sleep(self.poll_s)  # back off: a broken DB would otherwise spin

    async def tick(self) -> None:
        now = time.monotonic()
        if now - self._last_housekeeping >= HOUSEKEEPING_EVERY_S:
            self._last_housekeeping = now
            await self.housekeeping()
        # Whether a run is complete costs a look at its attempts: done at most a few times a second, so
        # that cost does not grow with the rate at which results arrive.
        if self._dirty_runs and now - self._last_completion_check >= COMPLETION_CHECK_EVERY_S:
            self._last_completion_check = now
            runs, self._dirty_runs = self._dirty_runs, set()
            await self.dbq.run(lambda s: complete_runs(s, runs))
        await self.lease_once()

    async def housekeeping(self) -> None:
        grace, dead = self.grace_s, self.dead_after_s
        failed, runs = await self.dbq.run(lambda s: expire_disconnected(s, grace, dead))
        if failed:
            log.info("errored %d attempts of runners gone past the grace period", len(failed))
        self._dirty_runs |= runs
        for aid, rid in await self.dbq.run(cancel_attempts_of_cancelled_runs):
            await self.sink.send(rid, protocol.Cancel(attempt_id=aid, reason="the test run was cancelled"))
        await self.dbq.run(lambda s: complete_runs(s, None))
        self.refusals.prune()

    async def lease_once(self) -> int:
        runner_ids = self.sink.local_runner_ids()
        if not runner_ids:
            return 0
        skip, cache, judge = self.refusals, self.cache, self.judge_configured
        timeout = self.script_timeout
        result = await self.dbq.run(lambda s: lease_pass(s, runner_ids, skip, cache, judge, script_timeout=timeout))
        self.passes += 1
        for run in result.failed_runs:
            self._dirty_runs.add(run)
        if result.failed_runs:
            self.wakeup.set()
        # Concurrently: one slow socket must not hold up every other runner's leases.
        oks = await asyncio.gather(*(self.sink.send(g.runner_id, result.messages[g.attempt_id]) for g in result.grants))
        undelivered = [g for g, ok in zip(result.grants, oks, strict=True) if not ok]
        if undelivered:
            await self.dbq.run(lambda s: [release_lease(s, g.attempt_id, g.runner_id) for g in undelivered])
        sent = len(result.grants) - len(undelivered)
        if self.on_leased is not None and sent:
            gone = {g.attempt_id for g in undelivered}
            self.on_leased([w for g, w in zip(result.grants, result.waited, strict=True) if g.attempt_id not in gone])
        if result.grants:
            self.wakeup.set()  # there may be more to lease (pages, other runners)
        return sent
