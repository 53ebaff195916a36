"""Live views end to end, without a browser: a Python RFB viewer (tests/kit/rfb.py) on the WebSocket a page
would open, through a real gh-server and gh-runner, to linux-tiny's own display (docs/protocol.md, "Live views").
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import threading
from typing import Any

import httpx
import pytest
from guidinghand import Eager, NotFoundError
from kit.rfb import Closed, Viewer

from .conftest import Stack, await_for
from .test_start_states import check_after

pytestmark = pytest.mark.timeout(1500)


def ws_url(stack: Stack, url: str) -> str:
    return stack.base_url.replace("http://", "ws://") + url


def ticket(stack: Stack, ssid: str, key: str | None = None) -> dict[str, Any]:
    r = httpx.post(f"{stack.base_url}/v1/start_states/{ssid}/view", timeout=30,
                   headers={"Authorization": f"Bearer {key or stack.admin_key}"})
    assert r.status_code == 200, (r.text, httpx.get(f"{stack.base_url}/v1/start_states/{ssid}", timeout=30,
                                                    headers={"Authorization": f"Bearer {stack.admin_key}"}).text)
    body = r.json()
    assert body["object"] == "live_view" and body["url"] == f"/v1/live/{body['ticket']}"
    return dict(body)


def member_key(stack: Stack) -> tuple[str, str]:
    name = "watcher-" + secrets.token_hex(3)
    r = httpx.post(f"{stack.base_url}/v1/api_keys", json={"name": name, "role": "member"}, timeout=30,
                   headers={"Authorization": f"Bearer {stack.admin_key}"})
    assert r.status_code in (200, 201), r.text
    return str(r.json()["key"]), name


def open_hand_state(gh: Eager, name: str) -> str:
    ss = gh.start_states.create(name, "linux-tiny")
    assert ss["status"] == "open"
    return str(ss["start_state_id"])


def discard(stack: Stack, gh: Eager, ssid: str) -> None:
    """Close the machine (a state never saved goes with it) and wait until the runner's slots are free
    again (the server forgets an unsaved state before the runner's close is done)."""
    gh.start_states.close(ssid)
    await_for(lambda: stack.daemon.busy == 0, what=f"{ssid}'s machine closed on the runner")
    with contextlib.suppress(NotFoundError):
        gh.start_states.delete(ssid)


def type_through(stack: Stack, viewer: Viewer, ssid: str, command: str, test: str) -> None:
    """Type `command` + Return through the view until `test` holds in the guest (a console that was not
    ready yet drops keys, so retype after a while)."""
    for _ in range(4):
        viewer.type(command)
        try:
            await_for(lambda: stack.guest_exec(ssid, test).exit_code == 0, what=f"{test!r} in {ssid}", timeout=30)
            return
        except AssertionError:
            continue
    raise AssertionError(f"typing {command!r} through the view never made {test!r} true")


def test_a_view_shows_the_screen_and_takes_an_admins_keys(stack: Stack, gh: Eager) -> None:
    ssid = open_hand_state(gh, "live view")
    t = ticket(stack, ssid)
    assert t["read_only"] is False
    with Viewer(ws_url(stack, t["url"])) as v:
        w, h = v.handshake()
        assert (w, h) == (720, 400)  # linux-tiny's console
        v.update(incremental=False)
        assert v.updates == 1 and any(v.fb)  # a first full frame, and not all black
        type_through(stack, v, ssid, "touch /tmp/x", "test -f /tmp/x")
        # The display is libvirt's to hand out: no QEMU listens on a TCP port (nor on a socket of its own).
        tcp = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True, timeout=30).stdout
        assert "qemu-system" not in tcp, tcp
        unix = subprocess.run(["ss", "-lxpH"], capture_output=True, text=True, check=True, timeout=30).stdout
        assert "vnc" not in unix, unix
        # Saving stops the machine (its memory is written): the view ends with the reason.
        gh.start_states.save(ssid)
        assert v.close_reason().reason == "machine_gone"
    assert gh.start_states.wait(ssid, timeout=600, poll_interval=1)["version"] == 1
    # The version restored from its memory image shows its screen too.
    gh.start_states.open(ssid)
    with Viewer(ws_url(stack, ticket(stack, ssid)["url"])) as again:
        again.handshake()
        again.update(incremental=False)
        assert any(again.fb)
    # What was sent is on the start state: who, how many keys; never the text.
    row = await_for(lambda: gh.start_states.retrieve(ssid).get("inputs"), what="the view's input recorded")[0]
    assert row["key_name"] == "admin (GH_SERVER_API_KEY)" and row["key_events"] >= len("touch /tmp/x") + 1
    assert "touch" not in str(gh.start_states.retrieve(ssid))
    discard(stack, gh, ssid)


def test_a_members_view_is_read_only_and_its_keys_never_reach_the_guest(stack: Stack, gh: Eager) -> None:
    ssid = open_hand_state(gh, "read-only view")
    key, _ = member_key(stack)
    ro = ticket(stack, ssid, key)
    assert ro["read_only"] is True
    with Viewer(ws_url(stack, ro["url"])) as watcher:
        watcher.handshake()
        watcher.update(incremental=False)  # it sees the screen
        watcher.type("touch /tmp/from-member")
        watcher.update(incremental=False)  # everything it sent before this was parsed by the server
        # An admin types after it: the console runs lines in order, so the member's would have run first.
        with Viewer(ws_url(stack, ticket(stack, ssid)["url"])) as admin:
            admin.handshake()
            type_through(stack, admin, ssid, "touch /tmp/from-admin", "test -f /tmp/from-admin")
    assert stack.guest_exec(ssid, "test -f /tmp/from-member").exit_code == 1
    inputs = await_for(lambda: gh.start_states.retrieve(ssid).get("inputs"), what="the admin's input recorded")
    assert [i["key_name"] for i in inputs] == ["admin (GH_SERVER_API_KEY)"]  # the member sent nothing
    discard(stack, gh, ssid)


def test_a_ticket_is_single_use_and_of_this_origin(stack: Stack, gh: Eager) -> None:
    ssid = open_hand_state(gh, "tickets")
    t = ticket(stack, ssid)
    with Viewer(ws_url(stack, t["url"])) as v:
        v.handshake()
    with Viewer(ws_url(stack, t["url"])) as again, pytest.raises(Closed) as used:
        again.handshake()
    assert (used.value.code, used.value.reason) == (4010, "ticket_invalid")
    with Viewer(ws_url(stack, "/v1/live/lv_" + secrets.token_urlsafe(32))) as v, pytest.raises(Closed) as unknown:
        v.handshake()
    assert unknown.value.reason == "ticket_invalid"
    other = ticket(stack, ssid)
    with Viewer(ws_url(stack, other["url"]), origin="http://evil.example") as v, pytest.raises(Closed) as cross:
        v.handshake()
    assert cross.value.reason == "ticket_invalid"
    discard(stack, gh, ssid)
    # No open machine: no ticket.
    r = httpx.post(f"{stack.base_url}/v1/start_states/{ssid}/view", timeout=30,
                   headers={"Authorization": f"Bearer {stack.admin_key}"})
    assert r.status_code in (404, 409)


def test_a_viewer_that_stops_reading_is_dropped_and_an_attempt_beside_it_finishes(stack: Stack, gh: Eager) -> None:
    """Fault: a viewer asks for full frames and never reads them, while an attempt runs on the same runner."""
    ssid = open_hand_state(gh, "stalled viewer")
    t = ticket(stack, ssid)
    relay = stack.state.extras["live_relay"]
    before = relay.ended["viewer_too_slow"]
    v = Viewer(ws_url(stack, t["url"]), max_queue=1)
    v.handshake()
    stop = threading.Event()

    def ask_and_never_read() -> None:
        while not stop.is_set():
            try:
                v.request(incremental=False)
            except Exception:
                return
            stop.wait(0.05)

    asker = threading.Thread(target=ask_and_never_read, daemon=True)
    asker.start()
    try:
        case = gh.test_cases.create("beside a stalled viewer", "Nothing to do.", "linux-tiny",  # type: ignore[arg-type]
                                    check_after("true"), limits={"minutes": 5})
        run = gh.test_runs.create(test_case_ids=[case["test_case_id"]], agents=["noop"])
        done = gh.test_runs.wait(run["test_run_id"], timeout=600, poll_interval=1)
        assert done["status"] == "completed", done
        attempts = gh.test_runs.list_all_attempts(run["test_run_id"])
        assert [a["outcome"] for a in attempts] == ["passed"], attempts
        await_for(lambda: relay.ended["viewer_too_slow"] > before, what="the stalled viewer dropped", timeout=120)
    finally:
        stop.set()
        asker.join(10)
        v.close()
    gh.test_cases.delete(case["test_case_id"])
    discard(stack, gh, ssid)
