"""Result intake: a runner's `attempt_result` becomes the attempt's outcome, decided here and only here.

- `rubric_of`: whether a case is judged by a model (the one rubric test);
- `ResultIntake.receive`: whether this result goes to the judge (off the gateway's read loop, in the
  judge pool), then `apply_result` and the ack;
- `apply_result`: the verdict merge (the runner's check and the judge's verdict), `error_phase_of`, the
  row written once (`-> done`, guarded by `states.TRANSITIONS`) and an `error` retried.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.orm import Session

from gh_server.attempts.states import may, queue_retry, retry_count
from gh_server.models import Attempt, RunCase, utcnow
from gh_server.ports import AttemptEvents, RunnerLink
from gh_server.workpool import PoolTimeout, WorkPool
from gh_wire import protocol
from gh_wire.vocab import FINISHED, AttemptStatus, ErrorCause, Outcome

log = logging.getLogger(__name__)

NO_REASON = "attempt failed on the runner without a reason"
JUDGE_SLACK_S = 10.0  # on top of the judge endpoint's timeout: reading the replay frames, the queue


def rubric_of(case: dict[str, Any]) -> str | None:
    """The case's rubric for the model judge, or None when it has none (blank counts as none)."""
    rubric = (case.get("success") or {}).get("rubric")
    return rubric if isinstance(rubric, str) and rubric.strip() else None


def rubric_case(session: Session, runner_id: str, attempt_id: str) -> dict[str, Any] | None:
    """The frozen case of this runner's unfinished attempt when it has a rubric (the result is judged)."""
    case = _unfinished_case(session, runner_id, attempt_id)
    return case if case is not None and rubric_of(case) is not None else None


def unscored_checkpoints(result: protocol.AttemptResult) -> bool:
    """A result that may come from a runner before scores (docs/protocol.md, "Scores"): it scored no
    checkpoints and its check has no score (or it ran none). Such a runner ignores a lease's
    checkpoints, so its score would leave them out; `checkpoints_ignored` looks at the case."""
    if result.outcome == Outcome.ERROR or result.checkpoints is not None:
        return False
    return result.check_absent or (result.check_after is not None and result.check_after.score is None)


def checkpoints_ignored(session: Session, runner_id: str, attempt_id: str) -> bool:
    """The attempt's case has checkpoints, which the runner did not score."""
    case = _unfinished_case(session, runner_id, attempt_id)
    return case is not None and bool((case.get("success") or {}).get("checkpoints"))


IGNORED_CHECKPOINTS = ("the runner did not score this case's checkpoints: it is older than checkpoints "
                       "(docs/protocol.md, \"Scores\"); upgrade it")


def _unfinished_case(session: Session, runner_id: str, attempt_id: str) -> dict[str, Any] | None:
    row = session.execute(
        select(Attempt.status, Attempt.runner_id, RunCase.case)
        .join(RunCase, RunCase.id == Attempt.run_case_id)
        .where(Attempt.id == attempt_id)
    ).first()
    if row is None or row.runner_id != runner_id or row.status in FINISHED:
        return None
    return dict(row.case or {})


_T = cast(Table, Attempt.__table__)
# Built once and run on the connection (not through the ORM): constructing and routing a statement per
# result costs more than executing it.
_RESULT_TARGET = select(
    _T.c.runner_id, _T.c.status, _T.c.outcome, _T.c.test_run_id, _T.c.started_at, _T.c.leased_at
).where(_T.c.id == bindparam("b_id"))


@dataclass(frozen=True)
class Applied:
    attempt_id: str
    applied: bool  # False: a resend of a result already applied (or not this runner's)
    test_run_id: str | None = None
    outcome: str | None = None
    retry_id: str | None = None
    note: str | None = None
    attempts_so_far: int = 0  # of this try, when a retry was queued


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
                "score",
                "checkpoints",
                "save_points",
            )
        }
    )
)


def score_of(result: protocol.AttemptResult, outcome: Outcome, judge: dict[str, Any] | None) -> float | None:
    """The try's score in [0, 1] (docs/agents.md, "Scores"): the check's, or its checkpoints' weighted
    mean; a failed rubric makes it 0 and a rubric-only case scores 1 or 0, so a try passes exactly at 1.
    None for an error (counted in no mean); 0 for a `failed` by a rule, which has no check score."""
    if outcome == Outcome.ERROR:
        return None
    if result.check_absent:
        return 1.0 if outcome == Outcome.PASSED else 0.0
    checked = result.check_after.scored() if result.check_after else None
    if checked is None or (judge is not None and not judge.get("passed")):
        return 0.0
    return checked


def error_phase_of(result: protocol.AttemptResult, error: str | None, *, judged_error: bool) -> str | None:
    """The phase an `error` came from (results count infrastructure errors by it); None when not an error."""
    if judged_error:
        return "judge"
    if result.outcome != Outcome.ERROR:
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
    if not may(row.status, AttemptStatus.DONE):
        return Applied(aid, False, row.test_run_id, row.outcome)
    if result.interrupted:
        # The runner's report of an attempt its previous process left: sent after its hello, where the
        # server already errored the attempt (so not here) or resumed it from a save point (it runs on).
        return Applied(aid, False, row.test_run_id, note="an interruption the attempt went on from (a save point)")
    now = utcnow()
    outcome = Outcome(result.outcome)
    error = result.error
    if judge is not None and outcome != Outcome.ERROR:
        if judge.get("error"):
            outcome, error = Outcome.ERROR, str(judge["error"])
        elif result.check_absent:
            # A rubric-only case: the judge decides.
            outcome = Outcome.PASSED if judge.get("passed") else Outcome.FAILED
        elif outcome == Outcome.PASSED and not judge.get("passed"):
            outcome = Outcome.FAILED
    elif result.check_absent and outcome != Outcome.ERROR:
        outcome, error = Outcome.ERROR, "this case has only a rubric and it was not judged (no judge model configured)"
    after_verdict = result.check_after.verdict if result.check_after else None
    before_score = result.check_before.scored() if result.check_before else None
    m = result.metrics
    started = row.started_at or result.started_at or row.leased_at
    finished = result.finished_at or now
    values: dict[str, Any] = {
        "check": {
            "before": _check_text(result.check_before),
            "after": _check_text(result.check_after),
            "passed": None if after_verdict is None else after_verdict == "True",
            # Partial credit the untouched machine already earned (validation flags it above 0).
            "before_score": before_score,
        },
        "score": score_of(result, outcome, judge),
        "checkpoints": None if outcome == Outcome.ERROR or result.checkpoints is None
        else [c.model_dump(exclude_none=True) for c in result.checkpoints],
        "save_points": None if not result.save_points else [p.model_dump(mode="json") for p in result.save_points],
        "metrics": {
            "active_seconds": round(m.active_seconds),
            "steps": m.steps,
            "questions": m.questions,
            "approvals": m.approvals,
            # A model agent's price times its tokens (None for agents that do not say what they spent).
            "cost_cents": (m.agent_usage or {}).get("cost_cents"),
            "phase_seconds": dict(m.phase_seconds),
            # Why the task ended (agent's side, never an error) and, for an error, the phase it came from.
            "task_end": None if result.task_end is None else {
                "reason": str(result.task_end), "note": (result.task_note or None),
                # agent_failed for what the agent sent (gh_wire.answer), typed; only when there is one
                **({} if result.task_fault is None else {"fault": str(result.task_fault)})},
            # `failed` by a rule rather than the check's verdict (gh_wire.vocab.FailReason), counted apart.
            "failed_reason": str(result.failed_reason) if outcome == Outcome.FAILED and result.failed_reason else None,
            "error_phase": error_phase_of(result, error, judged_error=judge is not None and bool(judge.get("error"))),
            # Whose the error is, as the runner judged it; a judge's error or an unsaid one is ours.
            "error_cause": str(result.error_cause) if outcome == "error" and result.outcome == "error"
            and result.error_cause is not None else None,
            "machine_origin": m.machine_origin,
            # The model agent's own account: turns, tokens in/out/cached, model seconds per step. The
            # evaluator's tokens (judge, customer) stay on `judge` and the customer's turns.
            "model": m.agent_usage,
            # The agent started this long into the task (the link was down when it began): time it lost.
            "task_seconds_lost": m.task_seconds_lost,
            # A person held the machine this long during the task (a takeover): not the task's time.
            "held_seconds": m.held_seconds,
            # Went on from a save point this many times after its runner was lost (gh_server/attempts/resume.py).
            "resumed": m.resumed,
        },
        "outcome": outcome,
        "error": None if outcome != Outcome.ERROR else (error or NO_REASON)[:4000],
        "answer": result.answer,
        "status": AttemptStatus.DONE,
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
    retry_id, so_far = None, 0
    if outcome == Outcome.ERROR:
        a = session.get(Attempt, aid)
        if a is not None:
            session.refresh(a)
            so_far = retry_count(session, a)
            retry_id = queue_retry(session, a, now)
    return Applied(aid, True, row.test_run_id, outcome, retry_id, attempts_so_far=so_far)


class ResultIntake:
    """Where a runner's result goes (the gateway hands every `attempt_result` here).

    A result that needs the rubric judge is judged in the judge pool, off the gateway's read loop: the
    runner's other slots keep being answered meanwhile, and the ack goes out when the verdict is
    applied (a copy resent meanwhile is not judged twice: it is acked with the first).
    """

    def __init__(self, link: RunnerLink, events: AttemptEvents) -> None:
        self.link = link
        self.events = events
        self.settings = link.settings
        self.dbq = link.dbq
        self.metrics = link.metrics
        # The judge's time bound is its endpoint's (the whole call, replay frames included) plus a slack.
        judge_timeout = (self.settings.judge.timeout if self.settings.judge else 120.0) + JUDGE_SLACK_S
        self.judge_pool = WorkPool("judge", self.settings.judge_workers, judge_timeout,
                                   observer=self.metrics.pool_observer)
        self._judging: set[str] = set()

    async def stop(self) -> None:
        await self.judge_pool.stop()  # an unacked result is resent by its runner and judged where it lands

    async def receive(self, runner_id: str, name: str, result: protocol.AttemptResult) -> None:
        """Apply a result (once, by attempt id) and ack it, after the judge when the case has a rubric."""
        aid = result.attempt_id
        if aid in self._judging:
            return  # the first copy is being judged; it is acked when applied
        if unscored_checkpoints(result) and await self.dbq.run(lambda s: checkpoints_ignored(s, runner_id, aid)):
            # Ours, not the agent's nor the author's: retried (perhaps on a runner of this version).
            result = result.model_copy(update={
                "outcome": Outcome.ERROR, "error": IGNORED_CHECKPOINTS, "error_phase": "check_after",
                "error_cause": ErrorCause.INFRASTRUCTURE, "check_absent": False})
        case: dict[str, Any] | None = None
        if self.settings.judge is not None and result.outcome != Outcome.ERROR:
            case = await self.dbq.run(lambda s: rubric_case(s, runner_id, aid))
        if case is None:
            await self._apply(runner_id, name, result, None)
            return
        self._judging.add(aid)
        self.judge_pool.spawn(self._judge_then_apply(runner_id, name, result, case), name=f"gh-judge-{aid}")

    async def _judge_then_apply(self, runner_id: str, name: str, result: protocol.AttemptResult,
                                case: dict[str, Any]) -> None:
        from gh_server.agents.models import judge_attempt

        endpoint = self.settings.judge
        assert endpoint is not None
        aid = result.attempt_id
        try:
            try:
                judge = await self.judge_pool.run(lambda: judge_attempt(endpoint, self.dbq, aid, case, result))
            except PoolTimeout as e:
                judge = {"error": f"rubric judge: no verdict within {e.timeout:g} s"}
            else:
                if judge.get("error"):  # asked, and failed (HTTP error, no verdict): the pool saw it return
                    self.metrics.call_errors.labels(kind="judge", reason="error").inc()
            await self._apply(runner_id, name, result, judge)
        finally:
            self._judging.discard(aid)

    async def _apply(self, runner_id: str, name: str, result: protocol.AttemptResult,
                     judge: dict[str, Any] | None) -> None:
        aid = result.attempt_id
        def apply(s: Session) -> Any:
            applied = apply_result(s, runner_id, result, judge)
            if applied.applied and applied.retry_id is not None:
                # Held back inside the same database job: the database queue may run a scheduler's lease
                # pass right after it in the same batch, which would lease the retry at once, on any runner.
                self.events.retry_queued(applied.retry_id, runner_id, applied.attempts_so_far)
            return applied

        applied = await self.dbq.run(apply)
        # Ack always, even a duplicate or a stranger's: the runner journals until acked. By runner id, not
        # by socket: after a judge's wait the runner may be on a new connection.
        await self.link.send(runner_id, protocol.ResultAck(attempt_id=aid))
        if applied.note:
            log.warning("result for %r from runner %s not applied: %s", aid[:80], name, applied.note)
        if applied.applied:
            self.metrics.results.labels(outcome=applied.outcome or Outcome.ERROR).inc()
            self.events.run_changed(applied.test_run_id)
            self.events.poke()
