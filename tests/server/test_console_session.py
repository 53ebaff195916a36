"""The console's sign-in (gh_server/console_sessions.py, /v1/console/session) against a real gh-server over
HTTP: the cookie's flags, CSRF on every change, roles, a revoked key's session dead at once, expiry,
sign-out; test cases sent as YAML (gh_server/yamlbody.py); the console's pages and files at their URLs."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from datetime import timedelta
from http.cookies import SimpleCookie
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select, update

from gh_server.auth import create_key
from gh_server.console_page import CSP
from gh_server.models import ConsoleSession, StartState, StartStateVersion, new_id, utcnow

from .conftest import RunningServer, Server, case_body, make_settings

COOKIE = "gh_console"
SECURE_COOKIE = "__Host-gh_console"


def sign_in(server: Server, key: str, **headers: str) -> tuple[httpx.Client, dict[str, str], httpx.Response]:
    """A browser-like client signed in with `key`: its cookie jar holds the session; the CSRF token is returned."""
    c = httpx.Client(base_url=server.base_url, timeout=30)
    r = c.post("/v1/console/session", json={"api_key": key}, headers=headers)
    assert r.status_code == 200, r.text
    return c, {"X-CSRF-Token": r.json()["csrf_token"]}, r


def cookie_flags(r: httpx.Response) -> SimpleCookie:
    jar: SimpleCookie = SimpleCookie()
    jar.load(r.headers["set-cookie"])
    return jar


def test_sign_in_sets_a_strict_httponly_cookie_and_stores_only_its_hash(server: Server) -> None:
    c, _csrf, r = sign_in(server, server.admin_key)
    body = r.json()
    assert body["object"] == "console_session" and body["role"] == "admin"
    assert len(body["csrf_token"]) >= 32 and body["expires_at"].endswith("Z")
    morsel = cookie_flags(r)[COOKIE]
    assert morsel["httponly"] and morsel["samesite"].lower() == "strict" and morsel["path"] == "/"
    assert int(morsel["max-age"]) > 3600
    assert not morsel["secure"]  # plain http here
    assert r.headers["cache-control"] == "no-store"
    secret = morsel.value
    with server.state.db() as s:
        rows = s.scalars(select(ConsoleSession)).all()
    assert hashlib.sha256(secret.encode()).hexdigest() in {x.secret_hash for x in rows}
    assert all(secret not in (x.secret_hash, x.csrf_token) for x in rows)
    again = c.get("/v1/console/session")
    assert again.status_code == 200 and again.json()["csrf_token"] == body["csrf_token"]


def test_secure_when_the_request_came_over_https_through_a_trusted_proxy(server: Server) -> None:
    # trusted_proxies is loopback by default: a TLS proxy on this host in front.
    _c, _csrf, r = sign_in(server, server.admin_key, **{"X-Forwarded-Proto": "https"})
    morsel = cookie_flags(r)[SECURE_COOKIE]
    assert morsel["secure"] and morsel["path"] == "/" and not morsel["domain"] and morsel["httponly"]
    assert COOKIE not in cookie_flags(r)


def proxy_client(server: str, source: str) -> httpx.Client:
    """A client whose connections come from `source` (any 127.0.0.0/8 address is this host's): a proxy there."""
    return httpx.Client(base_url=server, timeout=30, transport=httpx.HTTPTransport(local_address=source))


@pytest.fixture
def behind_a_proxy() -> Iterator[tuple[str, str]]:
    """A gh-server that trusts a TLS proxy at 127.0.0.2 (not the loopback default): its url and admin key."""
    settings, data_dir = make_settings(None, trusted_proxies=["127.0.0.2"])
    running = RunningServer(settings)
    running.start()
    try:
        yield f"http://127.0.0.1:{settings.port}", (data_dir / "admin-api-key").read_text().strip()
    finally:
        running.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_the_cookie_is_host_prefixed_and_secure_when_a_configured_proxy_says_https(
        behind_a_proxy: tuple[str, str]) -> None:
    url, key = behind_a_proxy
    https = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.7"}
    with proxy_client(url, "127.0.0.2") as proxy:
        r = proxy.post("/v1/console/session", json={"api_key": key}, headers=https)
        assert r.status_code == 200, r.text
        morsel = cookie_flags(r)[SECURE_COOKIE]
        assert morsel["secure"] and morsel["path"] == "/" and not morsel["domain"]
        csrf = {"X-CSRF-Token": r.json()["csrf_token"]}
        # The browser sends it back through the proxy (over https: by hand here, httpx keeps Secure to https).
        cookie = {"Cookie": f"{SECURE_COOKIE}={morsel.value}"}
        assert proxy.get("/v1/test_cases", headers={**https, **cookie}).status_code == 200
        # The plain name over https is not read: anything on plain http to this host could have set it.
        plain = proxy.get("/v1/test_cases", headers={**https, "Cookie": f"{COOKIE}={morsel.value}"})
        assert plain.status_code == 401
        # Over plain http (through the same proxy) the prefixed cookie is not read either.
        assert proxy.get("/v1/test_cases", headers={"X-Forwarded-Proto": "http", **cookie}).status_code == 401
        out = proxy.delete("/v1/console/session", headers={**https, **cookie, **csrf})
        assert out.status_code == 200 and cookie_flags(out)[SECURE_COOKIE]["max-age"] == "0"
    # Anyone else saying https is not believed: the plain cookie, without Secure.
    with proxy_client(url, "127.0.0.3") as other:
        r = other.post("/v1/console/session", json={"api_key": key}, headers=https)
        assert r.status_code == 200 and SECURE_COOKIE not in cookie_flags(r)
        assert not cookie_flags(r)[COOKIE]["secure"]


def test_the_cookie_authenticates_reads_and_changes_need_the_csrf_token(server: Server) -> None:
    c, csrf, _r = sign_in(server, server.admin_key)
    assert c.get("/v1/test_cases").status_code == 200
    no_token = c.post("/v1/test_cases", json=case_body(1))
    assert no_token.status_code == 403 and "X-CSRF-Token" in no_token.json()["error"]["message"]
    wrong = c.post("/v1/test_cases", json=case_body(1), headers={"X-CSRF-Token": "x" * 43})
    assert wrong.status_code == 403
    made = c.post("/v1/test_cases", json=case_body(1), headers=csrf)
    assert made.status_code == 200, made.text
    assert c.delete(f"/v1/test_cases/{made.json()['test_case_id']}").status_code == 403
    assert c.delete(f"/v1/test_cases/{made.json()['test_case_id']}", headers=csrf).status_code == 200


def test_a_member_session_is_refused_admin_actions_whatever_it_sends(server: Server) -> None:
    c, csrf, r = sign_in(server, server.member_key)
    assert r.json()["role"] == "member"
    assert c.get("/v1/runners").status_code == 200
    for method, path, body in [("POST", "/v1/test_cases", case_body(2)), ("POST", "/v1/runners", {"name": "x"}),
                               ("POST", "/v1/start_states/ss_nothing/save", None)]:
        resp = c.request(method, path, json=body, headers=csrf)
        assert resp.status_code == 403, (path, resp.text)
        assert resp.json()["error"]["type"] == "permission"


def test_a_wrong_key_gets_401_and_no_cookie(server: Server) -> None:
    r = httpx.post(f"{server.base_url}/v1/console/session", json={"api_key": "gh_live_not-a-key"}, timeout=30)
    assert r.status_code == 401 and "set-cookie" not in r.headers
    assert httpx.get(f"{server.base_url}/v1/console/session", timeout=30).status_code == 401
    forged = httpx.get(f"{server.base_url}/v1/test_cases", cookies={COOKIE: "made-up"}, timeout=30)
    assert forged.status_code == 401


def test_revoking_the_key_ends_its_sessions_at_once(server: Server) -> None:
    with server.state.db.begin() as s:
        row, key = create_key(s, "to revoke", "member")
        key_id = row.id
    c, _csrf, _r = sign_in(server, key)
    assert c.get("/v1/test_cases").status_code == 200
    httpx.delete(f"{server.base_url}/v1/api_keys/{key_id}", headers={"Authorization": f"Bearer {server.admin_key}"},
                 timeout=30)
    assert c.get("/v1/test_cases").status_code == 401
    assert c.get("/v1/console/session").status_code == 401


def test_an_expired_session_is_refused(server: Server) -> None:
    c, _csrf, r = sign_in(server, server.admin_key)
    h = hashlib.sha256(cookie_flags(r)[COOKIE].value.encode()).hexdigest()
    with server.state.db.begin() as s:
        s.execute(update(ConsoleSession).where(ConsoleSession.secret_hash == h)
                  .values(expires_at=utcnow() - timedelta(seconds=1)))
    assert c.get("/v1/test_cases").status_code == 401
    assert c.get("/v1/console/session").status_code == 401


def test_sign_out_needs_the_token_and_ends_the_session(server: Server) -> None:
    c, csrf, r = sign_in(server, server.admin_key)
    secret = cookie_flags(r)[COOKIE].value
    assert c.delete("/v1/console/session").status_code == 403
    out = c.delete("/v1/console/session", headers=csrf)
    assert out.status_code == 200 and out.json()["deleted"] is True
    assert 'gh_console=""' in out.headers["set-cookie"] or "Max-Age=0" in out.headers["set-cookie"]
    replayed = httpx.get(f"{server.base_url}/v1/test_cases", cookies={COOKIE: secret}, timeout=30)
    assert replayed.status_code == 401
    # Signing out again with the dead cookie only clears it; with no cookie there is no one to sign out.
    url = f"{server.base_url}/v1/console/session"
    assert httpx.delete(url, cookies={COOKIE: secret}, timeout=30).status_code == 200
    assert httpx.delete(url, timeout=30).status_code == 401


def test_the_bearer_key_still_wins_over_a_cookie(server: Server) -> None:
    c, _csrf, _r = sign_in(server, server.admin_key)
    r = c.get("/v1/test_cases", headers={"Authorization": "Bearer gh_live_wrong"})
    assert r.status_code == 401


YAML_CASE = """\
key: yaml-1
name: From YAML
prompt: |
  Make /tmp/x.
  Then stop.
start_state: linux-tiny
success:
  check_script: echo True
tags: [a, b]
"""


def test_test_cases_as_yaml(server: Server) -> None:
    c, csrf, _r = sign_in(server, server.admin_key)
    yaml_headers = {**csrf, "Content-Type": "application/yaml"}
    made = c.post("/v1/test_cases", content=YAML_CASE, headers=yaml_headers)
    assert made.status_code == 200, made.text
    assert made.json()["prompt"] == "Make /tmp/x.\nThen stop.\n" and made.json()["tags"] == ["a", "b"]
    bad_field = c.patch("/v1/test_cases/yaml-1", content="limits:\n  minutes: -3\n", headers=yaml_headers)
    assert bad_field.status_code == 400 and bad_field.json()["error"]["param"] == "limits.minutes"
    broken = c.patch("/v1/test_cases/yaml-1", content="name: ok\nprompt: [unclosed\n", headers=yaml_headers)
    err = broken.json()["error"]
    assert broken.status_code == 400 and err["param"] == "body" and err["line"] >= 2
    aliases = c.post("/v1/test_cases", content="a: &x [1, 2]\nb: *x\n", headers=yaml_headers)
    assert aliases.status_code == 400 and "alias" in aliases.json()["error"]["message"]
    not_a_map = c.post("/v1/test_cases", content="- 1\n- 2\n", headers=yaml_headers)
    assert not_a_map.status_code == 400
    fixed = c.patch("/v1/test_cases/yaml-1", content="name: Renamed\n", headers=yaml_headers)
    assert fixed.status_code == 200 and fixed.json()["name"] == "Renamed"


def test_a_yaml_body_is_bounded_before_it_is_parsed(server: Server) -> None:
    c, csrf, _r = sign_in(server, server.admin_key)
    huge = "name: " + "x" * (server.state.settings.max_body_bytes + 1) + "\n"
    r = c.post("/v1/test_cases", content=huge, headers={**csrf, "Content-Type": "application/yaml"})
    assert r.status_code == 413 and r.json()["error"]["limit_bytes"] == server.state.settings.max_body_bytes


def test_a_start_states_versions_newest_first(server: Server) -> None:
    sid = new_id("ss_")
    with server.state.db.begin() as s:
        s.add(StartState(id=sid, name="versions", from_="linux-tiny", image="linux-tiny", method="hand",
                         status="ready", version=2))
        s.flush()
        s.add_all([StartStateVersion(start_state_id=sid, version=v, runner_id="rn_x", size_bytes=v * 1024)
                   for v in (1, 2)])
        s.add(StartStateVersion(start_state_id=sid, version=3, runner_id="rn_x", deleted_at=utcnow()))
    r = httpx.get(f"{server.base_url}/v1/start_states/{sid}/versions", timeout=30,
                  headers={"Authorization": f"Bearer {server.member_key}"})
    assert r.status_code == 200
    assert [(v["version"], v["current"], v["size_bytes"]) for v in r.json()["data"]] == [(2, True, 2048),
                                                                                      (1, False, 1024)]


@pytest.mark.parametrize("path", ["/", "/test_cases", "/test_cases/tc_x", "/test_runs/tr_1", "/test_runs/compare",
                                  "/attempts/at_1", "/runners", "/start_states", "/start_states/ss_1"])
def test_every_console_page_serves_the_page(server: Server, path: str) -> None:
    r = httpx.get(server.base_url + path, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/console/assets/app.js">' in r.text
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]


def test_the_console_shadows_no_api_route(server: Server) -> None:
    assert httpx.get(f"{server.base_url}/healthz", timeout=30).json()["ok"] is True
    missing = httpx.get(f"{server.base_url}/v1/no_such_thing", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"
    assert httpx.get(f"{server.base_url}/metrics", timeout=30).status_code == 401
    js = httpx.get(f"{server.base_url}/console/assets/api.js", timeout=30)
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]


@pytest.fixture
def novnc_server(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "rfb.js").write_text("export default class RFB {}\n")
    # What else Debian's noVNC holds: its own client, which connects wherever its query string says.
    (tmp_path / "vnc.html").write_text("<html>noVNC</html>\n")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "ui.js").write_text("export default {}\n")
    (tmp_path / "vendor" / "pako" / "lib").mkdir(parents=True)
    (tmp_path / "vendor" / "pako" / "lib" / "inflate.js").write_text("export const inflate = 1;\n")
    settings, data_dir = make_settings(None, novnc_dir=tmp_path)
    running = RunningServer(settings)
    running.start()
    try:
        yield f"http://127.0.0.1:{settings.port}"
    finally:
        running.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_novnc_is_served_from_the_configured_directory(novnc_server: str) -> None:
    r = httpx.get(f"{novnc_server}/console/novnc/core/rfb.js", timeout=30)
    assert r.status_code == 200 and r.text == "export default class RFB {}\n"
    assert httpx.get(f"{novnc_server}/console/novnc/core/nothing.js", timeout=30).status_code == 404


def test_only_novncs_core_is_served_and_under_the_consoles_policy(novnc_server: str) -> None:
    for part in ("core/rfb.js", "vendor/pako/lib/inflate.js"):  # what the live screen's import reaches
        r = httpx.get(f"{novnc_server}/console/novnc/{part}", timeout=30)
        assert r.status_code == 200, part
        assert r.headers["content-security-policy"] == CSP and r.headers["x-content-type-options"] == "nosniff"
    for path in ("vnc.html", "vnc.html?host=evil.example&port=443&autoconnect=1", "app/ui.js", "",
                 "core/..%2fvnc.html", "core/%2e%2e/vnc.html", "vendor/pako/../../vnc.html"):
        r = httpx.get(f"{novnc_server}/console/novnc/{path}", timeout=30)
        assert r.status_code == 404, (path, r.status_code)
        assert "noVNC" not in r.text
    js = httpx.get(f"{novnc_server}/console/assets/api.js", timeout=30)
    assert js.status_code == 200 and js.headers["content-security-policy"] == CSP
