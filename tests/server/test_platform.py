# mypy: disable-error-code="arg-type,list-item,typeddict-item,misc,index"
"""Keys and roles, webhooks (signature, retries), the error envelope, /openapi.json, /healthz, rate limits,
schema migrations that keep data, and the `gh-server` command itself."""

from __future__ import annotations

import io
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pydantic
import pytest
import yaml
from guidinghand import (
    AuthenticationError,
    InvalidRequestError,
    PermissionDeniedError,
    RateLimitError,
    WebhookVerificationError,
    verify_webhook,
)
from kit.net import free_port, wait_healthy
from sqlalchemy import create_engine, text

from gh_server import db
from gh_server.auth import ensure_admin_key
from gh_server.settings import Settings

from .conftest import RunningServer, Server, make_settings

REPO = Path(__file__).resolve().parents[2]


def test_public_endpoints_and_envelope(server: Server) -> None:
    r = httpx.get(server.base_url + "/healthz", timeout=10)
    assert r.status_code == 200 and r.json() == {"ok": True}
    spec = httpx.get(server.base_url + "/openapi.json", timeout=10).json()
    paths = spec["paths"]
    for p, methods in {
        "/v1/test_cases": {"get", "post"},
        "/v1/test_cases/batch": {"post"},
        "/v1/test_cases/{test_case_id}": {"get", "patch", "delete"},
        "/v1/test_sets/{test_set_id}/cases": {"post"},
        "/v1/test_sets/{test_set_id}/cases/{test_case_id}": {"delete"},
        "/v1/test_runs": {"get", "post"},
        "/v1/test_runs/compare": {"get"},
        "/v1/test_runs/{test_run_id}/results": {"get"},
        "/v1/test_runs/{test_run_id}/attempts": {"get"},
        "/v1/test_runs/{test_run_id}/rerun": {"post"},
        "/v1/attempts/{attempt_id}": {"get"},
        "/v1/start_states/{start_state_id}/screen": {"get"},
        "/v1/runners/{runner_id}": {"delete"},
        "/v1/webhook": {"get", "put"},
        "/v1/api_keys": {"get", "post"},
    }.items():
        assert methods <= set(paths[p]), p
    # every failure is the SDK's envelope, never FastAPI's {"detail": ...}
    for method, path, body, status, etype in [
        ("GET", "/v1/test_cases", None, 401, "authentication"),
        ("GET", "/v1/nothing-here", None, 404, "not_found"),
        ("POST", "/v1/test_cases", "{not json", 400, "invalid_request"),
        ("POST", "/v1/test_cases", {"name": "x"}, 400, "invalid_request"),
    ]:
        headers = {} if status == 401 else {"Authorization": f"Bearer {server.admin_key}"}
        content = body if isinstance(body, str) else json.dumps(body) if body is not None else None
        if content is not None:
            headers["Content-Type"] = "application/json"
        r = httpx.request(method, server.base_url + path, content=content, headers=headers, timeout=10)
        assert r.status_code == status, (path, r.text)
        err = r.json()["error"]
        assert err["type"] == etype and err["message"] and "detail" not in r.json()
    r = httpx.post(
        server.base_url + "/v1/test_cases",
        json={"name": "x"},
        headers={"Authorization": f"Bearer {server.admin_key}"},
        timeout=10,
    )
    assert r.json()["error"]["param"] == "prompt" and "prompt" in r.json()["error"]["message"]
    r = httpx.get(server.base_url + "/v1/test_cases", headers={"Authorization": "Basic abc"}, timeout=10)
    assert r.status_code == 401
    for path in ("/docs", "/redoc"):  # nothing public but /openapi.json and /healthz
        assert httpx.get(server.base_url + path, timeout=10).status_code == 404


def test_api_keys_endpoint_and_roles(server: Server) -> None:
    c = server.admin
    made = c._request("POST", "/v1/api_keys", body={"name": "ci", "role": "member"})
    assert made["role"] == "member" and made["key"].startswith("gh_live_")
    member = server.client(made["key"])
    assert member.test_cases.list()["object"] == "list"
    with pytest.raises(PermissionDeniedError):
        member.test_cases.create("x", "p", "linux-tiny", {"rubric": "r"})
    with pytest.raises(PermissionDeniedError):
        member._request("POST", "/v1/api_keys", body={"name": "escalate", "role": "admin"})
    listed = c._request("GET", "/v1/api_keys")["data"]
    assert made["id"] in [k["id"] for k in listed] and all("key" not in k for k in listed)
    with pytest.raises(InvalidRequestError) as e:
        c._request("POST", "/v1/api_keys", body={"name": "x", "role": "owner"})
    assert e.value.extra["param"] == "role"
    c._request("DELETE", f"/v1/api_keys/{made['id']}")
    with pytest.raises(AuthenticationError):
        member.test_cases.list()


def test_admin_key_file_is_0600_and_printed_once(server: Server) -> None:
    path = server.data_dir / "admin-api-key"
    assert (path.stat().st_mode & 0o777) == 0o600
    out = io.StringIO()
    assert ensure_admin_key(server.state, out) is None and out.getvalue() == ""  # not on a later start


class _Receiver:
    """A local webhook endpoint: records each delivery, answers with the next queued status (200 after)."""

    def __init__(self) -> None:
        self.got: queue.Queue[tuple[dict[str, str], bytes]] = queue.Queue()
        self.statuses: list[int] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.got.put(({k: v for k, v in self.headers.items()}, body))
                self.send_response(outer.statuses.pop(0) if outer.statuses else 200)
                self.end_headers()

            def log_message(self, *a: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    r = _Receiver()
    yield r
    r.close()


def test_webhook_signed_and_retried(server: Server, receiver: _Receiver) -> None:
    c = server.admin
    with pytest.raises(PermissionDeniedError):
        server.member.webhook.update(url=receiver.url)
    with pytest.raises(InvalidRequestError) as e:
        c.webhook.update(url="ftp://x")
    assert e.value.extra["param"] == "url"
    with pytest.raises(InvalidRequestError) as e:
        c.webhook.update(url=receiver.url, events=["task.nope"])
    assert e.value.extra["param"] == "events[0]"
    hook = c.webhook.update(url=receiver.url, events=["test_run.completed"])
    secret = hook["secret"]
    assert secret.startswith("whsec_") and hook["has_secret"] and hook["events"] == ["test_run.completed"]
    assert "secret" not in c.webhook.retrieve() and c.webhook.retrieve()["url"] == receiver.url
    c.test_cases.create("hook case", "p", "linux-tiny", {"rubric": "r"}, key="HOOK-1")
    run = c.test_runs.create(test_case_ids=["HOOK-1"], agents=["noop"])
    receiver.statuses = [500]  # the first delivery fails: it must come again
    c.test_runs.cancel(run["test_run_id"])
    _h1, body1 = receiver.got.get(timeout=30)
    headers2, body2 = receiver.got.get(timeout=60)
    assert body1 == body2
    event = verify_webhook(body2, headers2["Eager-Signature"], secret)
    assert event["type"] == "test_run.completed" and event["id"].startswith("evt_")
    assert event["data"]["test_run"]["test_run_id"] == run["test_run_id"]
    assert event["data"]["test_run"]["status"] == "cancelled"
    with pytest.raises(WebhookVerificationError):
        verify_webhook(body2, headers2["Eager-Signature"], "whsec_wrong")
    rotated = c.webhook.update(rotate_secret=True)
    assert rotated["secret"] != secret and rotated["url"] == receiver.url
    assert c.webhook.delete()["url"] is None


def test_rate_limit_is_429() -> None:
    settings, data_dir = make_settings(None, rate_limit_per_second=0.01, rate_limit_burst=3)
    running = RunningServer(settings)
    running.start()
    try:
        key = (data_dir / "admin-api-key").read_text().strip()
        from guidinghand import Eager

        c = Eager(api_key=key, base_url=f"http://127.0.0.1:{settings.port}", max_retries=0)
        for _ in range(3):
            c.test_cases.list()
        with pytest.raises(RateLimitError) as e:
            c.test_cases.list()
        assert e.value.status == 429 and e.value.type == "rate_limit"
        assert e.value.body["error"]["message"]  # the envelope, with Retry-After for clients that wait
    finally:
        running.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_upgrade_keeps_data(db_url: str | None) -> None:
    settings, data_dir = make_settings(db_url)
    engine = db.make_engine(settings)
    try:
        db.upgrade(engine, "0001_initial")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO test_cases (id, key, name, prompt, start_state, success, limits, runs_on, tags,"
                    " metadata,"
                    " created_at, updated_at) VALUES ('tc_keepme000001', 'KEEP-1', 'kept', 'p', 'linux-tiny',"
                    " '{\"rubric\": \"r\"}', '{\"minutes\": 10}', 'vm', '[]', '{}', :t, :t)"
                ),
                {"t": "2026-01-01 00:00:00"},
            )
            conn.execute(
                text(
                    'INSERT INTO start_states (id, name, "from", image, method, status, version, runner_labels,'
                    " metadata,"
                    " created_at, updated_at) VALUES ('ss_keepme000001', 'st', 'img', 'img', 'hand', 'ready', 1, '[]',"
                    " '{}', :t, :t)"
                ),
                {"t": "2026-01-01 00:00:00"},
            )
        db.upgrade(engine)
        from alembic.script import ScriptDirectory

        assert db.current_revision(engine) == ScriptDirectory.from_config(db.alembic_config()).get_current_head()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT name FROM test_cases WHERE key = 'KEEP-1'")).scalar() == "kept"
            assert conn.execute(text("SELECT description FROM start_states")).scalar() == ""
        db.upgrade(engine)  # idempotent
    finally:
        engine.dispose()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_gh_server_command_serves_with_env_admin_key() -> None:
    data_dir = Path(__import__("tempfile").mkdtemp(prefix="gh-server-cli-", dir="/var/tmp"))
    port = free_port()
    env = {**os.environ, "GH_SERVER_API_KEY": "gh_live_from_env_for_test"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gh_server.cli",
            "--data-dir",
            str(data_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc=proc, timeout=60)
        from guidinghand import Eager

        c = Eager(api_key="gh_live_from_env_for_test", base_url=f"http://127.0.0.1:{port}", max_retries=0)
        assert c.test_cases.list()["data"] == []
        assert not (data_dir / "admin-api-key").exists()
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "gh_server.cli",
                "keys",
                "create",
                "--role",
                "member",
                "--name",
                "cli",
                "--data-dir",
                str(data_dir),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        member_key = r.stdout.strip().rsplit(" ", 1)[-1]
        m = Eager(api_key=member_key, base_url=f"http://127.0.0.1:{port}", max_retries=0)
        assert m.test_runs.list()["object"] == "list"
        with pytest.raises(PermissionDeniedError):
            m.runners.create("x")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        shutil.rmtree(data_dir, ignore_errors=True)


def test_settings_url_for_postgres() -> None:
    s = Settings(data_dir=Path("/x"), database_url="postgresql://u@h/db")
    assert s.sqlalchemy_url == "postgresql+psycopg://u@h/db"
    assert create_engine(s.sqlalchemy_url).dialect.name == "postgresql"


def test_settings_precedence_and_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "server.yaml"
    cfg.write_text(
        "port: 9001\nhost: 0.0.0.0\nrunner-grace-seconds: 30\n"
        "agents:\n  mine:\n    kind: command\n    command: [./agent.sh]\n"
        "judge:\n  base_url: http://127.0.0.1:1/v1\n  model: m\n"
    )
    monkeypatch.setenv("GH_SERVER_PORT", "9002")
    monkeypatch.delenv("GH_SERVER_API_KEY", raising=False)
    s = Settings.from_env(config_file=cfg, data_dir=tmp_path)
    assert s.port == 9002 and s.host == "0.0.0.0" and s.runner_grace_seconds == 30  # env beats file
    assert s.agents["mine"].id == "mine" and s.agents["mine"].command == ["./agent.sh"]
    assert s.judge is not None and s.judge.model == "m"
    assert Settings.from_env(config_file=cfg, data_dir=tmp_path, port=9003).port == 9003  # flags beat env
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ValueError, match="mapping"):
        Settings.from_env(config_file=bad, data_dir=tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "gh_server.cli", "--config", str(bad), "migrate", "--data-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "bad settings" in r.stderr


@pytest.mark.parametrize(("agent", "message"), [
    ({"kind": "telepathy"}, "agents.mine.kind\n  Value error, kind is one of builtin, command, http, osworld, model"),
    ({"kind": "command"}, "kind command needs a non-empty `command`"),
    ({"kind": "http"}, "kind http needs a `url`"),
    ({"kind": "command", "comand": ["./agent.sh"]}, "Extra inputs are not permitted"),
    ({"kind": "builtin", "builtin": "oracle"}, "Input should be 'noop' or 'reference'"),
    # A model agent's settings (docs/agents.md), each named where it is wrong.
    ({"kind": "model", "api": "gemini", "model": "m"}, "agents.mine.api\n  Input should be 'anthropic'"),
    ({"kind": "model", "api": "anthropic", "model": "m"}, "api anthropic needs api_key_env"),
    ({"kind": "model", "api": "openai-chat", "model": "m", "output": "json"}, "agents.mine.output\n"),
    ({"kind": "model", "api": "anthropic", "model": "m", "api_key_env": "K", "output": "pyautogui"},
     "output is for api openai-chat"),
    ({"kind": "model", "api": "openai-chat", "model": "m", "tools": ["shell"]}, "tools must include computer"),
    ({"kind": "model", "api": "openai-chat", "model": "m", "screen": [10, 10]}, "agents.mine.screen\n"),
    ({"kind": "model", "api": "openai-chat", "model": "m", "api_key_env": "GH_SERVER_API_KEY"},
     "never a GH_SERVER_ one"),
    ({"kind": "model", "api": "openai-responses", "model": "m", "api_key_env": "K", "tool_version": "computer_2099"},
     "tool_version for api openai-responses is one of computer, computer_use_preview"),
    ({"kind": "model", "api": "openai-chat", "model": "m", "max_step": 3}, "agents.mine.max_step\n  Extra inputs"),
])
def test_a_misconfigured_agent_is_refused_at_start(tmp_path: Path, agent: dict[str, object], message: str) -> None:
    cfg = tmp_path / "server.yaml"
    cfg.write_text(yaml.safe_dump({"agents": {"mine": agent}}))
    with pytest.raises(pydantic.ValidationError, match=re.escape(message)):
        Settings.from_env(config_file=cfg, data_dir=tmp_path)


def test_gh_server_with_a_bad_model_agent_stops_at_start_naming_the_setting(tmp_path: Path) -> None:
    cfg = tmp_path / "server.yaml"
    cfg.write_text(yaml.safe_dump({"agents": {"claude": {"kind": "model", "api": "anthropic", "model": "m",
                                                         "api_key_env": "ANTHROPIC_API_KEY", "keep_screens": 0}}}))
    r = subprocess.run([sys.executable, "-m", "gh_server.cli", "--config", str(cfg), "migrate", "--data-dir",
                        str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "bad settings" in r.stderr and "agents.claude.keep_screens" in r.stderr, r.stderr


def test_changed_env_admin_key_revokes_the_old_one() -> None:
    from gh_server.app import create_state

    settings, data_dir = make_settings(None, admin_api_key="gh_live_env_one")
    try:
        st = create_state(settings)
        db.upgrade(st.engine)
        ensure_admin_key(st)
        st.settings.admin_api_key = "gh_live_env_two"
        ensure_admin_key(st)
        from sqlalchemy import select

        from gh_server.auth import hash_secret
        from gh_server.models import ApiKey

        with st.db() as s:
            rows = {r.key_hash: r.revoked_at for r in s.scalars(select(ApiKey))}
        assert rows[hash_secret("gh_live_env_one")] is not None
        assert rows[hash_secret("gh_live_env_two")] is None
        assert not (data_dir / "admin-api-key").exists()
        st.engine.dispose()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def test_database_errors_never_carry_bound_values(db_url: str | None) -> None:
    settings, data_dir = make_settings(db_url)
    engine = db.make_engine(settings)
    try:
        with pytest.raises(Exception) as e, engine.begin() as conn:
            conn.execute(text("INSERT INTO no_such_table VALUES (:x)"), {"x": "blue-kite-42"})
        assert "blue-kite-42" not in str(e.value)
    finally:
        engine.dispose()
        shutil.rmtree(data_dir, ignore_errors=True)
