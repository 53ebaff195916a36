"""The outcome rules, as pure functions over what a script gave back: the setup must exit 0; the check
prints a score in [0, 1] (`True` is 1, `False` is 0); before the task it must be below 1 (the setup broke
the machine), after it a try passes at 1 and fails below; anything else is `error`, with whose fault it
is (docs/agents.md, "What ends a task, and what is an error"). A case's checkpoints each score the same
way and the try's score is their weighted mean (`weighted_mean`).

Kept apart from the lifecycle so the rules can be read, and tested row by row, without a machine.

Decisions where the rules are silent (documented here because operators will ask):
- The verdict is the last non-empty line of stdout with surrounding whitespace removed (so CRLF
  line ends, trailing blank lines and PowerShell's padding do not matter), compared exactly:
  `True`, `False`, or a plain decimal number (`SCORE_GRAMMAR`: digits with at most one `.`, at least
  one digit, an optional exponent `e-5`; `0`, `1`, `0.5`, `.25`, `1.0`, `5e-05`) whose value is in
  [0, 1]. `true`, `TRUE`, `yes`, a sign (`+0.5`, `-0`), `nan`, `inf`, `1/2`, `50%`, a comma decimal
  (`0,5`: PowerShell under a comma-decimal culture; print with the invariant culture) and anything out
  of range (`1.01`) are garbage: a checker that prints them is broken, and guessing would score it.
- A check must also exit 0. A script that printed `True` and then exited non-zero crashed after
  deciding; we cannot tell which of the two to believe, and guessing in the agent's favour (or
  against it) would make results depend on the shell's error handling, so it is `error`.
- Truncated stdout is `error`: the line we see last is not the line the script printed last.
- A timeout is `error` whatever was printed before it.
- How the task ended is never an error by itself (`task_ending`): an agent stopped by its time
  limit, even mid-exec or mid-input, or one whose process failed, is scored by the check after.
- Whose an error is (`ErrorCause`): a script that ran to its end and gave the wrong thing is the
  case's (setup exited non-zero; the check exited non-zero, printed no verdict, printed more than
  the output cap, or printed True before the task). A script that could not run to its end (a
  timeout, no exit code: a stuck or killed guest) and every other failure is ours (infrastructure):
  a slow machine must never be blamed on the author.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gh_wire import answer as answer_contract
from gh_wire.protocol import CheckOutput, Outcome, TaskEnd, TaskEndReason
from gh_wire.vocab import AgentFault, ErrorCause
from providers.base import ScriptResult

TAIL_LINES = 20
TAIL_BYTES = 2048

Verdict = Literal["True", "False"]


def tail(text: str, lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> str:
    """The last `lines` lines of `text`, at most `max_bytes` bytes of UTF-8: what an operator needs
    to see why a script failed, bounded so a chatty script cannot flood a result or a log."""
    kept = text.replace("\r\n", "\n").rstrip("\n").split("\n")[-lines:]
    out = "\n".join(kept)
    raw = out.encode("utf-8", errors="replace")
    if len(raw) > max_bytes:
        # Cut on the byte budget, then drop a partial character at the cut.
        out = raw[-max_bytes:].decode("utf-8", errors="ignore")
    return out


def last_line(stdout: str) -> str | None:
    """The last non-empty line of stdout, stripped; None when stdout has no visible text."""
    for line in reversed(stdout.splitlines()):
        s = line.strip().lstrip("\ufeff").strip()
        if s:
            return s
    return None


# A plain decimal, no sign: "1", "0.5", ".25", "1.", "5e-05". Python's float() alone would also take
# "nan", "inf", "+1", "1_0" and surrounding spaces, none of which a check means as a score.
SCORE_GRAMMAR = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
MAX_SCORE_CHARS = 64  # a longer number is not a score anyone printed on purpose


def parse_score(stdout: str) -> float | None:
    """The score the last non-empty line of stdout says: True 1.0, False 0.0, a number in [0, 1]
    itself; None for anything else (garbage)."""
    line = last_line(stdout)
    if line == "True":
        return 1.0
    if line == "False":
        return 0.0
    if line is None or len(line) > MAX_SCORE_CHARS or not SCORE_GRAMMAR.fullmatch(line):
        return None
    value = float(line)
    return value if 0.0 <= value <= 1.0 else None


def parse_verdict(stdout: str) -> Verdict | None:
    """The pass/fail a check's score means: True only at 1 (an older peer reads only this)."""
    return verdict_of(parse_score(stdout))


def verdict_of(score: float | None) -> Verdict | None:
    if score is None:
        return None
    return "True" if score == 1.0 else "False"


def weighted_mean(scores: Sequence[tuple[float, float]]) -> float:
    """The weighted mean of (score, weight) pairs, each weight > 0; 1.0 exactly when every score is 1
    (so a try whose checkpoints all pass passes, whatever rounding the weights bring)."""
    if not scores:
        raise ValueError("no scores to average")
    if all(s == 1.0 for s, _ in scores):
        return 1.0
    total = sum(w for _, w in scores)
    return min(1.0, max(0.0, sum(s * w for s, w in scores) / total))


def check_output(res: ScriptResult) -> CheckOutput:
    """The bounded record of one check run that travels in the result."""
    score = parse_score(res.stdout) if _clean_exit(res) else None
    return CheckOutput(
        exit_code=res.exit_code,
        stdout_tail=tail(res.stdout),
        stderr_tail=tail(res.stderr),
        verdict=verdict_of(score),
        score=score,
        timed_out=res.timed_out,
        truncated=res.stdout_truncated or res.stderr_truncated,
    )


def _clean_exit(res: ScriptResult) -> bool:
    return not res.timed_out and res.exit_code == 0 and not res.stdout_truncated


def _printed(stdout: str) -> str:
    line = last_line(stdout)
    if line is None:
        return "printed nothing on stdout"
    shown = line if len(line) <= 120 else line[:117] + "..."
    return f"printed {shown!r} as its last line"


def _output_excerpt(res: ScriptResult) -> str:
    parts = []
    out, err = tail(res.stdout), tail(res.stderr)
    if err:
        parts.append(f"last stderr lines:\n{err}")
    if out:
        parts.append(f"last stdout lines:\n{out}")
    return ("\n" + "\n".join(parts)) if parts else " (no output)"


def script_failure(what: str, res: ScriptResult, timeout: float) -> str | None:
    """Why a script run counts as crashed (timeout, non-zero exit, unreadable output), or None."""
    failed = script_failure_cause(what, res, timeout)
    return failed[0] if failed else None


def script_failure_cause(what: str, res: ScriptResult, timeout: float) -> tuple[str, ErrorCause] | None:
    """Why a script run counts as crashed, and whose that is; None when it ran to a clean exit."""
    if res.timed_out:
        return f"the {what} did not finish within {timeout:g} s{_output_excerpt(res)}", ErrorCause.INFRASTRUCTURE
    if res.exit_code is None:
        return (f"the {what} ended without an exit code (killed in the guest?){_output_excerpt(res)}",
                ErrorCause.INFRASTRUCTURE)
    if res.exit_code != 0:
        return f"the {what} exited with code {res.exit_code}{_output_excerpt(res)}", ErrorCause.CASE
    return None


@dataclass(frozen=True)
class Judgement:
    """What one run of the check decides: an outcome, and for `error` the plain reason and whose it is."""

    outcome: Outcome
    reason: str | None = None
    cause: ErrorCause | None = None
    score: float | None = None  # what the check printed, when it printed a score


def judge_setup(res: ScriptResult, timeout: float) -> Judgement | None:
    """The setup must exit 0 in time; the error judgement when it did not, or None."""
    failed = script_failure_cause("setup script", res, timeout)
    return Judgement("error", failed[0], failed[1]) if failed else None


def check_score(res: ScriptResult, timeout: float, what: str = "check script") -> float | Judgement:
    """The check's score, or the error judgement when it has none (crashed, timed out, garbage)."""
    crash = script_failure_cause(what, res, timeout)
    if crash:
        return Judgement("error", crash[0], crash[1])
    if res.stdout_truncated:
        return Judgement("error", f"the {what}'s stdout was over the output cap, so its last line is unknown",
                         ErrorCause.CASE)
    score = parse_score(res.stdout)
    if score is None:
        return Judgement("error", f"the {what} {_printed(res.stdout)}; it must print True, False or a number "
                                  f"in [0, 1] such as 0.5{_output_excerpt(res)}", ErrorCause.CASE)
    return score


def judge_before(res: ScriptResult, timeout: float, what: str = "check script") -> Judgement:
    """Before the task the check must score below 1 (False, or partial credit the untouched machine
    already earns: recorded as `before_score`). `passed` here means "the setup broke the machine"."""
    score = check_score(res, timeout, what)
    if isinstance(score, Judgement):
        return score
    return judge_before_score(score)


def judge_before_score(score: float, what: str = "check") -> Judgement:
    if score == 1.0:
        return Judgement(
            "error",
            f"the {what} printed True before the task (a score of 1): the setup did not break the machine "
            "(before the task the check must print False or a score below 1)",
            ErrorCause.CASE, score,
        )
    return Judgement("passed", score=score)


def judge_after(res: ScriptResult, timeout: float, what: str = "check script") -> Judgement:
    """After the task: score 1 (True) -> passed, below 1 (False, 0.5) -> failed, anything else -> error."""
    score = check_score(res, timeout, what)
    if isinstance(score, Judgement):
        return score
    return judge_after_score(score)


def judge_after_score(score: float) -> Judgement:
    return Judgement("passed" if score == 1.0 else "failed", score=score)


@dataclass(frozen=True)
class TaskEnding:
    """How the task phase ended: why, what the agent's side said, and (only for our side's failures,
    such as a machine or customer model that failed under the agent) the error that ends the attempt."""

    reason: TaskEndReason
    note: str | None = None
    error: str | None = None
    fault: AgentFault | None = None  # agent_failed for what it sent (gh_wire.answer)
    answer: str = ""  # what the check after gets: "" when the agent's answer broke its contract


def task_ending(end: TaskEnd | None, limit_reached: bool) -> TaskEnding:
    """The limit wins: once limits.minutes stopped the task, whatever the agent reported after it
    (a request refused mid-flight, a failure) is the consequence of being stopped, not our fault.

    An answer that breaks its contract (gh_wire.answer: too long, a NUL, not UTF-8) is the agent's
    failure, decided here before any check reads it: the check after gets "" instead, so no guest is
    asked to carry what it cannot (the server checks the same; this holds whatever sent the task_end)."""
    if limit_reached:
        said = (end.error or end.note) if end is not None else None
        return TaskEnding(TaskEndReason.TIME_LIMIT, said, answer=_checked(end))
    if end is None:  # the task waits for a task_end or the limit, so this is the limit by another name
        return TaskEnding(TaskEndReason.TIME_LIMIT)
    if end.error:
        return TaskEnding(end.reason, end.note, f"the agent could not carry on: {end.error}")
    fault = answer_contract.text_fault(end.answer)
    if fault is not None:
        return TaskEnding(TaskEndReason.AGENT_FAILED, answer_contract.describe(fault, len(end.answer)), fault=fault)
    return TaskEnding(end.reason, end.note, fault=end.fault, answer=end.answer)


def _checked(end: TaskEnd | None) -> str:
    if end is None or answer_contract.text_fault(end.answer) is not None:
        return ""
    return end.answer
