"""POSIX sh text for the generated setup and check scripts, and what a piece of them needs.

Every script is POSIX sh: it runs as-is under linux-tiny's busybox sh and linux-desktop's bash. Commands
keep OSWorld's meaning of `command` and `shell` (Python's subprocess): a list without shell is an argv,
a string without shell is split like a command line, a string with shell is `sh -c STRING`, and a list
with shell is `sh -c FIRST REST...` (what Popen(list, shell=True) runs).
"""

from __future__ import annotations

import base64
import gzip
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from gh_local.osworld.skips import Skip, SkipReason
from gh_local.osworld.target import Need

_PYTHON_RE = re.compile(r"\bpython3?\b")
_HEREDOC = "GH_OSWORLD_EOF"


@dataclass
class Piece:
    """Lines of sh and what they need of the guest."""

    lines: list[str] = field(default_factory=list)
    needs: set[Need] = field(default_factory=set)
    store: dict[str, int] = field(default_factory=dict)  # sha256 -> size of the files placed from the file store

    def add(self, other: Piece) -> None:
        self.lines.extend(other.lines)
        self.needs |= other.needs
        self.store.update(other.store)


def command_text(command: Any, shell: Any, where: str) -> tuple[str, set[Need]]:
    """A `command`/`shell` pair as one sh command line, and what it needs (python3 when it runs python)."""
    if isinstance(command, str) and command.strip():
        argv = ["sh", "-c", command] if shell else shlex.split(command)
    elif isinstance(command, list) and command and all(isinstance(a, str) for a in command):
        argv = ["sh", "-c", *command] if shell else list(command)
    else:
        raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: command {command!r} is not a string or a list of strings")
    text = shlex.join(argv)
    needs: set[Need] = set()
    if _PYTHON_RE.search(text):
        needs.add(Need.PYTHON3)
    if "pyautogui" in text:
        needs |= {Need.PYTHON3, Need.SESSION}
    return text, needs


def embed_bytes(data: bytes, dest: str, *, compress: bool = True) -> list[str]:
    """Lines that write `data` to the sh word `dest` (already quoted), from a base64 heredoc in the script.

    A file that cannot be written ends the script with exit 1 and no verdict: the fault is ours (or the
    machine's), never the agent's.
    """
    payload = gzip.compress(data, mtime=0) if compress else data
    b64 = base64.b64encode(payload).decode("ascii")
    body = [b64[i:i + 76] for i in range(0, len(b64), 76)]
    fail = f'|| {{ echo "gh-runner import osworld: cannot write "{dest} >&2; exit 1; }}'
    # The heredoc feeds the pipeline's first command (base64), so it is written there, not at the end.
    first = (f"base64 -d <<'{_HEREDOC}' | gunzip -c > {dest} {fail}" if compress
             else f"base64 -d > {dest} <<'{_HEREDOC}' {fail}")
    return [first, *body, _HEREDOC]


def quote(value: str) -> str:
    return shlex.quote(value)
