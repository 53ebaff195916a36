"""The attempt state machine, in SQL: which status may follow which (`TRANSITIONS`, the one table), and
every row change that moves an attempt by it, each guarded by the status it read.

A move is `UPDATE attempts SET status=<to> ... WHERE id=? AND status=<from>`, so several gh-server
processes on one database can share the work: of two that try the same move, one changes the row.
Each function takes a Session and returns plain data; the caller commits.

    queued --lease--> leased --(runner statuses)--> preparing -> running -> checking
      ^                  |                                                       |
      +----release-------+        any unfinished status --fail / result--> done  (an error is retried:
                                  any unfinished status --run cancelled--> cancelled   a new queued row)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, and_, or_, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from gh_server.models import Attempt, Runner, TestRun, new_id, utcnow
from gh_wire import protocol
from gh_wire.vocab import ACTIVE, FINISHED, UNFINISHED, AttemptStatus, Outcome

S = AttemptStatus
MAX_ATTEMPTS_PER_TRY = 3  # the first attempt and 2 retries

# Which status may follow which. `done` is reached from any unfinished status (a result, or an error:
# a queued attempt errors when it cannot be leased at all); `cancelled` likewise; only a lease that has
# not started goes back to the queue.
TRANSITIONS: Mapping[AttemptStatus, frozenset[AttemptStatus]] = {
    S.QUEUED: frozenset({S.LEASED, S.DONE, S.CANCELLED}),
    S.LEASED: frozenset({S.QUEUED, S.PREPARING, S.RUNNING, S.CHECKING, S.DONE, S.CANCELLED}),
    S.PREPARING: frozenset({S.RUNNING, S.CHECKING, S.DONE, S.CANCELLED}),
    S.RUNNING: frozenset({S.CHECKING, S.DONE, S.CANCELLED}),
    S.CHECKING: frozenset({S.DONE, S.CANCELLED}),
    S.DONE: frozenset(),
    S.CANCELLED: frozenset(),
}


def may(frm: str, to: str) -> bool:
    """Whether an attempt in status `frm` may move to `to` (an unknown status may move nowhere)."""
    try:
        return AttemptStatus(to) in TRANSITIONS[AttemptStatus(frm)]
    except ValueError:
        return False


def move(session: Session, attempt_id: str, frm: str, to: AttemptStatus, /, *,
         where: Iterable[Any] = (), **values: Any) -> bool:
    """The one status-guarded row change: `frm` -> `to` (by `TRANSITIONS`) with `values`. False when the
    row is no longer in `frm` (another process moved it) or the move is not in the table."""
    if not may(frm, to):
        return False
    res = session.execute(
        update(Attempt)
        .where(Attempt.id == attempt_id, Attempt.status == frm, *where)
        .values(status=to, **values)
        .execution_options(synchronize_session=False)
    )
    return cast(CursorResult[Any], res).rowcount == 1


def release_lease(session: Session, attempt_id: str, runner_id: str) -> bool:
    """Back to the queue (a refused or undeliverable lease). False if it moved on meanwhile."""
    return move(session, attempt_id, S.LEASED, S.QUEUED, where=[Attempt.runner_id == runner_id],
                runner_id=None, leased_at=None)


def retry_count(session: Session, attempt: Attempt) -> int:
    """How many attempts this try has had, following the retry_of chain back to the first."""
    n, prev = 1, attempt.retry_of
    while prev is not None and n <= MAX_ATTEMPTS_PER_TRY + 1:
        n += 1
        prev = session.scalar(select(Attempt.retry_of).where(Attempt.id == prev))
    return n


def case_error_repeated(session: Session, a: Attempt) -> bool:
    """The rule for the case's own errors: one fresh machine more, not two. An attempt that ended in a
    `case` error is retried once; when that retry (a fresh machine) ends in a `case` error in the same
    phase, the case is at fault whatever the machine, so the try ends there. Errors of ours keep both
    retries."""
    mine = a.metrics or {}
    if mine.get("error_cause") != "case" or a.retry_of is None:
        return False
    before = session.get(Attempt, a.retry_of)
    if before is None or before.outcome != "error":
        return False
    theirs = before.metrics or {}
    return theirs.get("error_cause") == "case" and theirs.get("error_phase") == mine.get("error_phase")


def queue_retry(session: Session, a: Attempt, now: datetime) -> str | None:
    """Queue the next attempt of `a`'s try (an error is retried up to 2 times; a `case` error that
    repeats, once: `case_error_repeated`). Returns its id, if any."""
    if retry_count(session, a) >= MAX_ATTEMPTS_PER_TRY or case_error_repeated(session, a):
        return None
    run_status = session.scalar(select(TestRun.status).where(TestRun.id == a.test_run_id))
    if run_status == "cancelled":  # a TestRun status
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
        status=S.QUEUED,
        runs_on=a.runs_on,
        required_runner_id=a.required_runner_id,
        created_at=now,
    )
    a.is_last = False
    session.add(new)
    return new.id


@dataclass(frozen=True)
class Failed:
    """An attempt fail_attempt made an `error`, and the retry it queued (None: not retried)."""

    retry_id: str | None


def fail_attempt(
    session: Session,
    attempt_id: str,
    error: str,
    *,
    retry: bool = True,
    now: datetime | None = None,
    expect_status: str | Sequence[str] | None = None,
    phase: str = "runner",
) -> Failed | None:
    """Make an unfinished attempt an `error` and queue its retry (unless `retry` is False, or it was the
    case's last try). None when the attempt was not failed here: finished, or moved on meanwhile.

    The UPDATE is guarded by the status it read, so two gh-server processes expiring the same
    runner's attempts cannot both retry one.
    """
    now = now or utcnow()
    a = session.get(Attempt, attempt_id)
    if a is None or a.status in FINISHED:
        return None
    if expect_status is not None:
        allowed = (expect_status,) if isinstance(expect_status, str) else tuple(expect_status)
        if a.status not in allowed:
            return None
    # The phase the error came from, as a result would have named it: by default the runner's side was
    # lost (the results page counts these under `runner`); the attempt also says the status it was in.
    metrics = {**(a.metrics or {}), "error_phase": phase, "lost_in_status": a.status}
    if not move(session, attempt_id, a.status, S.DONE, outcome=Outcome.ERROR, error=error[:4000], finished_at=now,
                metrics=metrics):
        return None
    session.refresh(a)
    return Failed(queue_retry(session, a, now) if retry else None)


def apply_status(session: Session, runner_id: str, msg: protocol.AttemptStatus) -> str | None:
    """Move an attempt forward (never back). Returns the new status, or None if ignored."""
    a = session.get(Attempt, msg.attempt_id)
    if a is None or a.runner_id != runner_id:
        return None
    status = AttemptStatus(msg.status)
    if status == S.CHECKING and msg.phase == "check_before":
        # The runner checks the broken machine before the task: for the API the attempt is still
        # preparing, and "running" must still be able to follow (it starts the agent).
        status = S.PREPARING
    if status == S.DONE or not may(a.status, status):
        return None  # `done` comes with the result; a late or repeated status changes nothing
    values: dict[str, Any] = {"started_at": msg.at} if status == S.PREPARING and a.started_at is None else {}
    if not move(session, a.id, a.status, status, **values):
        return None
    # The row moved in SQL: keep the loaded object the same, for the next job of this DB batch.
    for key, value in {"status": status, **values}.items():
        set_committed_value(a, key, value)
    return status


@dataclass
class Reconciled:
    resume: list[str]
    lost: list[str]  # the server's attempts the runner no longer has: errored (and retried)
    unwanted: list[str]  # the runner's attempts the server no longer wants: cancel them
    runs: set[str]
    in_task: list[str] = field(default_factory=list)  # resumed attempts in their task phase (need an agent)
    # Of those, the ones whose task began while the server did not hear it (the `running` status came
    # only now, in the hello): no agent was ever started for them. Attempt id -> when the task began.
    task_unheard: dict[str, datetime] = field(default_factory=dict)
    # The server's attempts the runner no longer has that go on from a save point it holds: each its
    # lease with `restore` (gh_server/attempts/resume.py), to send once the runner is welcomed.
    restored: list[protocol.Lease] = field(default_factory=list)


def reconcile_in_flight(
    session: Session, runner_id: str, name: str, in_flight: Sequence[str],
    phases: Sequence[protocol.InFlightPhase] = (),
    restore: Callable[[Session, str], protocol.Lease | None] | None = None,
) -> Reconciled:
    """After a hello: keep what both sides have, error what the runner lost (unless `restore` gives
    the lease that makes it go on from a save point), cancel the rest, and catch up on the statuses
    the runner sent while the link was down (`phases`, from the hello)."""
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
    restored: list[protocol.Lease] = []
    for aid, run, status in rows:
        if aid in held:
            continue
        if status == S.LEASED and release_lease(session, aid, runner_id):
            continue  # offered but never started: nothing ran, so it is not an error; it goes back to the queue
        if restore is not None and (lease := restore(session, aid)) is not None:
            restored.append(lease)  # the same attempt goes on, from its save point
            continue
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
    reported = {p.attempt_id: p for p in phases if p.attempt_id in ours and p.attempt_id in held}
    unheard: dict[str, datetime] = {}
    for aid, p in reported.items():
        seen_running = statuses.get(aid) == S.RUNNING
        new = apply_status(session, runner_id, protocol.AttemptStatus(attempt_id=aid, status=p.status,
                                                                      phase=p.phase, at=p.at))
        if new is not None:
            statuses[aid] = new
        if p.status == S.RUNNING and not seen_running:
            unheard[aid] = p.at
    # The runner's word wins where it gave one (the database may be a status behind); an older runner
    # that sends no phases is judged by the database alone, as before.
    in_task = [aid for aid in resume
               if (reported[aid].status == S.RUNNING if aid in reported else statuses.get(aid) == S.RUNNING)]
    return Reconciled(resume, lost, unwanted, runs, in_task, {a: t for a, t in unheard.items() if a in in_task},
                      restored)


@dataclass
class Expired:
    failed: list[str] = field(default_factory=list)  # errored (and retried)
    runs: set[str] = field(default_factory=set)  # the runs of those
    # Gone on on another runner from a save point (gh_server/attempts/resume.py): (runner id, its lease).
    moved: list[tuple[str, protocol.Lease]] = field(default_factory=list)


def expire_disconnected(session: Session, grace_s: float, dead_after_s: float,
                        restore: Callable[[Session, str], tuple[str, protocol.Lease] | None] | None = None) -> Expired:
    """Attempts of runners gone longer than the grace period become errors (and are retried), but those
    `restore` moves to another runner, from a save point.

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
        return Expired()
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
    out = Expired()
    for r in gone:
        if r.revoked_at is not None:
            reason = f"runner {r.name} was deleted while the attempt ran"
        else:
            reason = f"runner {r.name} disconnected and did not come back within {grace_s:g} s"
        ids = session.execute(
            select(Attempt.id, Attempt.test_run_id).where(Attempt.runner_id == r.id, Attempt.status.in_(ACTIVE))
        ).all()
        for aid, run in ids:
            if r.revoked_at is None and restore is not None and (to := restore(session, aid)) is not None:
                out.moved.append(to)
                continue
            fail_attempt(session, aid, reason, now=now)
            out.failed.append(aid)
            out.runs.add(run)
        if r.session_id is not None and r.last_seen_at is not None and r.last_seen_at < stale:
            r.session_id = None
            r.disconnected_at = r.disconnected_at or now
    return out


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
        move(session, aid, status, S.CANCELLED, finished_at=now)
        if status != S.QUEUED and rid is not None:
            out.append((aid, rid))
    return out


