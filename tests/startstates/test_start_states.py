"""Start states end to end: SDK -> gh-server -> gh-runner -> QEMU (linux-tiny), and back.

Cases here use the `noop` agent (or `gate`, which only waits), so the verdict is exactly what the
machine's disk says: the check prints False before the task and, after it, True only when the start
state carried the change. The same check on the plain image fails, so a start state that did not
carry the change cannot pass.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from guidinghand import ConflictError, Eager, NotFoundError

from .conftest import Stack, await_for

pytestmark = pytest.mark.timeout(1500)

RUN_TIMEOUT = 600.0


def check_after(test: str) -> dict[str, str]:
    """A check that is False before the task and, after it, True exactly when `test` holds in the guest."""
    return {"check_script": (
        'if [ "$GH_CHECK_PHASE" = before ]; then echo False; exit 0; fi\n'
        f"if {test}; then echo True; else echo False; fi\n"
    )}


def make_case(gh: Eager, name: str, start_state: str, test: str) -> str:
    case = gh.test_cases.create(name, "Is it there?", start_state, check_after(test),  # type: ignore[arg-type]
                                limits={"minutes": 5})
    return str(case["test_case_id"])


def run(gh: Eager, case_ids: list[str], agents: list[str] | None = None) -> dict[str, Any]:
    created = gh.test_runs.create(test_case_ids=case_ids, agents=agents or ["noop"])
    return dict(created)


def outcomes(gh: Eager, run_id: str) -> dict[str, str | None]:
    """test_case_id -> outcome, once the run is done (with each attempt's error when it is one)."""
    done = gh.test_runs.wait(run_id, timeout=RUN_TIMEOUT, poll_interval=1)
    assert done["status"] == "completed", done
    out: dict[str, str | None] = {}
    for a in gh.test_runs.list_all_attempts(run_id):
        assert a["outcome"] != "error", a  # an error would say the plumbing failed, not the state
        out[a["test_case_id"]] = a["outcome"]
    return out


def screen_at_once(gh: Eager, ssid: str) -> bytes:
    """The open machine's screen, asked once: from the moment the status says `open` the runner
    answers from the hypervisor (the boot screen while it boots), never 409 "not open"."""
    png = gh.start_states.screen(ssid)
    assert png.startswith(b"\x89PNG")
    return png


def _when(ts: str | None) -> datetime:
    assert ts is not None
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


def type_until(stack: Stack, gh: Eager, ssid: str, command: str, test: str) -> None:
    """Type `command` + ENTER on the console until `test` holds in the guest (a console that was not
    ready yet drops keys, so retype after a while)."""
    for _ in range(4):
        res = gh.start_states.input(ssid, [{"type": "type", "text": command}, {"type": "key", "keys": ["ENTER"]}])
        assert res["ok"] is True
        try:
            await_for(lambda: stack.guest_exec(ssid, test).exit_code == 0, what=f"{test!r} in {ssid}", timeout=30)
            return
        except AssertionError:
            continue
    raise AssertionError(f"typing {command!r} on {ssid}'s console never made {test!r} true")


def test_script_built_state_is_ready_and_cases_on_it_see_the_change(stack: Stack, gh: Eager) -> None:
    ss = gh.start_states.create("built by script", "linux-tiny",
                                script="mkdir -p /srv && echo built > /srv/marker")
    assert ss["status"] == "building" and ss["method"] == "script" and ss["version"] == 0
    ready = gh.start_states.wait(ss["start_state_id"], timeout=RUN_TIMEOUT, poll_interval=1)
    assert ready["status"] == "ready", ready
    assert ready["version"] == 1 and ready["error"] is None
    assert ready["runner_id"] is not None
    ssid = ready["start_state_id"]
    assert (ssid, 1) in stack.held()
    hook = await_for(lambda: stack.hooks.of("start_state.ready", ssid), what="the start_state.ready webhook")
    assert hook[0]["data"]["start_state"]["version"] == 1

    test = '[ "$(cat /srv/marker 2>/dev/null)" = built ]'
    on_state = make_case(gh, "sees the script's change", ssid, test)
    on_image = make_case(gh, "the plain image does not", "linux-tiny", test)
    r = run(gh, [on_state, on_image])
    assert outcomes(gh, r["test_run_id"]) == {on_state: "passed", on_image: "failed"}

    # Listed after the images, filterable.
    listed = gh.start_states.list(kind="state", q="built by")["data"]
    assert [x["start_state_id"] for x in listed] == [ssid]
    assert gh.start_states.list(kind="image")["data"][0]["kind"] == "image"

    # In use: 409 naming the case; once the case is gone, delete removes its disks on the runner.
    with pytest.raises(ConflictError) as e:
        gh.start_states.delete(ssid)
    assert e.value.extra.get("code") == "in_use"
    assert e.value.extra.get("test_case_ids") == [on_state]
    assert gh.start_states.retrieve(ssid)["status"] == "ready"
    gh.test_cases.delete(on_state)
    gh.test_cases.delete(on_image)
    assert gh.start_states.delete(ssid)["deleted"] is True
    with pytest.raises(NotFoundError):
        gh.start_states.retrieve(ssid)
    await_for(lambda: not any(s == ssid for s, _ in stack.held()), what=f"{ssid}'s disks deleted")


def test_failing_script_is_failed_with_the_reason(stack: Stack, gh: Eager) -> None:
    ss = gh.start_states.create("broken build", "linux-tiny", script="echo nope >&2; exit 3")
    done = gh.start_states.wait(ss["start_state_id"], timeout=RUN_TIMEOUT, poll_interval=1)
    assert done["status"] == "failed" and done["version"] == 0
    assert "exited with 3" in (done["error"] or "") and "nope" in (done["error"] or "")
    hook = await_for(lambda: stack.hooks.of("start_state.failed", ss["start_state_id"]),
                     what="the start_state.failed webhook")
    assert hook[0]["data"]["start_state"]["status"] == "failed"
    assert not any(s == ss["start_state_id"] for s, _ in stack.held())
    with pytest.raises(ConflictError):
        gh.start_states.open(ss["start_state_id"])
    gh.start_states.delete(ss["start_state_id"])


def test_hand_state_typed_saved_and_close_discards(stack: Stack, gh: Eager) -> None:
    ss = gh.start_states.create("made by hand", "linux-tiny")
    ssid = ss["start_state_id"]
    assert ss["method"] == "hand" and ss["status"] == "open" and ss["version"] == 0
    view = ss["view"]
    assert view is not None
    assert view["screen_url"].endswith(f"/v1/start_states/{ssid}/screen")
    assert view["input_url"].endswith(f"/v1/start_states/{ssid}/input")
    # Opened just now, no input yet: it expires one idle period (900 s in these tests) from now.
    left = _when(view["expires_at"]) - datetime.now(UTC)
    assert timedelta(seconds=800) < left <= timedelta(seconds=900)

    screen_at_once(gh, ssid)
    # Input too works from the first moment (a pointer move is harmless on any screen).
    assert gh.start_states.input(ssid, [{"type": "move", "x": 10, "y": 10}])["ok"] is True
    type_until(stack, gh, ssid, "touch /root/hand-made", "test -f /root/hand-made")
    typed_view = gh.start_states.retrieve(ssid)["view"]
    assert typed_view is not None  # input moved the idle deadline on
    assert _when(typed_view["expires_at"]) > _when(view["expires_at"])
    saving = gh.start_states.save(ssid)
    assert saving["status"] == "saving" and saving["view"] is None
    ready = gh.start_states.wait(ssid, timeout=RUN_TIMEOUT, poll_interval=1)
    assert ready["status"] == "ready" and ready["version"] == 1, ready
    assert (ssid, 1) in stack.held()

    # Open it again, make a change, close: the change is discarded and the version stays 1.
    opened = gh.start_states.open(ssid)
    assert opened["status"] == "open" and opened["view"] is not None
    screen_at_once(gh, ssid)
    type_until(stack, gh, ssid, "touch /root/discarded", "test -f /root/discarded")
    closed = gh.start_states.close(ssid)
    assert closed["status"] == "ready" and closed["version"] == 1
    assert stack.held() >= {(ssid, 1)} and (ssid, 2) not in stack.held()

    kept = make_case(gh, "hand-made file is there", ssid, "test -f /root/hand-made")
    dropped = make_case(gh, "discarded file is not", ssid, "test -f /root/discarded")
    r = run(gh, [kept, dropped])
    assert outcomes(gh, r["test_run_id"]) == {kept: "passed", dropped: "failed"}
    for c in (kept, dropped):
        gh.test_cases.delete(c)
    gh.start_states.delete(ssid)


def test_a_run_keeps_the_version_it_started_with(stack: Stack, gh: Eager) -> None:
    """Version 2 is saved while a run pinned to version 1 is in its task phase: that run still sees
    version 1, a new run sees version 2, and version 1 is collected from the runner once unpinned."""
    ss = gh.start_states.create("pinned", "linux-tiny", script="echo v1 > /root/marker")
    ssid = ss["start_state_id"]
    assert gh.start_states.wait(ssid, timeout=RUN_TIMEOUT, poll_interval=1)["version"] == 1
    is_v1 = '[ "$(cat /root/marker)" = v1 ]'
    case = make_case(gh, "still on v1", ssid, is_v1)

    pinned = run(gh, [case], agents=["gate"])
    gate: Path = stack.gate_dir
    await_for(lambda: list(gate.glob("*.entered")), what="the pinned attempt's task phase", timeout=RUN_TIMEOUT)

    gh.start_states.open(ssid)
    screen_at_once(gh, ssid)
    type_until(stack, gh, ssid, "echo v2 > /root/marker", '[ "$(cat /root/marker)" = v2 ]')
    gh.start_states.save(ssid)
    v2 = gh.start_states.wait(ssid, timeout=RUN_TIMEOUT, poll_interval=1)
    assert v2["status"] == "ready" and v2["version"] == 2
    # Still in progress, so version 1 is still needed and still on disk.
    assert gh.test_runs.retrieve(pinned["test_run_id"])["status"] == "running"
    assert {(ssid, 1), (ssid, 2)} <= stack.held()
    # The case itself may go, but the state may not while the run that froze it still needs its disk.
    gh.test_cases.delete(case)
    with pytest.raises(ConflictError) as e:
        gh.start_states.delete(ssid)
    assert e.value.extra.get("code") == "in_use" and e.value.extra.get("test_case_ids") == [case]

    (gate / "release").write_text("go")
    assert outcomes(gh, pinned["test_run_id"]) == {case: "passed"}

    case = make_case(gh, "now on v2", ssid, is_v1)
    later = run(gh, [case])
    assert outcomes(gh, later["test_run_id"]) == {case: "failed"}  # the marker says v2 now

    await_for(lambda: (ssid, 1) not in stack.held(), what="version 1 collected once nothing pins it")
    assert (ssid, 2) in stack.held()
    gh.test_cases.delete(case)
    gh.start_states.delete(ssid)


def test_idle_open_machine_closes_itself(stack: Stack, gh: Eager) -> None:
    ss = gh.start_states.create("left open", "linux-tiny")
    ssid = ss["start_state_id"]
    screen_at_once(gh, ssid)
    await_for(lambda: stack.daemon.jobs.is_open(ssid), what=f"{ssid} booted", timeout=120)
    try:
        stack.set_idle(3.0)
        # Never saved, so closing it for idleness deletes it (and its machine goes).
        await_for(lambda: _gone(gh, ssid), what=f"{ssid} closed for idleness", timeout=120)
        await_for(lambda: not stack.daemon.jobs.is_open(ssid), what="its machine destroyed", timeout=120)
    finally:
        stack.set_idle(900.0)


def _gone(gh: Eager, ssid: str) -> bool:
    try:
        gh.start_states.retrieve(ssid)
    except NotFoundError:
        return True
    return False


def test_input_is_validated_and_needs_an_open_state(stack: Stack, gh: Eager) -> None:
    ss = gh.start_states.create("validation", "linux-tiny", script="true")
    ssid = ss["start_state_id"]
    with pytest.raises(ConflictError):  # building: nothing to type into
        gh.start_states.input(ssid, [{"type": "key", "keys": ["ENTER"]}])
    with pytest.raises(ConflictError):
        gh.start_states.save(ssid)
    gh.start_states.wait(ssid, timeout=RUN_TIMEOUT, poll_interval=1)
    with pytest.raises(ConflictError):
        gh.start_states.close(ssid)
    gh.start_states.delete(ssid)


def test_instruction_state_is_set_up_by_the_agent_then_saved(stack: Stack, gh: Eager) -> None:
    ss = gh.start_states.create("set up by an agent", "linux-tiny", instruction="Leave a note in /root/by-agent",
                                agent_id="reference", metadata={"reference_fix": "echo agent > /root/by-agent"})
    ssid = ss["start_state_id"]
    assert ss["method"] == "instruction" and ss["status"] == "building" and ss["agent_id"] == "reference"
    ready = gh.start_states.wait(ssid, timeout=RUN_TIMEOUT, poll_interval=1)
    assert ready["status"] == "ready" and ready["version"] == 1, ready
    assert (ready["task_id"] or "").startswith("tk_")
    await_for(lambda: not stack.daemon.jobs.is_open(ssid), what="the agent's machine closed after the save")

    case = make_case(gh, "the agent's note is there", ssid, '[ "$(cat /root/by-agent)" = agent ]')
    r = run(gh, [case])
    assert outcomes(gh, r["test_run_id"]) == {case: "passed"}
    gh.test_cases.delete(case)
    gh.start_states.delete(ssid)


def test_instruction_state_set_up_by_an_external_agent_through_the_machine_api(stack: Stack, gh: Eager) -> None:
    ss = gh.start_states.create("set up from outside", "linux-tiny", instruction="noted from outside",
                                agent_id="note-taker")
    ssid = ss["start_state_id"]
    ready = gh.start_states.wait(ssid, timeout=RUN_TIMEOUT, poll_interval=1)
    assert ready["status"] == "ready" and ready["version"] == 1, ready
    case = make_case(gh, "the external agent's note is there", ssid,
                     '[ "$(cat /root/by-external)" = "noted from outside" ]')
    r = run(gh, [case])
    assert outcomes(gh, r["test_run_id"]) == {case: "passed"}
    gh.test_cases.delete(case)
    gh.start_states.delete(ssid)


def test_instruction_with_an_unknown_agent_fails_and_closes_the_machine(stack: Stack, gh: Eager) -> None:
    ss = gh.start_states.create("nobody to do it", "linux-tiny", instruction="Do something", agent_id="nobody")
    ssid = ss["start_state_id"]
    done = gh.start_states.wait(ssid, timeout=RUN_TIMEOUT, poll_interval=1)
    assert done["status"] == "failed" and done["version"] == 0
    assert "unknown agent 'nobody'" in (done["error"] or "")
    await_for(lambda: not stack.daemon.jobs.is_open(ssid), what="the machine closed")
    assert not any(s == ssid for s, _ in stack.held())
    gh.start_states.delete(ssid)
