"""The scale-out topology: N gh-server processes on one PostgreSQL behind HAProxy (the Debian package),
as docs/operations.md describes it. Used by the topology test and bench/scale_out.py."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from kit.net import free_port, wait_healthy

from .procs import LOG_DIR, ServerProc, admin_key

HAPROXY_CONFIG = """\
global
    # Two sockets per proxied connection: 4096 connections fit a default 20,000 descriptor limit.
    maxconn 4096
    log stderr format short local0 warning

defaults
    mode http
    log global
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    # A runner's websocket is one long tunnel: its heartbeats keep it well inside this.
    timeout tunnel 1h
    # A request to a process that just died goes to another one.
    option redispatch
    retries 2

frontend gh
    bind 127.0.0.1:{port}
    default_backend gh_servers

backend gh_servers
    # Websockets are long: spread them by count, not by turn.
    balance leastconn
    option httpchk GET /healthz
    http-check expect status 200
    # No on-marked-down shutdown-sessions: a health-check blip must not cut live runner sockets (a
    # runner that moves loses its running agents); a process that dies drops them anyway.
    default-server inter 1s fall 2 rise 1
{servers}
"""


def haproxy_binary() -> str:
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if found is None:
        raise RuntimeError("HAProxy is not installed: apt-get install haproxy (scripts/setup.sh installs it)")
    return found


class HAProxy:
    def __init__(self, backends: list[int], port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/v1/runners/connect"
        self.dir = Path(tempfile.mkdtemp(prefix="gh-haproxy-", dir="/var/tmp"))
        servers = "\n".join(f"    server s{i} 127.0.0.1:{p} check" for i, p in enumerate(backends, 1))
        self.config = self.dir / "haproxy.cfg"
        self.config.write_text(HAPROXY_CONFIG.format(port=self.port, servers=servers))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> HAProxy:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        check = subprocess.run([haproxy_binary(), "-c", "-f", str(self.config)], capture_output=True, text=True,
                               timeout=30, check=False)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy config invalid: {check.stdout}{check.stderr}")
        with (LOG_DIR / f"haproxy-{self.port}.log").open("ab") as log:
            self.proc = subprocess.Popen([haproxy_binary(), "-db", "-f", str(self.config)], stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.proc.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"haproxy did not listen within {timeout} s")

    def wait_backends_up(self, timeout: float = 30.0) -> None:
        """Healthy through the proxy (its checks mark a fresh backend up within `inter`)."""
        wait_healthy(self.url, timeout=timeout, what="haproxy's backends")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


class Topology:
    """`n` gh-server processes on `database_url`, HAProxy in front. Agents get the proxy's URL."""

    def __init__(self, database_url: str, n: int, **settings: Any) -> None:
        self.key = admin_key()
        ports = [free_port() for _ in range(n)]
        self.proxy = HAProxy(ports)
        settings.setdefault("public_url", self.proxy.url)
        self.servers = [ServerProc(database_url, self.key, port=p, name=f"gh-server-{i}", **settings)
                        for i, p in enumerate(ports, 1)]

    def start(self) -> Topology:
        """Start everything, or stop what did start and re-raise (nothing is left running)."""
        try:
            self.servers[0].start()  # the first one migrates the schema; the others find it done
            for s in self.servers[1:]:
                s.start(wait=False)
            for s in self.servers[1:]:
                s.wait_healthy()
            self.proxy.start()
            self.proxy.wait_backends_up()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        self.proxy.stop()
        for s in self.servers:
            s.close()
