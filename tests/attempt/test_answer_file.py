"""The answer-file preamble (gh_runner.answer_file), run by a real sh: the file holds the answer byte for
byte whatever it holds (quotes, newlines, `$(...)`, non-ASCII), and the script after it runs as before."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gh_runner import answer_file

ANSWERS = ["", "it's done", "line 1\nline 2\n\n", "$(touch /tmp/gh-pwned) `x` $HOME \\ \"q\"",
           "Grüße 東京 😀 \u2018typographic\u2019", "'" * 50]


@pytest.mark.parametrize("answer", ANSWERS)
def test_sh_preamble_writes_the_answer_exactly(answer: str, tmp_path: Path) -> None:
    script = answer_file.with_answer_file('#!/bin/sh\ncat "$GH_AGENT_ANSWER_FILE"; echo; echo True\n', answer, "sh")
    out = subprocess.run(["sh", "-s"], input=script.encode(), capture_output=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)}, check=True).stdout
    assert out == answer.encode() + b"\nTrue\n"
    assert answer_file.split(script)[0] == answer
    (written,) = tmp_path.iterdir()
    assert written.stat().st_mode & 0o077 == 0  # only the check's user reads it


@pytest.mark.parametrize("answer", ANSWERS)
def test_powershell_preamble_round_trips(answer: str) -> None:
    script = answer_file.with_answer_file("'True'\n", answer, "powershell")
    assert answer_file.split(script) == (answer, "'True'\n")
