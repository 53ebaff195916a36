"""Who may ask for a live view (gh_server/live/api.py), without a runner: the refusals come before any
machine is needed. The views themselves are tested on linux-tiny in tests/startstates/test_live_view.py."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import httpx
import pytest

from gh_server.auth import create_key
from gh_server.live.screen_relay import MAX_WATCHES_PER_KEY_MACHINE
from gh_server.models import ApiKey, Attempt, StartState, new_id

from .conftest import RunningServer, Server, make_settings


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """gh-server with its runner gateway (the live routes come with it), and no runner."""
    settings, data_dir = make_settings(None, gateway=True)
    running = RunningServer(settings)
    running.start()
    try:
        st = running.app.state.gh
        with st.db.begin() as s:
            _row, member_key = create_key(s, "watcher", "member")
        yield Server(base_url=f"http://127.0.0.1:{settings.port}",
                     admin_key=(data_dir / "admin-api-key").read_text().strip(), member_key=member_key, state=st,
                     data_dir=data_dir)
    finally:
        running.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def post(server: Server, path: str, key: str) -> httpx.Response:
    return httpx.post(server.base_url + path, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def get(server: Server, path: str, key: str) -> httpx.Response:
    return httpx.get(server.base_url + path, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_a_start_states_view_follows_its_screens_rule(server: Server) -> None:
    """A member may not read an open machine's screen, so it may not watch it either: the same 403."""
    ssid = new_id("ss_")
    with server.state.db.begin() as s:  # open on a runner that is not connected to this server
        s.add(StartState(id=ssid, name="hand work", from_="linux-tiny", image="linux-tiny", method="hand",
                         status="open", runner_id="rn_elsewhere"))
    screen = get(server, f"/v1/start_states/{ssid}/screen", server.member_key)
    view = post(server, f"/v1/start_states/{ssid}/view", server.member_key)
    assert screen.status_code == view.status_code == 403, view.text
    assert view.json()["error"]["message"] == screen.json()["error"]["message"]
    assert "admin" in view.json()["error"]["message"]
    # An admin gets past the rule to the machine's own state (no runner here holds it).
    assert post(server, f"/v1/start_states/{ssid}/view", server.admin_key).status_code == 409
    assert post(server, "/v1/start_states/ss_nope/view", server.admin_key).status_code == 404


def test_an_attempts_view_needs_a_member_and_a_running_attempt(server: Server) -> None:
    """Who may read the replay may watch (a member too); the runner masks what the replay masks."""
    c = server.admin
    case = c.test_cases.create("watched", "Nothing to do.", "linux-tiny", {"check_script": "true"})  # type: ignore[arg-type]
    run = c.test_runs.create(test_case_ids=[case["test_case_id"]], agents=["noop"])
    [attempt] = c.test_runs.list_all_attempts(run["test_run_id"])
    aid = attempt["attempt_id"]
    assert attempt["live_url"] is None  # queued: no machine to watch yet
    # Queued (no runner here): nothing to watch yet; a member is told so as an admin is.
    for key in (server.member_key, server.admin_key):
        queued = post(server, f"/v1/attempts/{aid}/view", key)
        assert queued.status_code == 409, queued.text
        assert (queued.json()["error"]["status"], queued.json()["error"]["outcome"]) == ("queued", None)
    assert httpx.post(f"{server.base_url}/v1/attempts/{aid}/view", timeout=30).status_code == 401
    with server.state.db.begin() as s:
        row = s.get(Attempt, aid)
        assert row is not None
        row.status = "running"
    # Its page is where it is watched, while it runs.
    live = get(server, f"/v1/attempts/{aid}", server.member_key).json()
    assert live["live_url"] == f"{server.base_url}/attempts/{aid}"
    # Over: the 409 says how it ended.
    with server.state.db.begin() as s:
        row = s.get(Attempt, aid)
        assert row is not None
        row.status, row.outcome = "done", "passed"
    over = post(server, f"/v1/attempts/{aid}/view", server.admin_key)
    assert over.status_code == 409 and "passed" in over.json()["error"]["message"], over.text
    assert (over.json()["error"]["status"], over.json()["error"]["outcome"]) == ("done", "passed")
    assert post(server, "/v1/attempts/at_nope/view", server.admin_key).status_code == 404


def test_a_keys_watchers_of_an_attempt_past_its_share_are_refused_at_the_ticket(server: Server) -> None:
    """Issue 49: a member that asks for more watchers of one attempt than its share (MAX_WATCHES_PER_KEY_MACHINE,
    its unused tickets counted) is refused 429 `too_many_views` at once: no lookup, no ticket, no socket to
    open. Another key, and the same key for another attempt, are not refused for it."""
    relay = server.state.extras["live_relay"]
    with server.state.db.begin() as s:
        _row, other_key = create_key(s, "other watcher", "member")
        member = s.query(ApiKey).filter(ApiKey.name == "watcher").one()
    for _ in range(MAX_WATCHES_PER_KEY_MACHINE):  # tickets the member asked for and has not opened
        relay.tickets.issue(key_id=member.id, key_name="watcher", read_only=True, attempt_id="at_watched")
    over = post(server, "/v1/attempts/at_watched/view", server.member_key)
    assert over.status_code == 429, over.text
    assert over.json()["error"]["code"] == "too_many_views"
    assert relay.tickets.unused(member.id, "at_watched") == MAX_WATCHES_PER_KEY_MACHINE  # none issued
    # Not this key's share: the request goes on to the attempt itself (none by that id here: 404).
    assert post(server, "/v1/attempts/at_watched/view", other_key).status_code == 404
    assert post(server, "/v1/attempts/at_other/view", server.member_key).status_code == 404


def test_a_keys_watchers_tickets_past_its_rate_are_refused_before_any_lookup(server: Server) -> None:
    """Issue 49: a key asks for TICKET_BURST_PER_KEY watchers' tickets, then one every 1/TICKETS_PER_KEY_PER_S
    s; past that it is told 429 at once, before the attempt is looked up (no such attempt here: 404 while
    admitted)."""
    from gh_server.live.tickets import TICKET_BURST_PER_KEY

    with server.state.db.begin() as s:
        _row, key = create_key(s, "bursting watcher", "member")
    answers = [post(server, "/v1/attempts/at_nowhere/view", key) for _ in range(TICKET_BURST_PER_KEY + 1)]
    assert [r.status_code for r in answers] == [404] * TICKET_BURST_PER_KEY + [429], [r.text for r in answers]
    assert "the next in" in answers[-1].json()["error"]["message"]
