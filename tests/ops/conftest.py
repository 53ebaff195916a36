"""Shared by the ops tests: a datagram socket standing in for systemd's notify socket, and the runner
tests' control-plane peer (tests/runner/peer.py)."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from runner.conftest import peer


@pytest.fixture
def manager() -> Iterator[tuple[socket.socket, str]]:
    """(socket, path): what `NOTIFY_SOCKET` points at; the test reads what the daemon sent."""
    d = tempfile.mkdtemp(prefix="gh-notify-")
    path = str(Path(d) / "notify.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(5)
    try:
        yield s, path
    finally:
        s.close()
        os.unlink(path)
        os.rmdir(d)


__all__ = ["manager", "peer"]
