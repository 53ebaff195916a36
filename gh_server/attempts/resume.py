"""An attempt whose runner was lost mid-task goes on from its last save point (issue 51, docs/agents.md
"Save points"), the same attempt, not a retry.

The runner tells the server of each save point as it is made (`save_point_made`: `record_save_point`
keeps it on the attempt). When the runner comes back without the attempt (a crash, a restart) and still
holds one of them, `resume_lease` turns what would have been an error into a lease with `restore`: the
machine from that save point, the task at its step and task time, the replay going on after its last
frame. The row stays `running` all along (for the API the task never stopped), and its agent, on the
server, goes on: its clock goes back to the save point's task time, and its next action is refused
`machine_restored` by the runner, so it looks again.

Not resumed (the caller errors it, retried, as before): an attempt that was not in its task, one
with no save point the runner holds, a runner whose hello did not say `restores`, and an attempt
already resumed `MAX_RESUMES` times (a save point that brings the runner down with it must not
loop for ever).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gh_server.attempts.lease import Grant, RunCaseInfo, SavePointPolicy, lease_message
from gh_server.attempts.states import fail_attempt
from gh_server.models import Attempt, ReplayFrame, RunCase
from gh_wire import protocol
from gh_wire.vocab import AttemptStatus

MAX_RESUMES = 5


def record_save_point(session: Session, runner_id: str, msg: protocol.SavePointMade) -> bool:
    """Keep a save point on its attempt, while the attempt runs on that runner (a late message from a
    runner that lost the attempt changes nothing). A save point already listed is replaced."""
    a = session.get(Attempt, msg.attempt_id)
    if a is None or a.runner_id != runner_id or a.status not in (AttemptStatus.RUNNING, AttemptStatus.CHECKING):
        return False
    point = msg.save_point.model_dump(mode="json")
    kept = [dict(p) for p in a.save_points or [] if p.get("save_point_id") != point["save_point_id"]]
    a.save_points = [*kept, point]
    return True


def resume_lease(session: Session, attempt_id: str, runner_id: str, held: Collection[tuple[str, int]], *,
                 script_timeout: float, policy: SavePointPolicy) -> protocol.Lease | None:
    """The lease that resumes `attempt_id` on `runner_id` from the newest save point it holds (`held`:
    its hello's start-state versions), with the row marked resumed; None when it cannot be resumed."""
    a = session.get(Attempt, attempt_id)
    if a is None or a.runner_id != runner_id or a.status != AttemptStatus.RUNNING:
        return None
    resumed = int((a.metrics or {}).get("resumed") or 0) + 1
    if resumed > MAX_RESUMES:
        return None
    points = [protocol.SavePoint.model_validate(p) for p in a.save_points or []]
    point = next((p for p in reversed(points) if (p.save_point_id, 1) in held), None)
    rc = session.execute(select(RunCase.case, RunCase.start_state).where(RunCase.id == a.run_case_id)).first()
    if point is None or rc is None:
        return None
    case, start_state = dict(rc[0] or {}), dict(rc[1] or {})
    next_seq = session.scalar(select(func.max(ReplayFrame.seq)).where(ReplayFrame.attempt_id == attempt_id))
    grant = Grant(attempt_id=a.id, runner_id=runner_id, test_run_id=a.test_run_id, agent_id=a.agent_id,
                  try_number=a.try_number, run_case_id=a.run_case_id)
    lease = lease_message(grant, RunCaseInfo(id=a.run_case_id, case=case, start_state=start_state, runner_id=None),
                          script_timeout, policy)
    # The machine is the save point's: a start-state version this runner holds (save_points.py names it so).
    lease.start_state = protocol.StartStateRef(kind="state", image=str(start_state.get("image") or ""),
                                               start_state_id=point.save_point_id, version=1)
    # All of them stay listed, those made after this one too: each is a machine the attempt was in (a
    # start state can be made from it), and the runner deletes the oldest past `save_points_kept`.
    lease.restore = protocol.Restore(save_point=point, kept=points, resumed=resumed,
                                     replay_seq=0 if next_seq is None else int(next_seq) + 1)
    metrics: dict[str, Any] = dict(a.metrics or {})
    metrics["resumed"] = resumed
    a.metrics = metrics
    return lease


def restore_refused(session: Session, attempt_id: str, runner_id: str, reason: str) -> str | None:
    """The runner refused the lease that resumes an attempt (it could not make the machine from the save
    point): the attempt is the error it would have been without one, retried. Its run's id, or None when
    the refused lease was not a resume (the row is not running on that runner)."""
    a = session.get(Attempt, attempt_id)
    if a is None or a.runner_id != runner_id or a.status != AttemptStatus.RUNNING:
        return None
    run = a.test_run_id
    failed = fail_attempt(session, attempt_id, f"the runner was lost and could not go on from the attempt's save "
                                                f"point: {reason}"[:4000], expect_status=AttemptStatus.RUNNING)
    return run if failed is not None else None
