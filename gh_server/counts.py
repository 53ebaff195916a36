"""What a finished try counts as in results: passed, failed, error or assisted (docs/server-api.md,
"Assisted attempts").

An attempt a person took over (`attempts.assisted`) whose check gave a verdict (passed or failed) is
`assisted`: its outcome is what the check said, and it is counted apart, like an error, never as the
agent's pass or failure. So it is in no pass rate, interval, pass@k / pass^k, flaky mark, paired
comparison, case validation or judge calibration. An assisted attempt that ended `error` stays an error
(ours or the case's, retried as every error is): the agent was not judged either way.

The one place that says so: results, run progress, trust, validation and calibration all ask here.
"""

from __future__ import annotations

from typing import Literal

from gh_wire.vocab import AttemptStatus, Outcome

Counted = Literal["passed", "failed", "error", "assisted"]
ASSISTED: Counted = "assisted"
COUNTED: tuple[Counted, ...] = ("passed", "failed", "error", "assisted")


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
