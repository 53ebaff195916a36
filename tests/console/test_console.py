"""The console driven as a person would, by accessible names, in Debian's Chromium against a real
gh-server: sign-in and sign-out, roles (a member sees no Save, and a forged save is refused), a test case
written as YAML, runners registered and revoked, a run's live status, the live screen against a stand-in
peer (rfb_peer.py)."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable

import httpx
from playwright.sync_api import Page, Route, expect
from server.conftest import Server, case_body
from sqlalchemy import delete

from gh_server.models import StartState, StartStateVersion, new_id, utcnow

from .conftest import LIVE_PEERS, LIVE_TEST_PATH, screenshot, sign_in
from .rfb_peer import COLOUR, KEY_EVENT, POINTER_EVENT, UPDATE_REQUEST, RfbPeer


def api(server: Server, method: str, path: str, body: object = None) -> dict[str, object]:
    r = httpx.request(method, server.base_url + path, json=body, timeout=30,
                      headers={"Authorization": f"Bearer {server.admin_key}"})
    assert r.status_code == 200, r.text
    out: dict[str, object] = r.json()
    return out


def open_start_state(server: Server) -> str:
    """A hand-made start state with a saved version, shown as open (its machine is the live channel's
    business, not this page's)."""
    sid = new_id("ss_")
    with server.state.db.begin() as s:
        s.add(StartState(id=sid, name="hand-made desk", from_="linux-tiny", image="linux-tiny", method="hand",
                         status="open", version=1, opened_at=utcnow()))
        s.flush()
        s.add(StartStateVersion(start_state_id=sid, version=1, runner_id="rn_console0000"))
    return sid


def test_admin_signs_in_once_and_the_key_is_kept_nowhere(page: Page, server: Server) -> None:
    sign_in(page, server.admin_key)
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    for tab in ("Evals", "Runners", "Start states"):
        expect(page.get_by_role("link", name=tab)).to_be_visible()
    stored = page.evaluate("() => JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage), "
                           "document.cookie])")
    assert server.admin_key not in stored and "gh_console" not in stored  # HttpOnly: no script reads it
    page.reload()  # the cookie survives a reload; the page asks the server for its session again
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()


def test_a_wrong_key_shows_an_error(page: Page, server: Server) -> None:
    page.goto("/")
    page.get_by_label("API key").fill("gh_live_" + secrets.token_urlsafe(32))
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("not valid")
    expect(page.get_by_role("button", name="Sign out")).to_be_hidden()


def test_sign_out_ends_the_session(page: Page, server: Server) -> None:
    sign_in(page, server.admin_key, "/runners")
    expect(page.get_by_role("heading", name="Runners")).to_be_visible()
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_label("API key")).to_be_visible()
    page.reload()
    expect(page.get_by_label("API key")).to_be_visible()
    assert page.context.cookies() == [] or all(c["value"] == "" for c in page.context.cookies())


def test_revoking_the_key_signs_the_open_page_out(page: Page, server: Server) -> None:
    made = api(server, "POST", "/v1/api_keys", {"name": "revoked while signed in", "role": "member"})
    sign_in(page, str(made["key"]), "/runners")
    expect(page.get_by_role("heading", name="Runners")).to_be_visible()
    api(server, "DELETE", f"/v1/api_keys/{made['id']}")
    page.get_by_role("link", name="Start states").click()  # the next request is refused: back to sign-in
    expect(page.get_by_label("API key")).to_be_visible()


def test_a_member_sees_no_save_and_a_forged_save_is_refused(page: Page, browser: object, server: Server) -> None:
    sid = open_start_state(server)
    # The admin's page of this open machine has the three controls and the live screen's element...
    sign_in(page, server.admin_key, f"/start_states/{sid}")
    expect(page.get_by_role("heading", name="hand-made desk")).to_be_visible()
    for name in ("Open", "Save", "Close"):
        expect(page.get_by_role("button", name=name, exact=True)).to_be_visible()
    expect(page.get_by_role("button", name="Save", exact=True)).to_be_enabled()
    expect(page.get_by_role("application", name="Live screen")).to_be_visible()
    expect(page.get_by_role("region", name="Versions")).to_contain_text("1 (current)")
    page.get_by_role("button", name="Sign out").click()
    # ...a member's has none, and a save forged from the page (its cookie and CSRF token) gets 403.
    sign_in(page, server.member_key, f"/start_states/{sid}")
    expect(page.get_by_role("heading", name="hand-made desk")).to_be_visible()
    expect(page.get_by_text("read-only")).to_be_visible()
    for name in ("Open", "Save", "Close"):
        expect(page.get_by_role("button", name=name, exact=True)).to_have_count(0)
    status = page.evaluate("""async (sid) => {
        const s = await (await fetch("/v1/console/session")).json();
        const headers = {"X-CSRF-Token": s.csrf_token};
        const r = await fetch(`/v1/start_states/${sid}/save`, {method: "POST", headers});
        return [s.role, r.status, (await r.json()).error.type];
    }""", sid)
    assert status == ["member", 403, "permission"]
    # Nor elsewhere: no editor on a case, no New test case, no Register or Revoke.
    case = api(server, "POST", "/v1/test_cases", {**case_body(10), "key": "ro-" + secrets.token_hex(3)})
    page.get_by_role("link", name="Evals").click()
    page.get_by_role("link", name="Test cases").click()
    expect(page.get_by_role("link", name=str(case["key"]))).to_be_visible()
    expect(page.get_by_role("link", name="New test case")).to_have_count(0)
    page.get_by_role("link", name=str(case["key"])).click()
    expect(page.get_by_label("Test case (YAML)")).to_contain_text(f"key: {case['key']}")
    expect(page.get_by_role("button", name="Save")).to_have_count(0)
    api(server, "POST", "/v1/runners", {"name": "ro-runner"})
    page.get_by_role("link", name="Runners").click()
    expect(page.get_by_role("row").filter(has_text="ro-runner")).to_be_visible()
    expect(page.get_by_role("button", name=re.compile("^(Register|Revoke)"))).to_have_count(0)
    with server.state.db() as s:
        row = s.get(StartState, sid)
        assert row is not None and row.status == "open" and row.version == 1


def test_a_test_case_written_as_yaml_shows_its_error_at_the_field(page: Page, server: Server) -> None:
    sign_in(page, server.admin_key, "/test_cases")
    page.get_by_role("link", name="New test case").click()
    editor = page.get_by_label("Test case (YAML)")
    key = "yaml-" + secrets.token_hex(3)
    text = (f"key: {key}\nname: Hello file\nprompt: Write hello into /tmp/hello.\nstart_state: linux-tiny\n"
            "success:\n  check_script: echo False\nlimits:\n  minutes: -5\ntags: [console]\n")
    editor.fill(text)
    page.get_by_role("button", name="Save").click()
    error = page.get_by_role("alert")
    expect(error).to_contain_text("Line 8 (limits.minutes)")
    expect(editor).to_have_attribute("aria-invalid", "true")
    editor.fill(text.replace("minutes: -5", "minutes: 5"))
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("heading", name="Hello file")).to_be_visible()
    expect(page).to_have_url(re.compile(r"/test_cases/tc_\w+$"))
    saved = api(server, "GET", f"/v1/test_cases/{key}")
    assert saved["limits"] == {"minutes": 5, "steps": None} and saved["tags"] == ["console"]
    # The saved case comes back as YAML (every field, nulls too); edited and saved again, it round-trips.
    shown = editor.input_value()
    assert "name: Hello file" in shown and "check_script: echo False" in shown
    editor.fill(shown.replace("name: Hello file", "name: Hello file, edited"))
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("heading", name="Hello file, edited")).to_be_visible()
    edited = api(server, "GET", f"/v1/test_cases/{key}")
    assert {k: v for k, v in edited.items() if k not in ("name", "updated_at")} == \
        {k: v for k, v in saved.items() if k not in ("name", "updated_at")}
    page.get_by_role("link", name="Test cases").click()
    page.get_by_label("Tag").fill("console")
    page.get_by_role("button", name="Filter").click()
    expect(page.get_by_role("link", name=key)).to_be_visible()


def test_the_runners_tab_registers_a_runner_shows_its_token_once_and_revokes_it(page: Page, server: Server) -> None:
    name = "lab-" + secrets.token_hex(3)
    sign_in(page, server.admin_key, "/runners")
    page.get_by_label("Runner name").fill(name)
    page.get_by_role("button", name="Register").click()
    expect(page.get_by_label("Runner token")).to_have_text(re.compile(r"^gh_rn_"))
    row = page.get_by_role("row").filter(has_text=name)
    expect(row).to_contain_text("offline")
    screenshot(page, "runners")
    page.reload()
    expect(row).to_be_visible()
    expect(page.get_by_label("Runner token")).to_have_count(0)  # shown once
    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name=f"Revoke {name}").click()
    expect(row).to_have_count(0)
    runners = api(server, "GET", "/v1/runners?limit=100")
    assert name not in [r["name"] for r in runners["data"]]  # type: ignore[attr-defined]


def test_a_runs_page_shows_its_status_and_follows_a_cancel(page: Page, server: Server) -> None:
    case = api(server, "POST", "/v1/test_cases", {**case_body(7), "key": "run-" + secrets.token_hex(3)})
    run = api(server, "POST", "/v1/test_runs", {"test_case_ids": [case["test_case_id"]], "agents": ["noop"],
                                                "name": "console run"})
    sign_in(page, server.member_key, f"/test_runs/{run['test_run_id']}")
    expect(page.get_by_role("heading", name="Run console run")).to_be_visible()
    expect(page.locator("dd .status").first).to_have_text("queued")
    expect(page.get_by_role("cell", name=re.compile("runner"))).to_be_visible()  # why it waits
    expect(page.get_by_title("Results page")).to_be_visible()
    page.get_by_role("button", name="Cancel run").click()  # members may cancel (docs/server-api.md)
    expect(page.locator("dd .status").first).to_have_text("cancelled")
    expect(page.get_by_role("button", name="Rerun")).to_be_visible()
    page.get_by_role("link", name=re.compile(r"^at_")).click()  # the attempt, with its replay
    expect(page.get_by_role("heading", name=re.compile(r"^Attempt at_"))).to_be_visible()
    expect(page.get_by_title("Replay")).to_be_visible()
    page.get_by_role("link", name="Evals").click()
    expect(page.get_by_role("row").filter(has_text="console run")).to_contain_text("cancelled")
    screenshot(page, "evals")


def test_a_run_started_from_a_test_sets_page(page: Page, server: Server) -> None:
    case = api(server, "POST", "/v1/test_cases", {**case_body(9), "key": "set-" + secrets.token_hex(3)})
    test_set = api(server, "POST", "/v1/test_sets", {"name": "console set " + secrets.token_hex(2)})
    api(server, "POST", f"/v1/test_sets/{test_set['test_set_id']}/cases", {"test_case_ids": [case["test_case_id"]]})
    sign_in(page, server.member_key, "/test_sets")
    page.get_by_role("link", name=str(test_set["name"])).click()
    expect(page.get_by_role("link", name=str(case["key"]))).to_be_visible()
    page.get_by_label("Agents").fill("noop")
    page.get_by_role("button", name="Start run").click()
    expect(page).to_have_url(re.compile(r"/test_runs/tr_\w+$"))
    expect(page.get_by_role("cell", name=str(case["key"]))).to_be_visible()


def test_the_start_states_tab_lists_and_makes_start_states(page: Page, server: Server) -> None:
    open_start_state(server)
    sign_in(page, server.admin_key, "/start_states")
    expect(page.get_by_role("heading", name="Start states")).to_be_visible()
    expect(page.get_by_role("link", name="hand-made desk").first).to_be_visible()
    form = page.get_by_role("form", name="New start state")
    screenshot(page, "start-states")
    # Made by hand from an image no runner has: the server's refusal is shown at the field it names.
    form.get_by_label("Name", exact=True).fill("desk from nothing")
    form.get_by_label("From (image or start state)").fill("no-such-image")
    form.get_by_role("button", name="Create").click()
    expect(form.get_by_role("alert")).to_contain_text("no runner advertises the image 'no-such-image'")
    expect(form.get_by_label("From (image or start state)")).to_have_attribute("aria-invalid", "true")


def test_two_runs_compared_from_the_runs_list(page: Page, server: Server) -> None:
    case = api(server, "POST", "/v1/test_cases", {**case_body(8), "key": "cmp-" + secrets.token_hex(3)})
    names = [f"cmp {secrets.token_hex(2)}" for _ in range(2)]
    for name in names:
        api(server, "POST", "/v1/test_runs",
            {"test_case_ids": [case["test_case_id"]], "agents": ["noop"], "name": name})
    sign_in(page, server.member_key, "/test_runs")
    for name in names:
        page.get_by_role("checkbox", name=f"Compare {name}").check()
    page.get_by_role("button", name="Compare selected").click()
    expect(page.get_by_role("heading", name="Runs compared")).to_be_visible()
    expect(page).to_have_url(re.compile(r"/test_runs/compare\?ids=tr_\w+,tr_\w+$"))
    expect(page.get_by_role("cell", name=case["key"])).to_be_visible()  # type: ignore[arg-type]


def test_the_live_screen_loads_debians_novnc_under_the_pages_policy(page: Page, server: Server) -> None:
    # The module the start state's page imports for the live screen (docs/console.md): served from
    # /usr/share/novnc, loaded as an ES module under the console's Content-Security-Policy.
    sign_in(page, server.admin_key, "/start_states")
    kind = page.evaluate('async () => typeof (await import("/console/novnc/core/rfb.js")).default')
    assert kind == "function"


def _live_page(page: Page, server: Server, *, read_only: bool) -> RfbPeer:
    """The start state's page with the live channel stood in for (the view endpoint answered in the
    browser, its WebSocket by an RFB peer on the test's server), so the page's own part of the contract
    is what is tested."""
    sid = open_start_state(server)
    ticket = "lv_" + secrets.token_hex(8)
    peer = LIVE_PEERS[ticket] = RfbPeer()
    view = {"object": "live_view", "ticket": ticket, "url": f"{LIVE_TEST_PATH}/{ticket}", "read_only": read_only,
            "expires_at": "2030-01-01T00:00:00.000Z"}
    page.route(f"**/v1/start_states/{sid}/view", lambda route: route.fulfill(json=view))
    sign_in(page, server.admin_key, f"/start_states/{sid}")
    expect(page.get_by_text("Watching (read-only)." if read_only else "Connected: click the screen to type.")
           ).to_be_visible()
    # The peer's one frame is drawn: the canvas's middle pixel is its colour.
    page.wait_for_function("""([r, g, b]) => {
        const c = document.querySelector('[aria-label="Live screen"] canvas');
        if (!c || !c.width) return false;
        const [pr, pg, pb] = c.getContext("2d").getImageData(c.width >> 1, c.height >> 1, 1, 1).data;
        return pr === r && pg === g && pb === b;
    }""", arg=list(COLOUR))
    page.get_by_role("application", name="Live screen").click()
    page.keyboard.press("a")
    return peer


def _until(page: Page, cond: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    """Polls `cond` with a deadline while letting Playwright deliver the WebSocket's messages (its sync API
    runs the peer's handlers only while it is waiting)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        page.wait_for_timeout(50)


def test_the_live_screen_sends_an_admins_keys(page: Page, server: Server) -> None:
    peer = _live_page(page, server, read_only=False)
    _until(page, lambda: any(m[1] == 1 and m[4:8] == b"\x00\x00\x00a" for m in peer.sent(KEY_EVENT)),
           "the key press of 'a' at the peer")
    assert peer.sent(POINTER_EVENT)  # the click
    page.get_by_role("link", name="Runners").click()  # leaving the page closes its connection
    _until(page, peer.closed.is_set, "the viewer's WebSocket closed")


def test_a_read_only_live_screen_sends_no_input(page: Page, server: Server) -> None:
    peer = _live_page(page, server, read_only=True)
    asked = len(peer.sent(UPDATE_REQUEST))
    peer.push_frame()  # its answer comes after any input sent before it
    _until(page, lambda: len(peer.sent(UPDATE_REQUEST)) > asked, "the viewer's next update request")
    assert peer.sent(KEY_EVENT) == [] and peer.sent(POINTER_EVENT) == []


def test_a_start_state_that_goes_away_says_so_on_its_page(page: Page, server: Server) -> None:
    sid = open_start_state(server)
    sign_in(page, server.admin_key, f"/start_states/{sid}")
    expect(page.get_by_role("heading", name="hand-made desk")).to_be_visible()
    with server.state.db.begin() as s:  # as a close of a never-saved, hand-made state ends
        s.execute(delete(StartStateVersion).where(StartStateVersion.start_state_id == sid))
        s.execute(delete(StartState).where(StartState.id == sid))
    expect(page.get_by_role("heading", name="Deleted")).to_be_visible()
    expect(page.get_by_role("button", name="Save", exact=True)).to_have_count(0)


def test_a_start_state_that_goes_away_while_its_page_first_draws_says_so(page: Page, server: Server) -> None:
    """The race CI met: the page's first draw had shown the name when the state went away, and its next
    request (the versions) found none. The route holds that request until the state is gone."""
    sid = open_start_state(server)

    def delete_then_answer(route: Route) -> None:
        with server.state.db.begin() as s:
            s.execute(delete(StartStateVersion).where(StartStateVersion.start_state_id == sid))
            s.execute(delete(StartState).where(StartState.id == sid))
        route.continue_()

    page.route(f"**/v1/start_states/{sid}/versions", delete_then_answer)
    sign_in(page, server.admin_key, f"/start_states/{sid}")
    expect(page.get_by_role("heading", name="Deleted")).to_be_visible()
    expect(page.get_by_role("alert")).to_have_count(0)
    expect(page.get_by_role("button", name="Save", exact=True)).to_have_count(0)
