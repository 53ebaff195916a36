"""A spec evaluated as OSWorld evaluates a task: each metric's getters, the metric's number, the numbers
combined by `conj`.

    and    0 as soon as a metric scores 0 (the rest are not run), otherwise the mean of the scores
    or     1 as soon as a metric scores 1 (the rest are not run), otherwise the highest score

A metric's score is its number as a float (True 1, False 0); a failure of the agent's (`Fail`) or OSWorld's
"could not get it" (None) scores 0. A check prints one number in [0, 1] (a metric's number outside it, as a
task's own SQL may give, is held to it): __main__.py says how.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from gh_osworld import registry
from gh_osworld.outcome import Fail
from gh_osworld.spec import CheckSpec, MetricSpec, SpecError


def _get(g: dict[str, Any] | None) -> Any:
    if g is None:
        return None
    impl = registry.GETTERS.get(g["type"])
    if impl is None:
        raise SpecError(f"getter {g['type']} is not implemented here")
    return impl(g)


def as_score(value: Any) -> float:
    """A metric's return value as a number: None (could not get it) is 0; NaN (a metric's 0/0) is 0."""
    if value is None:
        return 0.0
    score = float(value)
    return 0.0 if math.isnan(score) else score


def score(m: MetricSpec) -> float:
    impl = registry.METRICS.get(m.func)
    if impl is None:
        raise SpecError(f"metric {m.func} is not implemented here")
    try:
        result = _get(m.result)
        expected = _get(m.expected)
        value = as_score(impl(result, expected, **m.options))
    except Fail as f:
        print(f"{m.func}: fails: {f}", file=sys.stderr)
        return 0.0
    if value < 1.0:
        print(f"{m.func}: scores {value!r}", file=sys.stderr)
    return value


def evaluate(spec: CheckSpec) -> float:
    """The check's score in [0, 1]."""
    registry.load((m.func for m in spec.metrics),
                  (g["type"] for m in spec.metrics for g in (m.result, m.expected) if g is not None))
    scores: list[float] = []
    for m in spec.metrics:
        s = score(m)
        if spec.conj == "and" and s == 0.0:
            return 0.0
        if spec.conj == "or" and s == 1.0:
            return 1.0
        scores.append(s)
    combined = sum(scores) / len(scores) if spec.conj == "and" else max(scores)
    return min(1.0, max(0.0, combined))
