"""A small synchronous QMP client: enough to query, screendump and quit a build VM."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .errors import BuildError
from .jsonsock import JsonSocket


class QMP:
    def __init__(self, path: Path) -> None:
        self.js = JsonSocket(path)

    def connect(self, timeout: float = 10.0, poll_s: float = 0.05) -> None:
        deadline = time.monotonic() + timeout
        self.js.connect(deadline, poll_s)
        greeting = self.js.recv(deadline)
        if not greeting or "QMP" not in greeting:
            raise BuildError(f"{self.js.path}: no QMP greeting")
        self.execute("qmp_capabilities", timeout=timeout)

    def execute(self, command: str, arguments: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
        deadline = time.monotonic() + timeout
        msg: dict[str, Any] = {"execute": command}
        if arguments:
            msg["arguments"] = arguments
        try:
            self.js.send(msg)
        except OSError as e:
            raise BuildError(f"QMP {command}: connection lost ({e})") from None
        while True:
            try:
                reply = self.js.recv(deadline)
            except OSError as e:
                raise BuildError(f"QMP {command}: connection lost ({e})") from None
            if reply is None:
                raise BuildError(f"QMP {command}: no answer within {timeout:.0f} s")
            if "return" in reply:
                return reply["return"]
            if "error" in reply:
                raise BuildError(f"QMP {command}: {reply['error'].get('desc', reply['error'])}")
            # anything else is an asynchronous event; skip it

    def close(self) -> None:
        self.js.close()
