"""Start states over time: open machines that closed themselves, and old versions collected.

`gh_server.api.start_states` moves a start state when someone asks (open, save, close) and when a job
ends; this module does what nobody asks for:

- idle close: an open machine without input for `idle_seconds` (2 hours unless configured) is closed
  like `POST .../close` would (a hand-made state never saved is deleted);
- version collection: a version older than the current one stays on its runner while any queued or
  running attempt, any unfinished run, or any unfinished job (a build `from` it) pins it; after that a
  `delete` job for that one version goes to its runner.

Every change is an UPDATE/DELETE guarded by the state it expects, so several gh-server processes on one
database never close or collect the same thing twice.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from typing import Any

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.orm import Session

from gh_server import serialize
from gh_server.models import Attempt, RunCase, Runner, RunnerJob, StartState, StartStateVersion, TestRun, utcnow
from gh_server.state import ServerState

log = logging.getLogger("gh_server.start_state_jobs")

DEFAULT_IDLE_SECONDS = 7200.0
DEFAULT_INTERVAL_SECONDS = 15.0
ACTIVE_ATTEMPT = ("queued", "leased", "preparing", "running", "checking")
ACTIVE_RUN = ("queued", "running")
ACTIVE_JOB = ("queued", "sent")


def _setting(st: ServerState, name: str, default: float) -> float:
    # Settings first (when the field exists there), then a per-process override in extras (tests, embedding).
    value: Any = st.extras.get(name)
    if value is None:
        value = getattr(st.settings, name, None)
    return float(value) if value is not None else default


def idle_seconds(st: ServerState) -> float:
    return _setting(st, "start_state_idle_seconds", DEFAULT_IDLE_SECONDS)


def interval_seconds(st: ServerState) -> float:
    return _setting(st, "start_state_housekeeping_seconds", DEFAULT_INTERVAL_SECONDS)


# -- idle close ---------------------------------------------------------------------------------


def close_idle(session: Session, idle: float, now: datetime | None = None) -> list[str]:
    """Close every open start state whose last input (or its opening) is older than `idle` seconds.

    Returns the ids of the `close` jobs queued for their runners."""
    from gh_server.api.start_states import _job

    now = now or utcnow()
    cutoff = now - timedelta(seconds=idle)
    last = func.coalesce(StartState.last_input_at, StartState.opened_at)
    guard = (StartState.status == "open", last < cutoff)
    jobs: list[str] = []
    for ss in session.scalars(select(StartState).where(*guard)):
        if ss.version < 1:
            gone = session.execute(
                delete(StartState).where(StartState.id == ss.id, StartState.version < 1, *guard),
                execution_options={"synchronize_session": False},
            )
            if gone.rowcount != 1:  # type: ignore[attr-defined]
                continue
            log.info("start state %s closed after %.0f s without input; never saved, so deleted", ss.id, idle)
        else:
            done = session.execute(
                update(StartState)
                .where(StartState.id == ss.id, *guard)
                .values(
                    status="ready",
                    error=f"closed after {idle:.0f} s without input; unsaved changes were discarded",
                    updated_at=now,
                )
                .execution_options(synchronize_session=False)
            )
            if done.rowcount != 1:  # type: ignore[attr-defined]
                continue
            log.info("start state %s closed after %.0f s without input", ss.id, idle)
        jobs.append(_job(session, ss, "close", ss.runner_id).id)
    return jobs


# -- version collection -------------------------------------------------------------------------


def pinned_versions(session: Session) -> set[tuple[str, int]]:
    """(start_state_id, version) pairs something still needs: unfinished runs and attempts, builds from it."""
    active_runs = select(TestRun.id).where(TestRun.status.in_(ACTIVE_RUN))
    active_cases = select(Attempt.run_case_id).where(Attempt.status.in_(ACTIVE_ATTEMPT))
    refs: list[dict[str, Any]] = list(
        session.scalars(
            select(RunCase.start_state).where(
                or_(RunCase.test_run_id.in_(active_runs), RunCase.id.in_(active_cases))
            )
        )
    )
    for payload in session.scalars(
        select(RunnerJob.payload).where(RunnerJob.status.in_(ACTIVE_JOB), RunnerJob.op.in_(("build", "open")))
    ):
        refs.append((payload or {}).get("source") or {})
    out: set[tuple[str, int]] = set()
    for ref in refs:
        if isinstance(ref, dict) and ref.get("kind") == "state" and ref.get("start_state_id"):
            out.add((str(ref["start_state_id"]), int(ref.get("version") or 0)))
    return out


def collect_versions(session: Session, now: datetime | None = None) -> list[str]:
    """Queue a `delete` job for every old, unpinned version; returns the job ids."""
    from gh_server.api.start_states import _job

    now = now or utcnow()
    old = session.execute(
        select(StartStateVersion, StartState)
        .join(StartState, StartState.id == StartStateVersion.start_state_id)
        .where(StartStateVersion.deleted_at.is_(None), StartStateVersion.version < StartState.version)
    ).all()
    if not old:
        return []
    pinned = pinned_versions(session)
    jobs: list[str] = []
    for v, ss in old:
        key = (v.start_state_id, v.version)
        if key in pinned:
            continue
        marked = session.execute(
            update(StartStateVersion)
            .where(
                StartStateVersion.start_state_id == v.start_state_id,
                StartStateVersion.version == v.version,
                StartStateVersion.deleted_at.is_(None),
            )
            .values(deleted_at=now)
            .execution_options(synchronize_session=False)
        )
        if marked.rowcount != 1:  # type: ignore[attr-defined]
            continue
        runner = session.get(Runner, v.runner_id)
        if runner is not None and runner.held_versions:
            # No new lease may count on it from now on.
            runner.held_versions = [
                h for h in runner.held_versions if (h.get("start_state_id"), h.get("version")) != key
            ]
        jobs.append(_job(session, ss, "delete", v.runner_id, version=v.version).id)
        log.info("start state %s version %d is no longer pinned; deleting it on runner %s", *key, v.runner_id)
    return jobs


# -- the task -----------------------------------------------------------------------------------


async def housekeeping_once(st: ServerState) -> list[str]:
    """One pass (idle close, then collection); returns the jobs it queued, already sent when possible."""
    from gh_server.api.start_states import _dispatch

    idle = idle_seconds(st)

    def work() -> list[str]:
        with st.db.begin() as s:
            jobs = close_idle(s, idle)
        with st.db.begin() as s:
            jobs += collect_versions(s)
        return jobs

    jobs = await run_in_threadpool(work)
    if jobs:
        await _dispatch(st, jobs)
    return jobs


async def housekeeping(st: ServerState) -> None:
    while True:
        try:
            await housekeeping_once(st)
        except Exception:  # a bad pass (database briefly away) must not end the task
            log.exception("start-state housekeeping failed; trying again next round")
        await asyncio.sleep(interval_seconds(st))


def install(app: FastAPI, st: ServerState) -> None:
    # The open view's expires_at is computed where start states are serialized.
    serialize.START_STATE_IDLE_SECONDS = idle_seconds(st)
    st.background.append(housekeeping)
