"""The start-state service: which runner builds a new start state, and what a finished runner job means
for its start state (status, versions, webhooks). The routers (api/start_states.py) and the gateway
(through app.py, as `ports.JobResultApplier`) call these; housekeeping is start_state_jobs.py.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gh_server import serialize, webhooks
from gh_server.errors import conflict, not_found
from gh_server.models import Attempt, RunCase, Runner, RunnerJob, StartState, StartStateVersion, utcnow
from gh_server.runner_status import is_online
from gh_server.state import ServerState
from gh_wire import protocol


def runner_for_image(session: Session, st: ServerState, image: str) -> Runner | None:
    """The runner a new start state is built on: one that advertises the image, connected to this process
    first, then online anywhere, then the most recently seen. (Attempts are matched by `attempts.matching`.)"""
    candidates = [
        r
        for r in session.scalars(select(Runner).where(Runner.revoked_at.is_(None)))
        if any(isinstance(i, dict) and i.get("name") == image for i in r.images or [])
    ]
    if not candidates:
        return None

    def score(r: Runner) -> tuple[int, int, float]:
        here = st.gateway is not None and st.gateway.connected(r.id)
        seen = r.last_seen_at.timestamp() if r.last_seen_at else 0.0
        return (int(here), int(is_online(r, st.settings)), seen)

    return max(candidates, key=score)


def from_save_point(session: Session, attempt: Attempt, save_point_id: str, name: str | None) -> StartState:
    """The start state made from one of a finished attempt's save points: its id is the save point's and
    its version 1 is the save point itself, already on the attempt's runner (gh_runner/save_points.py),
    so nothing is copied and it is `ready` at once. Made once; asked again, the same one.

    Raises:
        ApiError: 404 for a save point the attempt does not list, 409 when its runner is unknown or the
            save point was deleted after the server's `save_point_retention_hours`.
    """
    point = next((p for p in attempt.save_points or [] if p.get("save_point_id") == save_point_id), None)
    if point is None:
        raise not_found("save point", save_point_id)
    made = session.get(StartState, save_point_id)
    if made is not None:
        return made
    if point.get("collected_at"):
        raise conflict(f"save point {save_point_id} was deleted from its runner at {point['collected_at']}, "
                       "past the server's save_point_retention_hours after its try finished",
                       code="save_point_collected")
    runner = session.get(Runner, attempt.runner_id) if attempt.runner_id else None
    if runner is None:
        raise conflict(f"the runner that holds save point {save_point_id} is gone")
    rc = session.get(RunCase, attempt.run_case_id)
    ref = dict(rc.start_state or {}) if rc is not None else {}
    case = dict(rc.case or {}) if rc is not None else {}
    step = int(point.get("step") or 0)
    now = utcnow()
    ss = StartState(
        id=save_point_id, name=(name or f"{case.get('name') or attempt.test_case_id} at step {step}")[:200],
        description="", from_=str(ref.get("start_state_id") or ref.get("image") or ""),
        image=str(ref.get("image") or ""), method="save_point", status="ready", version=1, runner_id=runner.id,
        runner_labels=list(runner.labels or []),
        metadata_={"attempt_id": attempt.id, "step": step}, created_at=now, updated_at=now,
    )
    session.add(ss)
    session.add(StartStateVersion(start_state_id=ss.id, version=1, runner_id=runner.id,
                                  size_bytes=point.get("bytes"), created_at=now))
    # What the runner's next hello says too (the save point is in its state directory): leases now.
    key = (ss.id, 1)
    held = [h for h in runner.held_versions or [] if (h.get("start_state_id"), h.get("version")) != key]
    runner.held_versions = [*held, {"start_state_id": ss.id, "version": 1}]
    session.flush()
    webhooks.enqueue(session, "start_state.ready", serialize.start_state(ss))
    return ss


def apply_job_result(session: Session, runner_id: str, j: protocol.JobResult) -> bool:
    """What a finished job means for its start state (called by the gateway in its DB batch; idempotent).

    build/save ok -> a new version held by that runner, `ready`, start_state.ready; build failed ->
    `failed` with the runner's reason, start_state.failed; a failed save keeps the last good version
    (`ready`, with the error) and also sends start_state.failed; an open that failed leaves it as before.
    Returns False when the job is unknown or belongs to another runner."""
    job = session.get(RunnerJob, j.job_id)
    if job is None or (job.runner_id is not None and job.runner_id != runner_id):
        return False
    if job.status in ("done", "failed"):
        return True
    now = utcnow()
    job.status, job.error, job.finished_at = ("done" if j.ok else "failed"), j.error, now
    ss = session.get(StartState, job.start_state_id)
    if ss is None:
        return True  # deleted meanwhile: its delete job frees the disks
    event: str | None = None
    if job.op in ("build", "save"):
        if j.ok:
            version = j.version or ss.version + 1
            if session.get(StartStateVersion, (ss.id, version)) is None:
                session.add(
                    StartStateVersion(
                        start_state_id=ss.id, version=version, runner_id=runner_id, size_bytes=j.size_bytes,
                        registry_ref=(j.registry_ref or "")[:600] or None,
                    )
                )
            ss.version = max(ss.version, version)
            ss.status, ss.error, ss.runner_id = "ready", None, runner_id
            runner = session.get(Runner, runner_id)
            if runner is not None:
                # Older versions stay listed: runs pinned to them must still be leased here.
                key = (ss.id, version)
                held = [h for h in runner.held_versions or [] if (h.get("start_state_id"), h.get("version")) != key]
                runner.held_versions = [*held, {"start_state_id": ss.id, "version": version}]
            event = "start_state.ready"
        else:
            reason = j.error or "the runner gave no reason"
            if job.op == "build" or ss.version < 1:
                ss.status, ss.error = "failed", reason
            else:
                ss.status, ss.error = "ready", f"save failed: {reason}"
            event = "start_state.failed"
    elif job.op == "open" and not j.ok:
        reason = j.error or "the runner gave no reason"
        if ss.version < 1:
            ss.status, ss.error = "failed", reason
            event = "start_state.failed"
        else:
            ss.status, ss.error = "ready", f"open failed: {reason}"
    ss.updated_at = now
    if event is not None:
        session.flush()
        webhooks.enqueue(session, event, serialize.start_state(ss))
    return True
