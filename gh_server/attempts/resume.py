"""An attempt whose runner was lost mid-task goes on from its last save point (issue 51, docs/agents.md
"Save points"), the same attempt, not a retry.

The runner tells the server of each save point as it is made (`save_point_made`: `record_save_point`
keeps it on the attempt), and again once it pushed it to its registry, where it has one (with its
`registry_ref`). When the attempt's runner is lost, what would have been an error becomes a lease with
`restore`: the machine from a save point, the task at its step and task time, the replay going on after
its last frame.

- `resume_lease`: the runner came back without the attempt (a crash, a restart) and still holds one of
  its save points: on that runner.
- `resume_elsewhere`: the runner did not come back within its grace: on another connected runner that
  pulls from the registry a save point was pushed to (and has the image, and a free slot).

The row stays `running` all along (for the API the task never stopped), and its agent, on the server,
goes on: its clock goes back to the save point's task time, its requests follow the attempt to its
runner, and its next action is refused `machine_restored` by the runner, so it looks again.

Not resumed (the caller errors it, retried, as before): an attempt that was not in its task, one
with no save point that runner holds (or, elsewhere, none in a registry a free runner pulls from), a
runner whose hello did not say `restores`, and an attempt already resumed `MAX_RESUMES` times (a save
point that brings the runner down with it must not loop for ever).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from gh_server.agents.grants import moved
from gh_server.attempts.lease import Grant, RunCaseInfo, SavePointPolicy, lease_message, load_runner_caps, needs_scores
from gh_server.attempts.matching import Candidate, pick_runner, registry_of
from gh_server.attempts.states import fail_attempt
from gh_server.models import Attempt, ReplayFrame, RunCase, utcnow
from gh_wire import protocol
from gh_wire.vocab import AttemptStatus

MAX_RESUMES = 5
MAX_LISTED = 50  # save points listed on an attempt at most (Lease.save_points_kept's bound)


def record_save_point(session: Session, runner_id: str, msg: protocol.SavePointMade) -> bool:
    """Keep a save point on its attempt, while the attempt runs on that runner (a late message from a
    runner that lost the attempt changes nothing). A save point already listed is replaced."""
    a = session.get(Attempt, msg.attempt_id)
    if a is None or a.runner_id != runner_id or a.status not in (AttemptStatus.RUNNING, AttemptStatus.CHECKING):
        return False
    point = msg.save_point.model_dump(mode="json")
    kept = [dict(p) for p in a.save_points or [] if p.get("save_point_id") != point["save_point_id"]]
    # Bounded before it is stored: a runner keeps at most `save_points_kept` (le=50) of an attempt, so a
    # longer list is a runner telling of more than it keeps; the oldest go.
    a.save_points = [*kept, point][-MAX_LISTED:]
    return True


def resume_lease(session: Session, attempt_id: str, runner_id: str, held: Collection[tuple[str, int]], *,
                 script_timeout: float, policy: SavePointPolicy) -> protocol.Lease | None:
    """The lease that resumes `attempt_id` on `runner_id`, the runner it was lost on, from the newest save
    point it holds (`held`: its hello's start-state versions), with the row marked resumed; None when it
    cannot be resumed."""
    a = session.get(Attempt, attempt_id)
    if a is None or a.runner_id != runner_id or not _resumable(a):
        return None
    points = _points(a)
    point = next((p for p in reversed(points) if (p.save_point_id, 1) in held), None)
    if point is None:
        return None
    # All of them stay listed, those made after this one too: each is a machine the attempt was in (a
    # start state can be made from it), and the runner deletes the oldest past `save_points_kept`.
    return _restore(session, a, runner_id, point, points, script_timeout, policy)


def resume_elsewhere(session: Session, attempt_id: str, runner_ids: Sequence[str], skip: Callable[[str, str], bool],
                     *, script_timeout: float, policy: SavePointPolicy) -> tuple[str, protocol.Lease] | None:
    """The runner and lease that resume `attempt_id`, whose runner is gone past its grace, on another of
    `runner_ids` (connected, with free slots), from the newest save point pushed to a registry that runner
    pulls from: it pulls the save point before it accepts (gh_runner/library.py), as any start-state
    version it lacks. The row moves to that runner (and its agent's grants with it). None when no runner
    can take it now: the caller errors it, as before."""
    a = session.get(Attempt, attempt_id)
    if a is None or not _resumable(a):
        return None
    rc = session.execute(select(RunCase.case, RunCase.start_state).where(RunCase.id == a.run_case_id)).first()
    if rc is None:
        return None
    image = str((rc[1] or {}).get("image") or "")
    runners = [r for r in load_runner_caps(session, [rid for rid in runner_ids if rid != a.runner_id]) if r.free > 0]
    for point in reversed(_points(a)):
        registry = registry_of(point.registry_ref)
        if registry is None:
            continue
        source = {"kind": "state", "image": image, "start_state_id": point.save_point_id, "version": 1,
                  "registry": registry}
        chosen = pick_runner(Candidate(a.id, a.runs_on, source, None, needs_scores(dict(rc[0] or {}))), runners, skip)
        if chosen is None:
            continue
        # Only this one goes along: the others stay on the lost runner's disk, which the new one never reads.
        lease = _restore(session, a, chosen.runner_id, point, [point], script_timeout, policy)
        session.execute(update(Attempt).where(Attempt.id == a.id).values(runner_id=chosen.runner_id, leased_at=utcnow())
                        .execution_options(synchronize_session=False))
        moved(session, a.id, chosen.runner_id)
        return chosen.runner_id, lease
    return None


def _resumable(a: Attempt) -> bool:
    """In its task (a save point is made only there), and not resumed too often already."""
    return a.status == AttemptStatus.RUNNING and int((a.metrics or {}).get("resumed") or 0) < MAX_RESUMES


def _points(a: Attempt) -> list[protocol.SavePoint]:
    return [protocol.SavePoint.model_validate(p) for p in a.save_points or []]


def _restore(session: Session, a: Attempt, runner_id: str, point: protocol.SavePoint, kept: list[protocol.SavePoint],
             script_timeout: float, policy: SavePointPolicy) -> protocol.Lease:
    """The attempt's lease again, from `point`, and the row marked resumed once more."""
    rc = session.execute(select(RunCase.case, RunCase.start_state).where(RunCase.id == a.run_case_id)).one()
    case, start_state = dict(rc[0] or {}), dict(rc[1] or {})
    resumed = int((a.metrics or {}).get("resumed") or 0) + 1
    next_seq = session.scalar(select(func.max(ReplayFrame.seq)).where(ReplayFrame.attempt_id == a.id))
    grant = Grant(attempt_id=a.id, runner_id=runner_id, test_run_id=a.test_run_id, agent_id=a.agent_id,
                  try_number=a.try_number, run_case_id=a.run_case_id)
    lease = lease_message(grant, RunCaseInfo(id=a.run_case_id, case=case, start_state=start_state, runner_id=None),
                          script_timeout, policy)
    # The machine is the save point's: a start-state version (gh_runner/save_points.py names it so).
    lease.start_state = protocol.StartStateRef(kind="state", image=str(start_state.get("image") or ""),
                                               start_state_id=point.save_point_id, version=1)
    lease.restore = protocol.Restore(save_point=point, kept=kept, resumed=resumed,
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
