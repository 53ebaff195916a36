"""What a finished try counts as in results: passed, failed, error or assisted (docs/server-api.md,
"Assisted attempts").

An attempt a person took over (`attempts.assisted`) whose check gave a verdict (passed or failed) is
`assisted`: its outcome is what the check said, and it is counted apart, like an error, never as the
agent's pass or failure. So it is in no pass rate, interval, pass@k / pass^k, flaky mark, paired
comparison, case validation or judge calibration. An assisted attempt that ended `error` stays an error
(ours or the case's, retried as every error is): the agent was not judged either way.

The one place that says so: results, run progress, trust, validation and calibration all ask here, and
so do the attempts' `outcome` filter and `rerun`'s `only` (gh_server/api/test_runs.py).
"""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import ColumnElement, and_, or_

from gh_wire.vocab import AttemptStatus, Outcome

Counted = Literal["passed", "failed", "error", "assisted"]
ASSISTED: Counted = "assisted"
COUNTED: tuple[Counted, ...] = ("passed", "failed", "error", "assisted")
RerunOnly = Literal["failed", "error", "assisted", "all"]


def counted_as(status: str | None, outcome: str | None, assisted: bool | None) -> Counted | None:
    """How a try counts; None while it is unfinished or when it was cancelled."""
    if status != AttemptStatus.DONE:
        return None
    if outcome == Outcome.ERROR:
        return "error"
    if outcome == Outcome.PASSED:
        return ASSISTED if assisted else "passed"
    if outcome == Outcome.FAILED:
        return ASSISTED if assisted else "failed"
    return None


def scored(status: str | None, outcome: str | None, assisted: bool | None) -> bool:
    """A verdict on the agent: passed or failed, and nobody took its machine over."""
    return counted_as(status, outcome, assisted) in ("passed", "failed")


def new_progress() -> dict[str, int]:
    """A run's `progress` before any try: every try in `total`, a finished one under what it counts as."""
    return {"total": 0, "queued": 0, "running": 0, **dict.fromkeys(COUNTED, 0)}


def where_counted(counted: Counted, status: Any, outcome: Any, assisted: Any) -> ColumnElement[bool]:
    """The SQL form of `counted_as(...) == counted` over an attempt's columns (the attempts' `outcome`
    filter): `passed` and `failed` leave assisted attempts out, `assisted` has only them."""
    done = status == AttemptStatus.DONE
    if counted == "error":
        return and_(done, outcome == Outcome.ERROR)
    verdicts = (Outcome.PASSED, Outcome.FAILED)
    if counted == ASSISTED:
        return and_(done, outcome.in_(verdicts), assisted.is_(True))
    return and_(done, outcome == counted, or_(assisted.is_(False), assisted.is_(None)))


def in_rerun(only: RerunOnly, counted: Counted | None) -> bool:
    """Whether `rerun only=...` takes a pair whose try counts as `counted` (None: unfinished or cancelled).
    `failed` takes the assisted tries too, passed or failed: a person's verdict is not the agent's, and
    the agent never earned a pass there."""
    if only == "all":
        return True
    if only == "failed":
        return counted in ("failed", ASSISTED)
    return counted == only


__all__ = ["ASSISTED", "COUNTED", "Counted", "RerunOnly", "counted_as", "in_rerun", "new_progress", "scored",
           "where_counted"]
