"""The check's copy of the agent's answer as a file, `GH_AGENT_ANSWER_FILE` (docs/agents.md, "The answer").

The answer also reaches the check in the environment variable `GH_AGENT_ANSWER`, but a check should
never depend on what an environment can hold, so the runner puts a few lines in front of the check
script, in the image's script language, that write the answer byte for byte (UTF-8, no newline added)
to a file readable only by the check's user and export its path. The answer travels inside the script
text (which reaches the guest on stdin or as a file, not in the environment):

- sh: `printf '%s' '...'` with the answer single-quoted (every byte but NUL is literal inside single
  quotes, and gh_wire.answer refuses NUL);
- PowerShell: the answer's UTF-8 as base64, decoded with [Convert]::FromBase64String (PowerShell's
  single quotes also close on typographic quotes, so quoting would be fragile there).

A check before the task gets an empty file, the same as its empty `GH_AGENT_ANSWER`.
"""

from __future__ import annotations

import base64

VARIABLE = "GH_AGENT_ANSWER_FILE"
# The first line of the preamble: a fake guest (tests) reads its own scripts past it.
MARK = "# gh-runner: the agent's answer as a file"


def _sh_quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def preamble(answer: str, shell: str) -> str:
    """The lines that write `answer` to a file and export its path as GH_AGENT_ANSWER_FILE."""
    if shell == "powershell":
        b64 = base64.b64encode(answer.encode("utf-8")).decode("ascii")
        return (f"{MARK}\n"
                f"${{env:{VARIABLE}}} = Join-Path ([IO.Path]::GetTempPath()) ('gh-answer-' + $PID + '.txt')\n"
                f"[IO.File]::WriteAllBytes(${{env:{VARIABLE}}}, [Convert]::FromBase64String('{b64}'))\n")
    return (f"{MARK}\n"
            f"{VARIABLE}=\"${{TMPDIR:-/tmp}}/gh-answer-$$\"\n"
            f"(umask 077 && printf '%s' {_sh_quoted(answer)} > \"${VARIABLE}\") && export {VARIABLE}\n")


def with_answer_file(script: str, answer: str, shell: str) -> str:
    """`script` with the preamble in front (an sh script's `#!` line, now the second, is a comment)."""
    return preamble(answer, shell) + script


def split(script: str) -> tuple[str | None, str]:
    """For fakes of a guest: (the answer the preamble writes, the script after it), or (None, script)."""
    if not script.startswith(MARK + "\n"):
        return None, script
    lines = script.split("\n")
    if lines[1].startswith("${env:"):
        b64 = lines[2].split("FromBase64String('", 1)[1].split("'", 1)[0]
        return base64.b64decode(b64).decode("utf-8"), "\n".join(lines[3:])
    _, _, rest = script[len(MARK) + 1:].partition("\n")
    quoted_and_tail = rest[len("(umask 077 && printf '%s' "):]
    end = f" > \"${VARIABLE}\") && export {VARIABLE}\n"
    quoted, _, after = quoted_and_tail.partition(end)
    return quoted[1:-1].replace("'\\''", "'"), after
