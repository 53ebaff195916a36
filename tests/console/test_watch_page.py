"""An attempt's page while it runs (docs/console.md, "Watching an attempt"), in Debian's Chromium against a real
gh-server: the steps come from the real `GET /v1/attempts/{id}/steps` (frames written into the database as a
runner's would be); the live screen's views and the takeover routes are answered in the browser, their
WebSockets by RFB peers (rfb_peer.py), so the page's own side of the contract is what is tested: Take over
reopens the screen writable, a hold by someone else is named, Hand back reopens it read-only, a masked replay
puts the newest frame in place of the screen, and the attempt's end brings its outcome and replay."""

from __future__ import annotations

import io
import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from PIL import Image
from playwright.sync_api import Page, Route, expect
from server.conftest import Server

from gh_server.models import Attempt, ReplayFrame

from .conftest import LIVE_PEERS, LIVE_TEST_PATH, screenshot, sign_in
from .rfb_peer import KEY_EVENT, RfbPeer

WORDS = "I open the settings first."
READ_ONLY = "Watching (read-only)."
WRITABLE = "Connected: click the screen to type."


def png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 40), (90, 120, 200)).save(buf, "PNG")
    return buf.getvalue()


def running_attempt(server: Server) -> str:
    c = server.admin
    case = c.test_cases.create("watched page", "Open the settings.", "linux-tiny",  # type: ignore[arg-type]
                               {"check_script": "true"})
    run = c.test_runs.create(test_case_ids=[case["test_case_id"]], agents=["noop"])
    [a] = c.test_runs.list_all_attempts(run["test_run_id"])
    aid = str(a["attempt_id"])
    with server.state.db.begin() as s:
        row = s.get(Attempt, aid)
        assert row is not None
        row.status, row.started_at, row.runner_id = "running", datetime.now(UTC), "rn_console0000"
    return aid


def add_frame(server: Server, aid: str, seq: int, event: dict[str, Any] | None) -> None:
    with server.state.db.begin() as s:
        s.add(ReplayFrame(attempt_id=aid, seq=seq, at=datetime.now(UTC), label="input" if event else "change",
                          event=event, png=png()))


def set_row(server: Server, aid: str, **values: Any) -> None:
    with server.state.db.begin() as s:
        row = s.get(Attempt, aid)
        assert row is not None
        for k, v in values.items():
            setattr(row, k, v)


def view_of(read_only: bool) -> tuple[dict[str, Any], RfbPeer]:
    ticket = "lv_" + secrets.token_hex(8)
    peer = LIVE_PEERS[ticket] = RfbPeer()
    return ({"object": "live_view", "ticket": ticket, "url": f"{LIVE_TEST_PATH}/{ticket}", "read_only": read_only,
             "expires_at": "2030-01-01T00:00:00.000Z"}, peer)


def answer(page: Page, path: str, reply: Callable[[Route], None]) -> None:
    page.route(f"**{path}", lambda route: reply(route) if route.request.method == "POST" else route.fallback())


def test_an_admin_takes_over_and_hands_back_then_the_replay_masks_and_the_attempt_ends(page: Page,
                                                                                        server: Server) -> None:
    aid = running_attempt(server)
    add_frame(server, aid, 0, {"type": "type", "text": "settings",
                               "note": {"agent": "model", "step": 1, "text": WORDS, "action": "type 'settings'"}})
    peers: list[RfbPeer] = []

    def read_only_view(route: Route) -> None:
        v, peer = view_of(True)
        peers.append(peer)
        route.fulfill(json=v)

    answer(page, f"/v1/attempts/{aid}/view", read_only_view)
    sign_in(page, server.admin_key, f"/attempts/{aid}")
    expect(page.get_by_text(READ_ONLY)).to_be_visible()
    steps = page.get_by_role("list", name="Steps")
    expect(steps).to_contain_text(WORDS)
    expect(steps).to_contain_text("type 'settings'")
    expect(page.get_by_text("phase task")).to_be_visible()

    # Someone else holds it: the page says who.
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    answer(page, f"/v1/attempts/{aid}/takeover", lambda route: route.fulfill(status=409, json={"error": {
        "type": "conflict", "code": "held", "message": "bob holds it", "held_by": "bob", "since": since}}))
    page.get_by_role("button", name="Take over").click()
    expect(page.get_by_role("alert")).to_contain_text("Held by bob")

    # Free: the screen reopens writable with the view the takeover returned, and the hold is shown.
    holder_view, holder = view_of(False)

    def take(route: Route) -> None:
        started = datetime.now(UTC)
        set_row(server, aid, assisted=True, takeovers=[{"by": "admin", "by_key_id": "ak_x",
                                                        "started_at": started.isoformat(), "ended_at": None}])
        route.fulfill(json={"object": "takeover", "attempt_id": aid, "by": "admin",
                            "started_at": started.isoformat(), "cap_at": (started + timedelta(minutes=30)).isoformat(),
                            "idle_seconds": 300, "view": holder_view})

    page.unroute(f"**/v1/attempts/{aid}/takeover")
    answer(page, f"/v1/attempts/{aid}/takeover", take)
    page.get_by_role("button", name="Take over").click()
    expect(page.get_by_text(WRITABLE)).to_be_visible()
    expect(page.get_by_text("Held by admin since")).to_be_visible()
    screenshot(page, "watch")
    page.get_by_role("application", name="Live screen").click()
    page.keyboard.press("a")
    page.wait_for_function("() => true")  # let the key leave
    expect(page.get_by_role("button", name="Take over")).to_be_hidden()

    # Hand back: read-only again, on a new view.
    def hand_back(route: Route) -> None:
        set_row(server, aid, takeovers=[{"by": "admin", "started_at": since, "ended_at": since,
                                         "ended_by": "handed_back"}])
        route.fulfill(json={"object": "takeover", "by": "admin", "ended_by": "handed_back"})

    answer(page, f"/v1/attempts/{aid}/handback", hand_back)
    before = len(peers)
    page.get_by_role("button", name="Hand back").click()
    expect(page.get_by_text(READ_ONLY)).to_be_visible()
    expect(page.get_by_role("button", name="Hand back")).to_be_hidden()
    assert len(peers) > before
    assert holder.sent(KEY_EVENT), "the holder's key never reached its view"

    # A secret typed: the replay masks, and the newest frame stands in for the screen.
    add_frame(server, aid, 1, {"type": "type", "text": "•••", "masked": True})
    masked = page.get_by_role("img", name="The newest replay frame (masked)")
    expect(masked).to_be_visible()
    expect(page.get_by_label("Live screen")).to_have_count(0)
    expect(page.get_by_text("A secret was typed")).to_be_visible()
    page.wait_for_function("() => { const i = document.querySelector('img.screen'); "
                           "return i && i.complete && i.naturalWidth === 64; }")  # loaded with the session

    # Over: the outcome and the replay.
    set_row(server, aid, status="done", outcome="passed", finished_at=datetime.now(UTC))
    expect(page.get_by_role("heading", name="Replay")).to_be_visible()
    expect(page.get_by_role("list", name="Steps")).to_have_count(0)


def test_a_holders_screen_that_closes_is_not_taken_again_by_the_page(page: Page, server: Server) -> None:
    """Only a person's press takes a machine over: the hold may have ended (its cap, idle) as the screen
    closed. The page says so and shows Take over again; a press gets the writable screen back."""
    aid = running_attempt(server)
    answer(page, f"/v1/attempts/{aid}/view", lambda route: route.fulfill(json=view_of(True)[0]))
    takes: list[RfbPeer] = []

    def take(route: Route) -> None:
        started = datetime.now(UTC)
        set_row(server, aid, assisted=True, takeovers=[{"by": "admin", "by_key_id": "ak_x",
                                                        "started_at": started.isoformat(), "ended_at": None}])
        view, peer = view_of(False)
        takes.append(peer)
        route.fulfill(json={"object": "takeover", "attempt_id": aid, "by": "admin", "started_at": started.isoformat(),
                            "cap_at": (started + timedelta(minutes=30)).isoformat(), "idle_seconds": 300,
                            "view": view})

    answer(page, f"/v1/attempts/{aid}/takeover", take)
    sign_in(page, server.admin_key, f"/attempts/{aid}")
    expect(page.get_by_text(READ_ONLY)).to_be_visible()
    page.get_by_role("button", name="Take over").click()
    expect(page.get_by_text(WRITABLE)).to_be_visible()
    takes[0].hang_up()
    expect(page.get_by_role("alert")).to_contain_text("press Take over to get the screen back")
    take_button = page.get_by_role("button", name="Take over")
    expect(take_button).to_be_visible()
    expect(page.get_by_role("button", name="Hand back")).to_be_visible()
    # Past the page's reconnect delay (3 s), nothing asked for the machine again on the page's own.
    page.wait_for_timeout(4000)
    assert len(takes) == 1
    take_button.click()
    expect(page.get_by_text(WRITABLE)).to_be_visible()
    assert len(takes) == 2


def test_a_member_sees_who_holds_it_and_no_buttons(page: Page, server: Server) -> None:
    aid = running_attempt(server)
    started = datetime.now(UTC) - timedelta(minutes=2)
    set_row(server, aid, takeovers=[{"by": "alice", "started_at": started.isoformat(), "ended_at": None}])
    answer(page, f"/v1/attempts/{aid}/view", lambda route: route.fulfill(json=view_of(True)[0]))
    sign_in(page, server.member_key, f"/attempts/{aid}")
    expect(page.get_by_text("Held by alice since")).to_be_visible()
    expect(page.get_by_text(READ_ONLY)).to_be_visible()
    assert page.get_by_role("button", name="Take over").count() == 0
    assert page.get_by_role("button", name="Hand back").count() == 0
    # The run's page links the live attempt's page.
    run_id = httpx.get(f"{server.base_url}/v1/attempts/{aid}", timeout=30,
                       headers={"Authorization": f"Bearer {server.member_key}"}).json()["test_run_id"]
    page.goto(f"/test_runs/{run_id}")
    page.get_by_role("link", name="Watch").click()
    expect(page).to_have_url(f"{server.base_url}/attempts/{aid}")
