"""Fixtures for the OSWorld importer's tests: task files written here (none of OSWorld's own), a real HTTP
server on 127.0.0.1 for the downloads (no test reaches the internet), and a runner for generated scripts.

Generated scripts are POSIX sh; the unit tests run them with the host's dash and bash in a scratch home
(the real scripts, not the guest: the guest runs them in tests/osworld/test_osworld_desktop.py), their
`python3` the guest's as tests/osworld_guest/kit.py runs it (Debian's, with gh_osworld and the guest's PyPI
pins on its path).
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import structlog
from osworld_guest.kit import GUEST_PYTHON, guest_env

from gh_local.osworld.fetch import Fetcher
from gh_local.osworld.importer import task_to_case
from gh_local.osworld.target import Target
from gh_local.osworld.task import LoadedTask, Task

SHELLS = ["dash", "bash"]


def task(**fields: Any) -> dict[str, Any]:
    """An OSWorld-format task with defaults for what a test does not care about."""
    base: dict[str, Any] = {"id": "task-1", "snapshot": "os", "instruction": "Do the thing.", "source": "tests",
                            "related_apps": ["os"], "config": [],
                            "evaluator": {"func": "exact_match",
                                          "result": {"type": "vm_command_line", "command": "echo hi", "shell": True},
                                          "expected": {"type": "rule", "rules": {"expected": "hi\n"}}}}
    base.update(fields)
    return base


def write_task(directory: Path, data: dict[str, Any], name: str | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name or data['id']}.json"
    path.write_text(json.dumps(data))
    return path


def case_of(data: dict[str, Any], fetcher: Fetcher, start_state: str = "osworld-desktop") -> dict[str, Any]:
    return task_to_case(LoadedTask(Task.model_validate(data), Path("t.json"), "os"), Target.named(start_state), fetcher)


@dataclass
class Ran:
    code: int
    out: str
    err: str

    @property
    def verdict(self) -> str:
        lines = [ln for ln in self.out.splitlines() if ln.strip()]
        return lines[-1] if lines else ""


def run_script(script: str, home: Path, *, shell: str = "dash", phase: str = "after", answer: str = "",
               path_prefix: Path | None = None, env: dict[str, str] | None = None) -> Ran:
    # `python3` is the guest's (the check runs `python3 -m gh_osworld`), first on PATH after path_prefix.
    guest_bin = home.parent / "guest-bin"
    guest_bin.mkdir(exist_ok=True)
    if not (guest_bin / "python3").exists():
        (guest_bin / "python3").symlink_to(GUEST_PYTHON)
    path = (f"{path_prefix}:" if path_prefix else "") + f"{guest_bin}:" + os.environ["PATH"]
    env = {"HOME": str(home), "PATH": path, "PYTHONPATH": guest_env()["PYTHONPATH"], "PYTHONDONTWRITEBYTECODE": "1",
           "GH_CHECK_PHASE": phase, "GH_AGENT_ANSWER": answer, "TMPDIR": str(home / "tmp"), "LANG": "C.UTF-8",
           **(env or {})}
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    p = subprocess.run([shell, "-c", script], env=env, cwd=home, capture_output=True, text=True, timeout=60)
    return Ran(p.returncode, p.stdout, p.stderr)


@pytest.fixture(autouse=True)
def _process_logging_restored() -> Iterator[None]:
    """The entry point, run in process here, configures the process's logging to the stream of the
    moment: pytest's capture, closed after the test. Put it back, or every later test that logs
    writes into a closed file (seen: the provider and registry tests after these failed with
    "I/O operation on closed file")."""
    handlers, level = logging.root.handlers[:], logging.root.level
    yield
    structlog.reset_defaults()
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    d = tmp_path / "home"
    d.mkdir()
    return d


@dataclass
class Served:
    """A real HTTP server on 127.0.0.1 serving `files` (path -> bytes), counting the requests per path."""

    url: str
    files: dict[str, bytes] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)


@pytest.fixture()
def served() -> Iterator[Served]:
    state = Served(url="")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.hits[self.path] = state.hits.get(self.path, 0) + 1
            body = state.files.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture()
def fetcher(tmp_path: Path) -> Iterator[Fetcher]:
    f = Fetcher(tmp_path / "files", timeout=5, deadline=20)
    try:
        yield f
    finally:
        f.close()
