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
    warning: str = ""  # why its check may print True on the untouched start (untouched.py)

    def line(self) -> str:
        if self.outcome is Outcome.IMPORTED:
            same = self.key == self.task_id
            text = f"{self.task_id}: imported" + ("" if same else f" as {self.key}")
            if self.warning:
                text += (f"\n{self.task_id}: warning: its check may print True on the untouched start "
                         f"({self.warning}); `gh-runner validate` proves whether it does")
            return text
        return f"{self.task_id}: skipped: {self.reason} ({self.detail})"


@dataclass
class ImportReport:
    results: list[TaskResult] = field(default_factory=list)
    store: dict[str, int] = field(default_factory=dict)  # sha256 -> size: files the file store must hold

    @property
    def imported(self) -> int:
        return sum(r.outcome is Outcome.IMPORTED for r in self.results)

    def skipped_by_reason(self) -> dict[SkipReason, int]:
        counts = Counter(r.reason for r in self.results if r.reason is not None)
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].value)))

    @property
    def warned(self) -> int:
        return sum(bool(r.warning) for r in self.results if r.outcome is Outcome.IMPORTED)

    def totals(self) -> str:
        skipped = self.skipped_by_reason()
        text = f"{len(self.results)} tasks: {self.imported} imported, {sum(skipped.values())} skipped"
        if skipped:
            text += " (" + ", ".join(f"{reason} {n}" for reason, n in skipped.items()) + ")"
        if self.warned:
            text += f", {self.warned} warned (may pass untouched)"
        return text

    def store_lines(self, files_dir: str) -> list[str]:
        """What the start state's file store must hold, and the command that fills it."""
        if not self.store:
            return []
        size = sum(self.store.values())
        return [f"{len(self.store)} files ({size:,} bytes) are too large to embed and are placed from the start "
                f"state's file store; it must hold {', '.join(f'sha256/{h}' for h in sorted(self.store))}",
                f"build it with: image-builder/build osworld-desktop --files-dir {files_dir}"]

    def render(self, files_dir: str = "DIR") -> str:
        return "\n".join([*(r.line() for r in self.results), self.totals(), *self.store_lines(files_dir)])
