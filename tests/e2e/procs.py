"""The real `gh-server` and `gh-runner` as subprocesses, for the end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Protocol

import httpx

from .chromium import OUTPUT_DIR

BIN = Path(sys.executable).parent
LIBVIRT_URI = os.environ.get("GH_TEST_LIBVIRT_URI", "qemu:///system")


class Closable(Protocol):
    def close(self) -> None: ...


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gh-server exited with {self.proc.returncode}; see {self.log.name}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/healthz", timeout=5).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"gh-server did not answer /healthz within {timeout:.0f} s")

    def stop(self) -> None:
        stop_process(self.proc, 30)
        self.log.close()


class Runner:
    def __init__(self, server_url: str, token: str, name: str, images_dir: Path, state_dir: Path,
                 slots: int = 2) -> None:
        self.name = name
        self.log = _log(f"gh-runner-{name}.log")
        # The token goes by environment, never argv: `ps` would show it.
        env = {**os.environ, "GH_RUNNER_TOKEN": token}
        self.proc = subprocess.Popen(
            [str(BIN / "gh-runner"), "--server", server_url, "--name", name, "--slots", str(slots),
             "--images-dir", str(images_dir), "--state-dir", str(state_dir), "--libvirt-uri", LIBVIRT_URI,
             "--log-format", "json"],
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


def domains(prefix: str) -> list[str]:
    out = subprocess.run(["virsh", "-c", LIBVIRT_URI, "list", "--all", "--name"],
                         capture_output=True, text=True, timeout=30, check=False)
    return [n for n in out.stdout.split() if n.startswith(prefix)]


def tear_down(runners: list[Runner], client: Closable | None, server: Server, runner_name: str, work: Path) -> None:
    """Stop everything a scenario started, and clear whatever a failed run left, so the next session
    starts clean (the scenario's own checks report leftovers before this runs)."""
    for r in runners:
        r.stop(timeout=120)
    if client is not None:
        client.close()
    server.stop()
    for name in domains(f"gh-{runner_name}-"):
        subprocess.run(["virsh", "-c", LIBVIRT_URI, "destroy", name], capture_output=True, timeout=60)
    shutil.rmtree(work, ignore_errors=True)
