"""A synchronous QEMU guest agent client over the host side of the virtio-serial channel.

Readiness is a guest-sync-delimited round trip: requests written before the agent runs stay
queued in the channel and are answered later, so only the answer to the newest sync id means
the stream is aligned."""

from __future__ import annotations

import base64
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BuildError
from .jsonsock import JsonSocket


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str


class QGA:
    def __init__(self, path: Path) -> None:
        self.js = JsonSocket(path)

    def wait_ready(self, timeout: float) -> float:
        """Block until the agent answers; returns the seconds it took.

        NOTE: until the guest opens its end of the port QEMU reads nothing from our socket, so the
        sync requests pile up in the socket's send buffer; a boot of minutes (a desktop) fills it
        and a send would block. So the interval between requests grows, and a send that cannot
        go through reconnects (which drops what QEMU never read)."""
        start = time.monotonic()
        deadline = start + timeout
        try:
            self.js.connect(deadline)
        except TimeoutError as e:
            raise BuildError(f"the guest agent socket: {e}") from None
        interval = 1.0
        while time.monotonic() < deadline:
            sync_id = random.randint(1, 2**31 - 1)
            try:
                try:
                    self.js.send({"execute": "guest-sync-delimited", "arguments": {"id": sync_id}}, timeout=2.0)
                except TimeoutError:
                    self.js.close()
                    self.js.connect(deadline)
                    continue
                step = min(deadline, time.monotonic() + interval)
                while (reply := self.js.recv(step)) is not None:
                    if reply.get("return") == sync_id:
                        self.execute("guest-ping", timeout=max(1.0, deadline - time.monotonic()))
                        return time.monotonic() - start
            except OSError as e:
                raise BuildError(f"the guest agent channel closed while waiting for it ({e}): did QEMU exit?") from None
            interval = min(interval * 1.5, 5.0)
        raise BuildError(f"the guest agent did not answer within {timeout:.0f} s")

    def execute(self, command: str, arguments: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        msg: dict[str, Any] = {"execute": command}
        if arguments:
            msg["arguments"] = arguments
        try:
            self.js.send(msg)
            reply = self.js.recv(deadline)
        except OSError as e:  # QEMU went away (crashed, or the guest powered off)
            raise BuildError(f"guest agent {command}: connection lost ({e})") from None
        if reply is None:
            raise BuildError(f"guest agent {command}: no answer within {timeout:.0f} s")
        if "error" in reply:
            raise BuildError(f"guest agent {command}: {reply['error'].get('desc', reply['error'])}")
        return reply.get("return")

    def run_script(self, shell: str, script: str, timeout: float = 120.0) -> ExecResult:
        """Run a script by feeding it to the shell on stdin (never argv: no length limit, no quoting)."""
        deadline = time.monotonic() + timeout
        pid = self.execute(
            "guest-exec",
            {"path": shell, "input-data": base64.b64encode(script.encode()).decode(), "capture-output": True},
        )["pid"]
        delay = 0.02
        while time.monotonic() < deadline:
            st = self.execute("guest-exec-status", {"pid": pid}, timeout=max(1.0, deadline - time.monotonic()))
            if st.get("exited"):
                out = base64.b64decode(st.get("out-data", "")).decode(errors="replace")
                err = base64.b64decode(st.get("err-data", "")).decode(errors="replace")
                return ExecResult(int(st.get("exitcode", -1)), out, err)
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
        raise BuildError(f"guest script did not finish within {timeout:.0f} s")

    def shutdown(self) -> None:
        """Ask the guest to power off; the agent does not answer this one when it succeeds."""
        self.js.send({"execute": "guest-shutdown", "arguments": {"mode": "powerdown"}})

    def close(self) -> None:
        self.js.close()
