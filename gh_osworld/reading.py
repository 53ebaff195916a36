"""Reading files whose fault differs: what the agent left (`agent_*`: missing or unreadable is a
failure, `Fail`) and what the check brought (`ours_*`: unreadable is our error, left to raise).

Text is read as OSWorld's evaluator reads it: UTF-8 (the session's locale) with universal newlines.
A metric whose both sides may be either (an image compared with one the task placed in the guest, or
with one the check brought) tells them apart by type: the embedded_file getter gives `Embedded` paths.
"""

from __future__ import annotations

import json
from typing import Any

from gh_osworld.outcome import Fail


class Embedded(str):
    """A path to a file the check brought (getters/files.py embedded_file): failing to read it is ours."""


def is_ours(path: str) -> bool:
    return isinstance(path, Embedded)


def agent_text(path: str | None, *, what: str = "the result") -> str:
    if not path:
        raise Fail(f"{what}: there is no file")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise Fail(f"{what}: {path} cannot be read as text: {e}") from None


def agent_json(path: str | None, *, what: str = "the result") -> Any:
    text = agent_text(path, what=what)
    try:
        return json.loads(text)
    except ValueError as e:
        raise Fail(f"{what}: {path} is not JSON: {e}") from None


def ours_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()
