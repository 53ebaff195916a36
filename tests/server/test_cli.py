"""The real `gh-server` console script as a subprocess: --version, `runners create|list|revoke` on the data
dir's database (the token it prints connects; once revoked it does not), and exit 2 for a port in use,
said before anything starts."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
from kit.net import free_port, wait_healthy

BIN = Path(sys.executable).parent


def gh_server(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GH_SERVER_")}
    return subprocess.run([str(BIN / "gh-server"), *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_version() -> None:
    out = gh_server("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("gh-server 0."), out.stdout


def test_help_lists_every_command() -> None:
    out = gh_server("--help")
    assert out.returncode == 0
    for needle in ("keys", "runners", "migrate", "--version"):
        assert needle in out.stdout
    out = gh_server("runners", "create", "--help")
    assert out.returncode == 0 and "NAME" in out.stdout and "--labels" in out.stdout


def _runner_by_token(data_dir: Path, token: str) -> tuple[str, str] | None:
    from gh_server import db
    from gh_server.runner_rows import runner_by_token as lookup
    from gh_server.settings import Settings

    engine = db.make_engine(Settings(data_dir=data_dir))
    try:
        with db.make_sessionmaker(engine)() as s:
            return lookup(s, token)
    finally:
        engine.dispose()


def test_runners_create_list_revoke(tmp_path: Path) -> None:
    out = gh_server("runners", "create", "lab-1", "--labels", "lab,gpu", "--data-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    runner_id, _, token = out.stdout.strip().partition(" (lab-1): ")
    assert runner_id.startswith("rn_") and token.startswith("gh_rn_"), out.stdout
    assert "not shown again" in out.stderr and "--name lab-1 --labels lab,gpu" in out.stderr
    assert token not in out.stderr  # printed once
    assert _runner_by_token(tmp_path, token) == (runner_id, "lab-1")
    listed = gh_server("runners", "list", "--data-dir", str(tmp_path))
    assert listed.returncode == 0
    cols = listed.stdout.strip().split("\t")
    assert cols[:4] == [runner_id, "lab-1", "offline", "lab,gpu"], listed.stdout
    assert token not in listed.stdout
    revoked = gh_server("runners", "revoke", runner_id, "--data-dir", str(tmp_path))
    assert revoked.returncode == 0, revoked.stderr
    assert _runner_by_token(tmp_path, token) is None
    assert "\trevoked\t" in gh_server("runners", "list", "--data-dir", str(tmp_path)).stdout
    again = gh_server("runners", "revoke", runner_id, "--data-dir", str(tmp_path))
    assert again.returncode == 1 and "no runner" in again.stderr
    usage = gh_server("runners", "create", "--data-dir", str(tmp_path))
    assert usage.returncode == 2 and "NAME" in usage.stderr


def test_a_port_in_use_exits_2_before_starting(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = gh_server("--data-dir", str(tmp_path), "--port", str(port))
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr and "--port" in out.stderr
    assert "startup complete" not in out.stderr.lower() and "Traceback" not in out.stderr


def test_serves_on_the_socket_it_bound_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GH_SERVER_")}
    proc = subprocess.Popen([str(BIN / "gh-server"), "--data-dir", str(tmp_path), "--port", str(port),
                             "--log-level", "warning"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc=proc, timeout=90)
        proc.send_signal(signal.SIGTERM)
        # uvicorn re-raises the signal it caught once it has shut down (as it did under uvicorn.run).
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_only_the_configured_proxies_say_https(tmp_path: Path) -> None:
    """GH_SERVER_TRUSTED_PROXIES is the one list believed: a proxy there saying https gets the `__Host-` Secure
    cookie; loopback, trusted by uvicorn's own default, is not once the list leaves it out."""
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GH_SERVER_")},
           "GH_SERVER_TRUSTED_PROXIES": "127.0.0.2"}
    env.pop("FORWARDED_ALLOW_IPS", None)
    proc = subprocess.Popen([str(BIN / "gh-server"), "--data-dir", str(tmp_path), "--port", str(port),
                             "--log-level", "warning"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc=proc, timeout=90)
        key = (tmp_path / "admin-api-key").read_text().strip()
        names = {}
        for source in ("127.0.0.2", "127.0.0.1"):
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                              transport=httpx.HTTPTransport(local_address=source)) as c:
                r = c.post("/v1/console/session", json={"api_key": key}, headers={"X-Forwarded-Proto": "https"})
                assert r.status_code == 200, r.text
                names[source] = r.headers["set-cookie"].split("=", 1)[0], "secure" in r.headers["set-cookie"].lower()
        assert names == {"127.0.0.2": ("__Host-gh_console", True), "127.0.0.1": ("gh_console", False)}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
