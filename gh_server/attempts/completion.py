"""Run completion: a run with no unfinished attempt becomes `completed` (once, guarded by its status) and
its `test_run.completed` webhook is enqueued, and a run that tried noop and reference records its cases'
validation; `run_summary` is its progress and pass rate.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, cast

from sqlalchemy import CursorResult, func, select, update
from sqlalchemy.orm import Session

from gh_server import serialize, validation, webhooks
from gh_server.counts import counted_as, new_progress
from gh_server.models import Attempt, TestRun, utcnow
from gh_wire.vocab import ACTIVE, UNFINISHED, AttemptStatus

log = logging.getLogger(__name__)


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
        if validation.can_validate(run):  # noop and reference both ran: record what it says of each case
            validation.run_validation(session, run, record=True)
        _enqueue_completed(session, run)
        done.append(run.id)
    return done


def run_summary(session: Session, run_id: str) -> tuple[dict[str, int], dict[str, float | None]]:
    """progress and pass_rate of a run, from the last attempt of each try (errors and assisted tries never
    count)."""
    rows = session.execute(
        select(Attempt.agent_id, Attempt.status, Attempt.outcome, Attempt.assisted, func.count())
        .where(Attempt.test_run_id == run_id, Attempt.is_last.is_(True))
        .group_by(Attempt.agent_id, Attempt.status, Attempt.outcome, Attempt.assisted)
    ).all()
    progress = new_progress()
    per_agent: dict[str, list[int]] = {}
    for agent, status, outcome, assisted, n in rows:
        progress["total"] += n
        counted = counted_as(status, outcome, assisted)
        if status == AttemptStatus.QUEUED:
            progress["queued"] += n
        elif status in ACTIVE:
            progress["running"] += n
        elif counted is not None:
            progress[counted] += n
        tally = per_agent.setdefault(agent, [0, 0])
        if counted == "passed":
            tally[0] += n
        if counted in ("passed", "failed"):
            tally[1] += n
    pass_rate = {a: (round(p / t, 4) if t else None) for a, (p, t) in per_agent.items()}
    return progress, pass_rate


def _enqueue_completed(session: Session, run: TestRun) -> None:
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
