"""sd_notify: the datagrams a service manager would receive, on a real AF_UNIX socket."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import pytest

from gh_runner.notify import Notifier, parse_watchdog_interval


def test_ready_status_stopping(manager: tuple[socket.socket, str]) -> None:
    sock, path = manager
    n = Notifier({"NOTIFY_SOCKET": path})
    assert n.enabled
    assert n.ready("connected\nINJECTED=1")
    assert sock.recv(4096) == b"READY=1\nSTATUS=connected INJECTED=1"
    assert n.status("busy 1/2")
    assert sock.recv(4096) == b"STATUS=busy 1/2"
    assert n.stopping("draining")
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=draining"
    n.close()


def test_status_is_not_resent_when_unchanged(manager: tuple[socket.socket, str]) -> None:
    sock, path = manager
    n = Notifier({"NOTIFY_SOCKET": path})
    n.status("a")
    n.status("a")
    n.status("b")
    sock.settimeout(0.5)
    got = [sock.recv(4096), sock.recv(4096)]
    assert got == [b"STATUS=a", b"STATUS=b"]
    with pytest.raises(TimeoutError):
        sock.recv(4096)


def test_abstract_socket() -> None:
    name = f"gh-notify-test-{os.getpid()}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(b"\0" + name.encode())
    s.settimeout(5)
    try:
        n = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert n.ready()
        assert s.recv(4096) == b"READY=1"
    finally:
        s.close()


def test_watchdog_is_rate_limited_to_half_the_timeout(manager: tuple[socket.socket, str]) -> None:
    sock, path = manager
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "30000000"})
    assert n.watchdog_interval == 15.0
    assert n.watchdog()
    assert not n.watchdog()  # a tick a moment later must not ping again
    assert n.watchdog(force=True)
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert sock.recv(4096) == b"WATCHDOG=1"


def test_watchdog_env_parsing() -> None:
    assert parse_watchdog_interval({}) is None
    assert parse_watchdog_interval({"WATCHDOG_USEC": "2000000"}) == 1.0
    assert parse_watchdog_interval({"WATCHDOG_USEC": "junk"}) is None
    assert parse_watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert parse_watchdog_interval({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}, pid=2) is None
    assert parse_watchdog_interval({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "7"}, pid=7) == 1.0


def test_without_socket_everything_is_a_no_op() -> None:
    n = Notifier({})
    assert not n.enabled
    assert not n.ready("x")
    assert not n.watchdog()
    assert n.watchdog_interval is None


def test_a_dead_manager_does_not_raise() -> None:
    d = tempfile.mkdtemp(prefix="gh-notify-")
    try:
        n = Notifier({"NOTIFY_SOCKET": str(Path(d) / "gone.sock")})
        assert n.enabled
        assert not n.ready()
        assert not n.status("still fine")
    finally:
        os.rmdir(d)
