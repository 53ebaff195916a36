"""Real `gh-server` processes (the CLI, as an operator starts it) on one PostgreSQL, for the scale-out tests
and bench/scale_out.py. Short liveness bounds so failover is quick to see; every wait has a deadline."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from kit.net import free_port, wait_healthy

BIN = Path(sys.executable).parent
LOG_DIR = Path(os.environ.get("GH_TEST_OUTPUT", "/var/tmp/gh-test-output")) / "scaleout"


class ServerProc:
    """One gh-server process. `settings` go to its --config file (any Settings field)."""

    def __init__(self, database_url: str, admin_key: str, *, port: int | None = None, name: str = "gh-server",
                 **settings: Any) -> None:
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/v1/runners/connect"
        self.database_url = database_url
        self.admin_key = admin_key
        self.name = name
        self.dir = Path(tempfile.mkdtemp(prefix="gh-proc-", dir="/var/tmp"))
        # No retry backoff (as the in-process harness, tests/gateway/conftest.py): these tests follow a
        # retry as it is leased; the backoff itself is tested in test_leasing.py.
        base: dict[str, Any] = {"heartbeat_interval": 0.5, "dead_after": 3.0, "runner_grace_seconds": 2.0,
                                "retry_backoff_seconds": [0.0],
                                "webhook_allow": ["127.0.0.1"]}  # the tests' receivers are on loopback
        base.update(settings)
        self.config = self.dir / "config.yaml"
        self.config.write_text(yaml.safe_dump(_plain(base)))
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.log_path = LOG_DIR / f"{name}-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait: bool = True) -> ServerProc:
        env = {**os.environ, "GH_SERVER_API_KEY": self.admin_key}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(BIN / "gh-server"), "--data-dir", str(self.dir / "data"), "--database-url", self.database_url,
                 "--host", "127.0.0.1", "--port", str(self.port), "--config", str(self.config),
                 "--log-level", "warning"],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        if wait:
            try:
                self.wait_healthy()
            except BaseException:
                self.kill()
                raise
        return self

    def wait_healthy(self, timeout: float = 90.0) -> None:
        assert self.proc is not None
        wait_healthy(self.base_url, proc=self.proc, log=self.log_path, timeout=timeout, what=self.name)

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to clean up (what a crash or an OOM kill leaves)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def close(self) -> None:
        self.stop()
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


def admin_key() -> str:
    return "gh_live_test_" + secrets.token_urlsafe(16)


def _plain(v: Any) -> Any:
    """Settings objects (AgentConfig, ModelEndpoint) as the YAML a config file holds."""
    if hasattr(v, "model_dump"):
        return v.model_dump(mode="json", exclude_none=True)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v
