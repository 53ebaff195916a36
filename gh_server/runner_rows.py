"""The rows a runner's session changes (the gateway's DB jobs: plain data in, plain data out, run in its
`DbQueue`): the runner row (token, hello, liveness, disconnect), its replay frames, its queued jobs.
"""

from __future__ import annotations

import hmac
from typing import Any, cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from gh_server.auth import hash_secret
from gh_server.models import Attempt, Runner, RunnerJob, utcnow
from gh_server.models import ReplayFrame as ReplayRow
from gh_wire import protocol


def runner_by_token(session: Session, token: str) -> tuple[str, str] | None:
    digest = hash_secret(token)
    row = session.execute(
        select(Runner.id, Runner.name, Runner.token_hash).where(
            Runner.token_hash == digest, Runner.revoked_at.is_(None)
        )
    ).first()
    if row is None or not hmac.compare_digest(row.token_hash, digest):
        return None
    return row.id, row.name


def record_hello(session: Session, runner_id: str, session_id: str, h: protocol.Hello) -> str | None:
    r = session.get(Runner, runner_id)
    if r is None or r.revoked_at is not None:
        return None
    now = utcnow()
    r.labels = list(dict.fromkeys(h.labels))
    r.slots = h.slots
    r.busy = len(h.in_flight)
    r.images = [i.model_dump(exclude_defaults=True) for i in h.images]  # `pooled` only when set
    r.held_versions = [v.model_dump(exclude_defaults=True) for v in h.start_states]
    r.oci_registry = (h.registry or "")[:300] or None  # the registry it pulls start states from
    r.version = h.version[:64]
    r.scores = h.scores
    r.session_id = session_id
    r.connected_at = now
    r.last_seen_at = now
    r.disconnected_at = None
    r.paused = None  # its heartbeats say so again if it still is
    return r.name


def touch(session: Session, runner_id: str, session_id: str, busy: int | None, paused: str | None = None) -> str:
    """Liveness (and whether the runner paused itself). "ok", or why this session must end: "revoked"
    (deleted, possibly through another gh-server process) or "replaced" (the runner connected again,
    possibly to another process)."""
    values: dict[str, Any] = {"last_seen_at": utcnow(), "paused": paused}
    if busy is not None:
        values["busy"] = busy
    res = session.execute(
        update(Runner)
        .where(Runner.id == runner_id, Runner.session_id == session_id, Runner.revoked_at.is_(None))
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if cast(CursorResult[Any], res).rowcount == 1:
        return "ok"
    revoked = session.scalar(select(Runner.revoked_at).where(Runner.id == runner_id))
    exists = session.scalar(select(Runner.id).where(Runner.id == runner_id))
    return "revoked" if exists is None or revoked is not None else "replaced"


def record_disconnect(session: Session, runner_id: str, session_id: str) -> None:
    session.execute(
        update(Runner)
        .where(Runner.id == runner_id, Runner.session_id == session_id)
        .values(session_id=None, disconnected_at=utcnow(), busy=0)
        .execution_options(synchronize_session=False)
    )


def store_frame(session: Session, runner_id: str, f: protocol.ReplayFrame, png: bytes) -> bool:
    owner = session.scalar(select(Attempt.runner_id).where(Attempt.id == f.attempt_id))
    if owner != runner_id:
        return False
    values = {"attempt_id": f.attempt_id, "seq": f.seq, "at": f.at, "label": f.label[:32], "event": f.event, "png": png}
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        stmt: Any = postgresql.insert(ReplayRow).values(**values).on_conflict_do_nothing()
    else:
        stmt = sqlite.insert(ReplayRow).values(**values).on_conflict_do_nothing()
    session.execute(stmt)
    return True


def queued_jobs(session: Session, runner_id: str) -> list[tuple[str, dict[str, Any]]]:
    rows = session.execute(
        select(RunnerJob.id, RunnerJob.payload)
        .where(RunnerJob.runner_id == runner_id, RunnerJob.status == "queued")
        .order_by(RunnerJob.created_at)
    ).all()
    return [(jid, dict(payload or {})) for jid, payload in rows]


def mark_job_sent(session: Session, job_id: str) -> None:
    session.execute(
        update(RunnerJob)
        .where(RunnerJob.id == job_id, RunnerJob.status == "queued")
        .values(status="sent")
        .execution_options(synchronize_session=False)
    )
