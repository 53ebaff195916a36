"""Reading files whose fault differs: what the agent left (`agent_*`: missing or unreadable is a
failure, `Fail`) and what the check brought (`ours_*`: unreadable is our error, left to raise).

Text is read as OSWorld's evaluator reads it: UTF-8 (the session's locale) with universal newlines.
A metric whose both sides may be either (an image compared with one the task placed in the guest, or
with one the check brought) tells them apart by type: the embedded_file getter gives `Embedded` paths.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
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


def query_copy(path: str, sql: str, *, rows: int | None = None) -> list[tuple[Any, ...]]:
    """The rows (all, or the first `rows`) of `sql` on a copy of a SQLite file with its journal or WAL: the
    application (Chrome, Thunderbird) may hold the database open and locked. Raises OSError or
    sqlite3.DatabaseError; the caller says whose fault that is."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = os.path.join(scratch, "db")
        shutil.copyfile(path, copy)
        for suffix in ("-journal", "-wal"):
            if os.path.isfile(path + suffix):
                shutil.copyfile(path + suffix, copy + suffix)
        connection = sqlite3.connect(copy, timeout=10)
        try:
            cursor = connection.execute(sql)
            return cursor.fetchall() if rows is None else cursor.fetchmany(rows)
        finally:
            connection.close()
