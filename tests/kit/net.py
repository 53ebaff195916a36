"""Loopback ports and waiting for a server that has just been started to answer."""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import httpx

POLL_S = 0.1  # a starting process gives no readiness signal: poll it, with a deadline


def free_port() -> int:
    """A loopback port nothing listens on now (the kernel's pick, so an ephemeral one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_answering(url: str, *, what: str, proc: subprocess.Popen[Any] | None = None, log: Path | None = None,
                   timeout: float = 90.0, ok: Collection[int] = (200,), verify: ssl.SSLContext | bool = True) -> None:
    """Poll `url` until it answers with a status in `ok`.

    Raises:
        RuntimeError: `proc` exited first (its exit code and the end of `log`, or of its stderr pipe, in
            the message), or `timeout` seconds passed.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{_output_tail(proc, log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=5, verify=verify).status_code in ok:
                return
        time.sleep(POLL_S)
    where = f"; see {log}" if log is not None else ""
    raise RuntimeError(f"{what} did not answer {url} within {timeout:g} s{where}")


def wait_healthy(base_url: str, *, proc: subprocess.Popen[Any] | None = None, log: Path | None = None,
                 timeout: float = 90.0, what: str = "gh-server") -> None:
    """Until gh-server at `base_url` answers /healthz with 200 (see `wait_answering` for what it raises)."""
    wait_answering(f"{base_url}/healthz", what=what, proc=proc, log=log, timeout=timeout)


def _output_tail(proc: subprocess.Popen[Any], log: Path | None) -> str:
    if log is not None:
        return f"see {log}:\n" + (log.read_bytes()[-1500:].decode(errors="replace") if log.exists() else "")
    if proc.stderr is not None:
        out = proc.stderr.read()
        return (out.decode(errors="replace") if isinstance(out, bytes) else str(out))[-3000:]
    return ""
