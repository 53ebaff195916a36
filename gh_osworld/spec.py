"""The check's spec: what the importer writes and the guest reads (the contract between the two sides).

    {"conj": "and" | "or", "metrics": [{"func", "result", "expected", "options"}]}

Parsed with the standard library only (the guest has no pydantic); a malformed spec is the importer's
bug, a crash with a message, never a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class SpecError(Exception):
    pass


@dataclass(frozen=True)
class MetricSpec:
    func: str
    result: dict[str, Any] | None
    expected: dict[str, Any] | None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckSpec:
    conj: str
    metrics: list[MetricSpec]


def _getter(value: Any, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise SpecError(f"{where}: a getter is an object with a type, not {value!r}"[:300])
    return value


def parse(data: Any) -> CheckSpec:
    if not isinstance(data, dict):
        raise SpecError("the spec is not an object")
    conj = data.get("conj", "and")
    if conj not in ("and", "or"):
        raise SpecError(f"conj {conj!r} is neither and nor or")
    raw = data.get("metrics")
    if not isinstance(raw, list) or not raw:
        raise SpecError("metrics: a non-empty list is needed")
    metrics = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get("func"), str):
            raise SpecError(f"metrics[{i}]: an object with a func is needed")
        options = m.get("options") or {}
        if not isinstance(options, dict):
            raise SpecError(f"metrics[{i}].options: an object is needed")
        metrics.append(MetricSpec(m["func"], _getter(m.get("result"), f"metrics[{i}].result"),
                                  _getter(m.get("expected"), f"metrics[{i}].expected"), options))
    return CheckSpec(conj, metrics)
