"""sd_notify for `Type=notify` units: READY=1, STATUS=, WATCHDOG=1, STOPPING=1.

Hand-written rather than a dependency: the protocol is one datagram of `KEY=value` lines sent to
the AF_UNIX socket named in `NOTIFY_SOCKET` (a path, or `@name` for an abstract socket). Outside
systemd (no `NOTIFY_SOCKET`) every call is a cheap no-op, so the daemon calls it unconditionally.

A failed send never raises: losing a status line must not take the runner down. A lost watchdog
ping would, after `WatchdogSec=`, get the runner restarted; that is the point of the watchdog.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

import structlog

log = structlog.get_logger(__name__)

_MAX_STATUS = 400  # systemctl status shows one line; keep it readable and the datagram small


def _sanitize(value: str) -> str:
    # A newline would start a new KEY=value assignment inside the datagram.
    return " ".join(value.split())[:_MAX_STATUS]


def parse_watchdog_interval(env: Mapping[str, str], pid: int | None = None) -> float | None:
    """Seconds between watchdog pings (half of `WATCHDOG_USEC`, as sd_watchdog_enabled advises).

    None when the watchdog is off, malformed, or meant for another process (`WATCHDOG_PID`).
    """
    raw = env.get("WATCHDOG_USEC", "").strip()
    if not raw:
        return None
    owner = env.get("WATCHDOG_PID", "").strip()
    if owner:
        try:
            if int(owner) != (os.getpid() if pid is None else pid):
                return None
        except ValueError:
            return None
    try:
        usec = int(raw)
    except ValueError:
        return None
    if usec <= 0:
        return None
    return usec / 1_000_000 / 2


def _address(raw: str) -> str | bytes | None:
    if not raw:
        return None
    if raw.startswith("@"):
        return b"\0" + raw[1:].encode()  # Linux abstract namespace
    if raw.startswith("/"):
        return raw
    return None  # systemd also knows vsock addresses; a runner on a lab host never gets one


class Notifier:
    """Talks to the service manager named by the environment (`os.environ` by default)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self._addr = _address(env.get("NOTIFY_SOCKET", ""))
        self.watchdog_interval = parse_watchdog_interval(env) if self._addr is not None else None
        self._sock: socket.socket | None = None
        self._last_ping = 0.0
        self._warned = False
        self._last_status: str | None = None

    @property
    def enabled(self) -> bool:
        return self._addr is not None

    def send(self, *assignments: str) -> bool:
        """Send `KEY=value` lines as one datagram; True when the manager got it."""
        if self._addr is None:
            return False
        payload = "\n".join(assignments).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)  # never stall the event loop on a busy manager
            self._sock.sendto(payload, self._addr)
            return True
        except OSError as e:
            if not self._warned:  # once: a broken socket would otherwise flood the log every tick
                log.warning("sd_notify failed", socket=str(self._addr), error=str(e))
                self._warned = True
            return False

    def ready(self, status: str | None = None) -> bool:
        lines = ["READY=1"]
        if status is not None:
            lines.append(f"STATUS={_sanitize(status)}")
            self._last_status = _sanitize(status)
        return self.send(*lines)

    def status(self, text: str) -> bool:
        """Set the one-line status; unchanged text is not resent."""
        clean = _sanitize(text)
        if clean == self._last_status:
            return True
        self._last_status = clean
        return self.send(f"STATUS={clean}")

    def watchdog(self, *, force: bool = False) -> bool:
        """Ping the watchdog when half its timeout has passed (call it from every main-loop tick)."""
        if self.watchdog_interval is None:
            return False
        now = time.monotonic()
        if not force and self._last_ping and now - self._last_ping < self.watchdog_interval:
            return False
        self._last_ping = now
        return self.send("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        lines = ["STOPPING=1"]
        if status is not None:
            lines.append(f"STATUS={_sanitize(status)}")
        return self.send(*lines)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
