"""The real `gh-server` and `gh-runner` as subprocesses, for the end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, Protocol

from kit.libvirt import LIBVIRT_URI, domains, virsh
from kit.net import free_port, wait_healthy

from .chromium import OUTPUT_DIR

BIN = Path(sys.executable).parent


class Closable(Protocol):
    def close(self) -> None: ...


def ephemeral_ports() -> range:
    """The ports the kernel hands out to outgoing connections (and to a bind on port 0)."""
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return range(low, high + 1)


def restartable_port() -> int:
    """A free port outside the ephemeral range, for a server that must get its port back after a
    kill. `free_port()` returns an ephemeral port: while its server is down, any outgoing loopback
    connection on this shared host (the waiting runner's own reconnects included) may be given it as
    its local port, and the restarted server then cannot listen (gh-server exits 2)."""
    ephemeral = ephemeral_ports()
    candidates = [p for p in range(10000, 30000) if p not in ephemeral]
    random.shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port outside the ephemeral range")


def _log(name: str) -> IO[bytes]:
    path = OUTPUT_DIR / "e2e" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("ab")


class Server:
    def __init__(self, data_dir: Path, config: Path, api_key: str) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log = _log("gh-server.log")
        env = {**os.environ, "GH_SERVER_API_KEY": api_key}
        self.proc = subprocess.Popen(
            [str(BIN / "gh-server"), "--data-dir", str(data_dir), "--host", "127.0.0.1", "--port", str(self.port),
             "--config", str(config), "--log-level", "warning"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def wait_healthy(self, timeout: float = 90.0) -> None:
        wait_healthy(self.base_url, proc=self.proc, log=Path(self.log.name), timeout=timeout)

    def stop(self) -> None:
        stop_process(self.proc, 30)
        self.log.close()


class Runner:
    def __init__(self, server_url: str, token: str, name: str, images_dir: Path, state_dir: Path,
                 slots: int = 2, config: Path | None = None) -> None:
        self.name = name
        self.log = _log(f"gh-runner-{name}.log")
        # The token goes by environment, never argv: `ps` would show it.
        env = {**os.environ, "GH_RUNNER_TOKEN": token}
        self.proc = subprocess.Popen(
            [str(BIN / "gh-runner"), "--server", server_url, "--name", name, "--slots", str(slots),
             "--images-dir", str(images_dir), "--state-dir", str(state_dir), "--libvirt-uri", LIBVIRT_URI,
             "--log-format", "json", *(["--config", str(config)] if config is not None else [])],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def kill(self) -> None:
        """SIGKILL: no drain, no cleanup; the next start must recover."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, timeout: float = 300.0) -> int:
        code = stop_process(self.proc, timeout)
        self.log.close()
        return code


def stop_process(proc: subprocess.Popen[bytes], timeout: float) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    return int(proc.returncode)


def tear_down(runners: list[Runner], client: Closable | None, server: Server, runner_name: str, work: Path) -> None:
    """Stop everything a scenario started, and clear whatever a failed run left, so the next session
    starts clean (the scenario's own checks report leftovers before this runs)."""
    for r in runners:
        r.stop(timeout=120)
    if client is not None:
        client.close()
    server.stop()
    for name in domains(f"gh-{runner_name}-"):
        virsh("destroy", name, timeout=60)
    shutil.rmtree(work, ignore_errors=True)


class RestartableServer:
    """gh-server on a fixed port, so that the runner's one URL finds it again after a kill."""

    def __init__(self, data_dir: Path, config: Path, log: Path) -> None:
        self.data_dir, self.config, self.log_path = data_dir, config, log
        self.port = restartable_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.api_key = "gh_live_" + secrets.token_urlsafe(24)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [str(BIN / "gh-server"), "--data-dir", str(self.data_dir), "--host", "127.0.0.1", "--port",
             str(self.port), "--config", str(self.config), "--log-level", "info"],
            env={**os.environ, "GH_SERVER_API_KEY": self.api_key}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        log.close()  # the child has its own copy
        wait_healthy(self.base_url, proc=self.proc, log=self.log_path)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, 30)


def wait_for_log(path: Path, pred: Any, timeout: float) -> dict[str, Any]:
    """The first JSON log line of `path` for which `pred` holds (polled: the runner is another process)."""
    deadline = time.monotonic() + timeout
    offset = 0
    while time.monotonic() < deadline:
        with path.open("rb") as f:
            f.seek(offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        offset += len(complete)
        for line in complete.splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and pred(event):
                    return event
        time.sleep(0.02)
    raise AssertionError(f"no such line in {path} within {timeout:.0f} s")
