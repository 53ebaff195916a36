"""The name a runner goes by, when it was not given one: the one it was registered with.

A runner started without `--name` has its hostname. The server's welcome says the name its token
was registered under; the runner remembers it in its state dir and starts again under it, so its
machines (gh-<name>-...) and its logs carry that name from the first moment of every later start.
"""

from __future__ import annotations

from pathlib import Path


def registered_name_file(state_dir: Path) -> Path:
    """Where a runner not given --name remembers the name it was registered with."""
    return state_dir / "registered-name"


def remembered_name(state_dir: Path) -> str | None:
    try:
        name = registered_name_file(state_dir).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return name or None


def remember_name(state_dir: Path, name: str) -> None:
    """Raises OSError when the state dir cannot be written (the runner restarts under it all the same)."""
    registered_name_file(state_dir).write_text(name + "\n", encoding="utf-8")
