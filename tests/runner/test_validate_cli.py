"""`gh-runner validate`: its flags, and how it prints a validation (the run itself is in
tests/e2e/test_trust_local.py, on the real guest)."""

from __future__ import annotations

from pathlib import Path

from gh_local.validate import render
from gh_runner.cli import build_parser


def test_validate_flags() -> None:
    args = build_parser().parse_args(["validate", "cases.yaml", "--repeat", "4", "--strict"])
    assert (args.command, args.cases, args.repeat, args.strict) == ("validate", Path("cases.yaml"), 4, True)
    assert build_parser().parse_args(["validate", "c.yaml"]).repeat is None  # 3 unless given


def test_render_lists_each_case_with_its_reasons() -> None:
    text = render({"data": [
        {"key": "A", "test_case_id": "tc_a", "validation": {"status": "valid", "runs": 6, "reasons": []}},
        {"key": None, "test_case_id": "tc_b", "validation": {"status": "flaky", "runs": 9, "reasons": [
            {"message": "the check printed True before the task: 3 of 9"}]}},
    ], "counts": {"valid": 1, "flaky": 1}})
    lines = text.splitlines()
    assert lines[1].split() == ["A", "valid", "(6", "machines)"]
    assert lines[2].split()[:2] == ["tc_b", "flaky"]
    assert lines[3].strip() == "the check printed True before the task: 3 of 9"
    assert lines[-1].strip() == "1 valid, 0 broken, 1 flaky, 0 unvalidated"
