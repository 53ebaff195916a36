"""The outcome rules (gh_runner/outcome.py), row by row."""

from __future__ import annotations

import pytest

from gh_runner import outcome as rules
from gh_wire.vocab import ErrorCause
from providers.base import ScriptResult

T = 300.0


def res(stdout: str, code: int | None = 0, *, timed_out: bool = False, truncated: bool = False,
        stderr: str = "") -> ScriptResult:
    return ScriptResult(exit_code=code, stdout=stdout, stderr=stderr, timed_out=timed_out,
                        stdout_truncated=truncated)


# (name, script result, outcome before the task, outcome after the task)
# Before: "passed" means the check printed False as required; "error" means the attempt errors.
ROWS = [
    ("False", res("False\n"), "passed", "failed"),
    ("True", res("True\n"), "error", "passed"),
    ("no newline", res("True"), "error", "passed"),
    ("CRLF", res("True\r\n"), "error", "passed"),
    ("CRLF False", res("False\r\n\r\n"), "passed", "failed"),
    ("trailing blank lines", res("True\n\n \n\t\n"), "error", "passed"),
    ("padded", res("   False   \n"), "passed", "failed"),
    ("log lines before", res("checking registry\nvalue=1\nTrue\n"), "error", "passed"),
    ("PowerShell BOM", res("\ufeffTrue\r\n"), "error", "passed"),
    ("verdict not last", res("True\ndone\n"), "error", "error"),
    ("lowercase true is garbage", res("true\n"), "error", "error"),
    ("lowercase false is garbage", res("false\n"), "error", "error"),
    ("upper case", res("TRUE\n"), "error", "error"),
    ("1 is a score of 1", res("1\n"), "error", "passed"),
    ("0 is a score of 0", res("0\n"), "passed", "failed"),
    ("a fraction before is recorded, after fails", res("0.5\n"), "passed", "failed"),
    ("two words", res("True False\n"), "error", "error"),
    ("True. with a dot", res("True.\n"), "error", "error"),
    ("empty", res(""), "error", "error"),
    ("only whitespace", res("\n  \r\n"), "error", "error"),
    ("verdict on stderr only", res("", stderr="True\n"), "error", "error"),
    # A check that printed a verdict and then exited non-zero crashed: error, whichever verdict.
    ("True then exit 1", res("True\n", 1), "error", "error"),
    ("False then exit 2", res("False\n", 2), "error", "error"),
    ("crash", res("", 1, stderr="Traceback...\nNameError\n"), "error", "error"),
    ("timeout after printing True", res("True\n", None, timed_out=True), "error", "error"),
    ("timeout", res("", None, timed_out=True), "error", "error"),
    ("killed without exit code", res("True\n", None), "error", "error"),
    ("stdout truncated", res("x\n" * 10 + "True\n", truncated=True), "error", "error"),
]


@pytest.mark.parametrize(("result", "before", "after"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_outcome_rules(result: ScriptResult, before: str, after: str) -> None:
    b = rules.judge_before(result, T)
    a = rules.judge_after(result, T)
    assert b.outcome == before
    assert a.outcome == after
    # Every error comes with a reason; no reason without an error.
    assert (b.reason is not None) == (b.outcome == "error")
    assert (a.reason is not None) == (a.outcome == "error")


def test_recorded_verdict_only_for_a_clean_run() -> None:
    assert rules.check_output(res("x\nTrue\r\n")).verdict == "True"
    assert rules.check_output(res("False")).verdict == "False"
    assert rules.check_output(res("true")).verdict is None
    assert rules.check_output(res("True", 1)).verdict is None
    out = rules.check_output(res("True", None, timed_out=True))
    assert out.verdict is None and out.timed_out and out.exit_code is None


def test_reasons_say_what_the_guest_said() -> None:
    r = rules.judge_before(res("True\n"), T).reason or ""
    assert "printed True before the task (a score of 1)" in r and "setup did not break" in r
    r = rules.judge_after(res("log\nmaybe\n"), T).reason or ""
    assert "'maybe'" in r and "True, False or a number in [0, 1]" in r and "log" in r
    r = rules.judge_after(res(""), T).reason or ""
    assert "printed nothing" in r
    r = rules.judge_after(res("", 3, stderr="Get-Item: access denied\n"), T).reason or ""
    assert "exited with code 3" in r and "access denied" in r
    r = rules.judge_after(res("", None, timed_out=True), T).reason or ""
    assert "did not finish within 300 s" in r


def _why(j: rules.Judgement | None) -> str:
    return (j.reason or "") if j is not None else ""


def test_setup_rules() -> None:
    assert rules.judge_setup(res("anything"), T) is None
    assert "exited with code 2" in _why(rules.judge_setup(res("", 2, stderr="no such file\n"), T))
    assert "did not finish within 600 s" in _why(rules.judge_setup(res("", None, timed_out=True), 600))
    # A setup's stdout has no verdict to keep: only the exit code matters.
    assert rules.judge_setup(res("", 0, truncated=True), T) is None


def test_tail_is_bounded() -> None:
    text = "".join(f"line {i}\r\n" for i in range(1000))
    t = rules.tail(text)
    assert t.splitlines() == [f"line {i}" for i in range(980, 1000)]
    huge = "é" * 5000  # 2 bytes each: the cut must not split a character
    t = rules.tail(huge)
    assert len(t.encode()) <= rules.TAIL_BYTES and set(t) == {"é"}
    assert rules.tail("") == ""


def test_long_garbage_line_is_shortened_in_the_reason() -> None:
    r = rules.judge_after(res("x" * 10_000), T).reason or ""
    assert len(r) < 2 * rules.TAIL_BYTES + 500


def test_error_causes_tell_the_cases_fault_from_ours() -> None:
    case, ours = ErrorCause.CASE, ErrorCause.INFRASTRUCTURE
    setup = rules.judge_setup(res("", 2), T)
    assert setup is not None and setup.cause == case  # the setup ran to its end and failed
    setup = rules.judge_setup(res("", None, timed_out=True), T)
    assert setup is not None and setup.cause == ours  # it could not finish: a stuck or slow machine
    assert rules.judge_before(res("true"), T).cause == case  # no verdict
    assert rules.judge_before(res("True"), T).cause == case  # True before the task
    assert rules.judge_before(res("False", 1), T).cause == case  # crashed after deciding
    assert rules.judge_before(res("False", None), T).cause == ours  # killed in the guest
    assert rules.judge_before(res("", 0, truncated=True), T).cause == case  # more than the output cap
    assert rules.judge_after(res("garbage"), T).cause == case
    assert rules.judge_after(res("", None, timed_out=True), T).cause == ours
    assert rules.judge_after(res("True"), T).cause is None and rules.judge_before(res("False"), T).cause is None


# (what the check printed as its last line, the score it means; None: garbage, the case's error)
SCORES = [
    ("True", 1.0), ("False", 0.0),
    ("0", 0.0), ("1", 1.0), ("0.5", 0.5), (".25", 0.25), ("0.957", 0.957), ("1.0", 1.0), ("1.", 1.0),
    ("0.0", 0.0), ("00.5", 0.5), ("5e-05", 5e-05), ("1E0", 1.0), ("2.5e-1", 0.25), ("0.9967", 0.9967),
    # garbage: out of range, a sign, not a plain decimal, another culture's comma, words
    ("1.01", None), ("2", None), ("1e1", None), ("-0", None), ("+0.5", None), ("-0.5", None),
    ("nan", None), ("NaN", None), ("inf", None), ("Infinity", None), ("0,5", None), ("1/2", None),
    ("50%", None), (".", None), ("e-5", None), ("0x1", None), ("1_0", None), ("0.5.1", None),
    ("0. 5", None), ("true", None), ("0.5 True", None), ("1" + "0" * 70, None),
    ("\u0660.\u0665", None),  # Arabic-Indic digits: float() takes them
]


@pytest.mark.parametrize(("line", "score"), SCORES, ids=[r[0][:20] for r in SCORES])
def test_score_grammar(line: str, score: float | None) -> None:
    assert rules.parse_score(f"log line\r\n  {line}  \r\n\n") == score
    out = rules.check_output(res(line + "\n"))
    assert out.score == score
    # The verdict an older server reads: True only at 1.
    assert out.verdict == (None if score is None else "True" if score == 1.0 else "False")
    after = rules.judge_after(res(line), T)
    if score is None:
        assert after.outcome == "error" and after.cause == ErrorCause.CASE
    else:
        assert after.outcome == ("passed" if score == 1.0 else "failed") and after.score == score


def test_before_score_below_1_is_recorded_not_an_error() -> None:
    before = rules.judge_before(res("0.25"), T)
    assert before.outcome == "passed" and before.score == 0.25
    one = rules.judge_before(res("1.0"), T)
    assert one.outcome == "error" and one.cause == ErrorCause.CASE and "before the task" in (one.reason or "")


# ((score, weight) per checkpoint, the weighted mean)
MEANS = [
    ([(1.0, 1.0)], 1.0),
    ([(0.5, 1.0)], 0.5),
    ([(1.0, 1.0), (0.0, 1.0)], 0.5),
    ([(1.0, 3.0), (0.0, 1.0)], 0.75),
    ([(1.0, 1.0), (0.5, 2.0), (0.0, 1.0)], 0.5),
    ([(0.0, 2.0), (0.0, 5.0)], 0.0),
    ([(1.0, 0.1), (1.0, 0.2), (1.0, 0.7)], 1.0),  # exactly 1: the floats' sum is 0.9999999999999999
    ([(1.0, 0.001), (0.0, 1000.0)], 0.001 / 1000.001),
]


@pytest.mark.parametrize(("scores", "mean"), MEANS, ids=[str(m[0]) for m in MEANS])
def test_weighted_mean(scores: list[tuple[float, float]], mean: float) -> None:
    assert rules.weighted_mean(scores) == pytest.approx(mean, abs=1e-12)
    assert (rules.weighted_mean(scores) == 1.0) == all(s == 1.0 for s, _ in scores)


def test_weighted_mean_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError):
        rules.weighted_mean([])
