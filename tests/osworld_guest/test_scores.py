"""gh_osworld/evaluate.py and __main__.py on the guest's Python: a check prints OSWorld's number, the
metrics combined as OSWorld combines them (and: 0 if any is 0, else the mean; or: the highest)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .kit import check, crash, embedded, metric, rule, run, score, vm_file


def half_and_full(tmp: Path) -> tuple[dict[str, object], dict[str, object], dict[str, object]]:
    """Three metrics scoring 0.5, 1 and 0 (diff_text_file: the share of matching lines, doubled over both)."""
    (tmp / "gold.txt").write_text("a\nb\n", encoding="utf-8")
    (tmp / "half.txt").write_text("a\nc\n", encoding="utf-8")
    half = metric("diff_text_file", vm_file(tmp / "half.txt"), embedded(tmp / "gold.txt"))
    full = metric("exact_match", {"type": "vm_command_line", "command": ["printf", "yes"]}, rule(expected="yes"))
    zero = metric("exact_match", {"type": "vm_command_line", "command": ["printf", "no"]}, rule(expected="yes"))
    return half, full, zero


def test_a_fraction_is_printed_as_the_number(tmp_path: Path) -> None:
    half, full, zero = half_and_full(tmp_path)
    ran = run(check(half), tmp_path)
    assert ran.returncode == 0 and ran.stdout.strip() == "0.5"
    assert run(check(full), tmp_path).stdout.strip() == "True"
    assert run(check(zero), tmp_path).stdout.strip() == "False"


@pytest.mark.parametrize(("conj", "which", "want"), [
    ("and", "half full", 0.75),     # the mean
    ("and", "half zero full", 0.0),  # any 0 is 0
    ("and", "full full", 1.0),
    ("or", "half zero", 0.5),        # the highest
    ("or", "zero half full", 1.0),
    ("or", "zero zero", 0.0),
])
def test_conj_combines_as_osworld(tmp_path: Path, conj: str, which: str, want: float) -> None:
    half, full, zero = half_and_full(tmp_path)
    named = {"half": half, "full": full, "zero": zero}
    assert score(check(*(named[w] for w in which.split()), conj=conj), tmp_path) == pytest.approx(want)


def test_and_stops_at_a_zero_as_osworld_does(tmp_path: Path) -> None:
    """OSWorld runs no metric after a 0 under `and` (nor after a 1 under `or`): a later metric that would
    crash gives no verdict only when it is reached."""
    half, full, zero = half_and_full(tmp_path)
    broken = metric("diff_text_file", vm_file(tmp_path / "half.txt"), embedded(tmp_path / "absent.txt"))
    assert score(check(zero, broken), tmp_path) == 0.0
    assert score(check(full, broken, conj="or"), tmp_path) == 1.0
    assert "the check crashed" in crash(check(half, broken), tmp_path)
