"""What an import did: per task `imported` or `skipped: REASON (detail)`, and the totals by reason."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from gh_local.osworld.skips import SkipReason


class Outcome(StrEnum):
    IMPORTED = "imported"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class TaskResult:
    task_id: str
    outcome: Outcome
    key: str | None = None  # the case's key, when imported
    reason: SkipReason | None = None
    detail: str = ""

    def line(self) -> str:
        if self.outcome is Outcome.IMPORTED:
            same = self.key == self.task_id
            return f"{self.task_id}: imported" + ("" if same else f" as {self.key}")
        return f"{self.task_id}: skipped: {self.reason} ({self.detail})"


@dataclass
class ImportReport:
    results: list[TaskResult] = field(default_factory=list)

    @property
    def imported(self) -> int:
        return sum(r.outcome is Outcome.IMPORTED for r in self.results)

    def skipped_by_reason(self) -> dict[SkipReason, int]:
        counts = Counter(r.reason for r in self.results if r.reason is not None)
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].value)))

    def totals(self) -> str:
        skipped = self.skipped_by_reason()
        text = f"{len(self.results)} tasks: {self.imported} imported, {sum(skipped.values())} skipped"
        if skipped:
            text += " (" + ", ".join(f"{reason} {n}" for reason, n in skipped.items()) + ")"
        return text

    def render(self) -> str:
        return "\n".join([*(r.line() for r in self.results), self.totals()])
