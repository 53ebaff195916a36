"""Live views end to end, without a browser: a Python RFB viewer (tests/kit/rfb.py) on the WebSocket a page
would open, through a real gh-server and gh-runner, to linux-tiny's own display (docs/protocol.md, "Live views").
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from guidinghand import Eager, NotFoundError
from kit.rfb import Closed, Viewer, stalled_viewer

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


def new_key(stack: Stack, role: str, name: str | None = None) -> tuple[str, str]:
    """A new API key and its id (named `name`, else for its role)."""
    name = name or f"{role}-{secrets.token_hex(3)}"
    r = httpx.post(f"{stack.base_url}/v1/api_keys", json={"name": name, "role": role}, timeout=30,
                   headers={"Authorization": f"Bearer {stack.admin_key}"})
    assert r.status_code in (200, 201), r.text
    return str(r.json()["key"]), str(r.json()["id"])


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


def on_attempt(stack: Stack, attempt_id: str, op: Literal["exec", "input"], **kw: Any) -> Any:
    """A machine request on a running attempt's machine, as its agent makes them (through the runner)."""
    from gh_wire import protocol

    req = protocol.MachineRequest(request_id=secrets.token_hex(8), attempt_id=attempt_id, op=op, timeout=60, **kw)
    res = stack.call(stack.daemon.leases.request(req), timeout=90)
    assert res is not None and res.ok, res
    return res


def in_guest(stack: Stack, attempt_id: str, script: str) -> int:
    """The exit code of `script` on a running attempt's machine, run by the runner itself as its check is:
    never the agent's exec, so a takeover's hold (which freezes the agent's execs) does not stop it."""
    machine = stack.daemon.leases.running[attempt_id].attempt.machine
    assert machine is not None, f"{attempt_id} has no machine"
    return int(stack.call(machine.run_script(script, timeout=60), timeout=90).exit_code)


def test_an_attempts_view_is_read_only_and_ends_with_the_attempt(stack: Stack, gh: Eager) -> None:
    """A running attempt's machine, watched by an admin: a first frame, keys that never reach the guest
    (the attempt's input is the agent's: its view is read-only for everyone), and the end of the view
    with the attempt's."""
    gate: Path = stack.gate_dir
    case = gh.test_cases.create("watched attempt", "Nothing to do.", "linux-tiny",  # type: ignore[arg-type]
                                check_after("test ! -e /tmp/from-viewer"), limits={"minutes": 10})
    run = gh.test_runs.create(test_case_ids=[case["test_case_id"]], agents=["gate"])
    try:
        entered = await_for(lambda: list(gate.glob("*.entered")), what="the attempt's task phase", timeout=900)
        aid = entered[0].name.removesuffix(".entered")
        r = httpx.post(f"{stack.base_url}/v1/attempts/{aid}/view", timeout=30,
                       headers={"Authorization": f"Bearer {stack.admin_key}"})
        assert r.status_code == 200, r.text
        t = r.json()
        assert (t["object"], t["read_only"], t["url"]) == ("live_view", True, f"/v1/live/{t['ticket']}")
        with Viewer(ws_url(stack, t["url"])) as v:
            assert v.handshake() == (720, 400)  # linux-tiny's console: a root shell on tty1
            v.update(incremental=False)
            assert v.updates == 1 and any(v.fb)
            v.type("touch /tmp/from-viewer")
            v.update(incremental=False)  # everything it sent before this was parsed by the server
            # The agent's own input after it: the console runs lines in order, so the viewer's would
            # have run first.
            for _ in range(4):  # a console not ready yet drops keys: retype after a while
                on_attempt(stack, aid, "input", events=[{"type": "type", "text": "touch /tmp/from-agent"},
                                                        {"type": "key", "keys": ["ENTER"]}])
                with contextlib.suppress(AssertionError):
                    await_for(lambda: on_attempt(stack, aid, "exec", script="test -f /tmp/from-agent").exit_code == 0,
                              what="the agent's line run", timeout=30)
                    break
            else:
                raise AssertionError("the agent's input never ran on the console")
            assert on_attempt(stack, aid, "exec", script="test -e /tmp/from-viewer").exit_code == 1
            (gate / "release").write_text("go")
            assert v.close_reason(timeout=600).reason == "machine_gone"  # the attempt's machine went with it
    finally:
        (gate / "release").write_text("go")
    gh.test_runs.wait(run["test_run_id"], timeout=600, poll_interval=1)
    assert [a["outcome"] for a in gh.test_runs.list_all_attempts(run["test_run_id"])] == ["passed"]
    over = httpx.post(f"{stack.base_url}/v1/attempts/{aid}/view", timeout=30,
                      headers={"Authorization": f"Bearer {stack.admin_key}"})
    assert over.status_code == 409 and over.json()["error"]["outcome"] == "passed", over.text
    for f in [gate / "release", *entered]:
        f.unlink()
    gh.test_cases.delete(case["test_case_id"])


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
    # A key revoked ends its open views at once, with the reason (the view is not the key's to outlive).
    key, key_id = new_key(stack, "admin")
    with Viewer(ws_url(stack, ticket(stack, ssid, key)["url"])) as v:
        v.handshake()
        v.update(incremental=False)
        r = httpx.delete(f"{stack.base_url}/v1/api_keys/{key_id}", timeout=30,
                         headers={"Authorization": f"Bearer {stack.admin_key}"})
        assert r.status_code == 200, r.text
        assert v.close_reason(timeout=60).reason == "key_revoked"
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
    with stalled_viewer(ws_url(stack, t["url"])):
        case = gh.test_cases.create("beside a stalled viewer", "Nothing to do.", "linux-tiny",  # type: ignore[arg-type]
                                    check_after("true"), limits={"minutes": 5})
        run = gh.test_runs.create(test_case_ids=[case["test_case_id"]], agents=["noop"])
        done = gh.test_runs.wait(run["test_run_id"], timeout=600, poll_interval=1)
        assert done["status"] == "completed", done
        attempts = gh.test_runs.list_all_attempts(run["test_run_id"])
        assert [a["outcome"] for a in attempts] == ["passed"], attempts
        await_for(lambda: relay.ended["viewer_too_slow"] > before, what="the stalled viewer dropped", timeout=120)
    gh.test_cases.delete(case["test_case_id"])
    discard(stack, gh, ssid)
