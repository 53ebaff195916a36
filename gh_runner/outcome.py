"""The outcome rules, as pure functions over what a script gave back: the setup must exit 0; the check
must print False before the task (the setup broke the machine) and True after it to pass (False: failed);
anything else is `error`, with whose fault it is (docs/agents.md, "What ends a task, and what is an error").

Kept apart from the lifecycle so the rules can be read, and tested row by row, without a machine.

Decisions where the rules are silent (documented here because operators will ask):
- The verdict is the last non-empty line of stdout with surrounding whitespace removed (so CRLF
  line ends, trailing blank lines and PowerShell's padding do not matter), compared exactly:
  `True`/`False` only; `true`, `TRUE`, `1`, `yes` are garbage.
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


def parse_verdict(stdout: str) -> Verdict | None:
    line = last_line(stdout)
    if line == "True":
        return "True"
    if line == "False":
        return "False"
    return None


def check_output(res: ScriptResult) -> CheckOutput:
    """The bounded record of one check run that travels in the result."""
    verdict = parse_verdict(res.stdout) if _clean_exit(res) else None
    return CheckOutput(
        exit_code=res.exit_code,
        stdout_tail=tail(res.stdout),
        stderr_tail=tail(res.stderr),
        verdict=verdict,
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


def judge_setup(res: ScriptResult, timeout: float) -> Judgement | None:
    """The setup must exit 0 in time; the error judgement when it did not, or None."""
    failed = script_failure_cause("setup script", res, timeout)
    return Judgement("error", failed[0], failed[1]) if failed else None


def _verdict(res: ScriptResult, timeout: float) -> Verdict | Judgement:
    """The check's verdict, or the error judgement when it has none (crashed, timed out, garbage)."""
    crash = script_failure_cause("check script", res, timeout)
    if crash:
        return Judgement("error", crash[0], crash[1])
    if res.stdout_truncated:
        return Judgement("error", "the check script's stdout was over the output cap, so its last line is unknown",
                         ErrorCause.CASE)
    verdict = parse_verdict(res.stdout)
    if verdict is None:
        return Judgement("error", f"the check script {_printed(res.stdout)}; it must print exactly True or False"
                                  f"{_output_excerpt(res)}", ErrorCause.CASE)
    return verdict


def judge_before(res: ScriptResult, timeout: float) -> Judgement:
    """Before the task the check must print False. `passed` here means "the setup broke the machine"."""
    verdict = _verdict(res, timeout)
    if isinstance(verdict, Judgement):
        return verdict
    if verdict == "True":
        return Judgement(
            "error",
            "the check printed True before the task: the setup did not break the machine "
            "(before the task the check must print False)",
            ErrorCause.CASE,
        )
    return Judgement("passed")


def judge_after(res: ScriptResult, timeout: float) -> Judgement:
    """After the task: True -> passed, False -> failed, anything else -> error."""
    verdict = _verdict(res, timeout)
    if isinstance(verdict, Judgement):
        return verdict
    return Judgement("passed" if verdict == "True" else "failed")


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
