"""Newline-delimited JSON over a Unix socket, with deadlines: the transport under QMP and QGA."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any


class JsonSocket:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock: socket.socket | None = None
        self.buf = b""

    def connect(self, deadline: float, poll_s: float = 0.05) -> None:
        """Connect, retrying every `poll_s` while QEMU has not created the socket yet."""
        last: OSError | None = None
        while time.monotonic() < deadline:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.settimeout(max(0.05, min(2.0, deadline - time.monotonic())))
                s.connect(str(self.path))
                self.sock = s
                self.buf = b""
                return
            except OSError as e:
                s.close()
                last = e
                time.sleep(poll_s)
        raise TimeoutError(f"could not connect to {self.path}: {last}")

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def send(self, obj: dict[str, Any], timeout: float = 30.0) -> None:
        """Raises TimeoutError when the peer has not read what was sent before for `timeout`."""
        assert self.sock is not None, "not connected"
        self.sock.settimeout(timeout)
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def recv(self, deadline: float) -> dict[str, Any] | None:
        """The next JSON object, or None at the deadline. Bytes before a 0xFF delimiter (QGA's
        guest-sync-delimited) and lines that are not JSON are dropped."""
        assert self.sock is not None, "not connected"
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                line = line.rsplit(b"\xff", 1)[-1].strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    return obj
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return None
            if not chunk:
                raise ConnectionError(f"{self.path}: peer closed the connection")
            self.buf += chunk
