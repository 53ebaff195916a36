"""A spec evaluated: each metric's getters, the metric, the verdicts combined by `conj`."""

from __future__ import annotations

import sys
from typing import Any

from gh_osworld import registry
from gh_osworld.outcome import Fail, full
from gh_osworld.spec import CheckSpec, MetricSpec, SpecError


def _get(g: dict[str, Any] | None) -> Any:
    if g is None:
        return None
    impl = registry.GETTERS.get(g["type"])
    if impl is None:
        raise SpecError(f"getter {g['type']} is not implemented here")
    return impl(g)


def passes(m: MetricSpec) -> bool:
    impl = registry.METRICS.get(m.func)
    if impl is None:
        raise SpecError(f"metric {m.func} is not implemented here")
    try:
        result = _get(m.result)
        expected = _get(m.expected)
        ok = full(impl(result, expected, **m.options))
    except Fail as f:
        print(f"{m.func}: fails: {f}", file=sys.stderr)
        return False
    if not ok:
        print(f"{m.func}: fails", file=sys.stderr)
    return ok


def evaluate(spec: CheckSpec) -> bool:
    registry.load((m.func for m in spec.metrics),
                  (g["type"] for m in spec.metrics for g in (m.result, m.expected) if g is not None))
    if spec.conj == "and":
        return all(passes(m) for m in spec.metrics)
    return any(passes(m) for m in spec.metrics)
