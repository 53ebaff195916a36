"""Takeovers end to end, without a browser: a real gh-server and gh-runner on linux-tiny, a command agent
that only looks (tests/startstates/look_agent.py), and a person driving through the live view the takeover
hands them (tests/kit/rfb.py) (docs/server-api.md, "Takeovers"; docs/agents.md, "Takeover").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from guidinghand import Eager
from kit.rfb import Viewer
from websockets.exceptions import ConnectionClosed

from gh_wire.vocab import HumanKey

from .conftest import Stack, await_for
from .test_live_view import in_guest, new_key, ws_url
from .test_start_states import check_after

pytestmark = pytest.mark.timeout(1800)

EURO, ZHE, KP_4, KP_2 = 0x20AC, 0x06D6, 0xFFB4, 0xFFB2  # keysyms (X11 keysymdef.h)


def api(stack: Stack, method: str, path: str, key: str | None = None, **kw: Any) -> httpx.Response:
    return httpx.request(method, f"{stack.base_url}{path}", timeout=60,
                         headers={"Authorization": f"Bearer {key or stack.admin_key}"}, **kw)


def attempt(stack: Stack, aid: str) -> dict[str, Any]:
    r = api(stack, "GET", f"/v1/attempts/{aid}")
    assert r.status_code == 200, r.text
    return dict(r.json())


def lines(path: Path) -> list[tuple[float, float]]:
    """The looker's screens: (asked, answered) wall-clock times."""
    if not path.exists():
        return []
    return [(float(a), float(b)) for a, b in (ln.split() for ln in path.read_text().splitlines() if ln.strip())]


@pytest.fixture()
def looking(stack: Stack, gh: Eager) -> Iterator[Any]:
    """Start the looker on a case whose check passes only if /tmp/by-human exists (or on `test`); yields
    a function that returns the attempt id once its agent looks."""
    gate: Path = stack.gate_dir
    made: list[tuple[str, str]] = []

    def start(minutes: int, test: str = "test -e /tmp/by-human") -> tuple[str, str]:
        before = set(gate.glob("*.token"))
        case = gh.test_cases.create("taken over", "Look at the screen.", "linux-tiny",  # type: ignore[arg-type]
                                    check_after(test), limits={"minutes": minutes})
        run = gh.test_runs.create(test_case_ids=[case["test_case_id"]], agents=["looker"])
        made.append((case["test_case_id"], run["test_run_id"]))
        token = await_for(lambda: set(gate.glob("*.token")) - before, what="the looker's task", timeout=900)
        aid = next(iter(token)).name.removesuffix(".token")
        await_for(lambda: lines(gate / f"{aid}.screens"), what="the looker's first screen", timeout=300)
        return aid, str(run["test_run_id"])

    try:
        yield start
    finally:
        for f in gate.glob("*.token"):
            (gate / f.name.replace(".token", ".done")).write_text("1")
        for case_id, run_id in made:
            gh.test_runs.wait(run_id, timeout=900, poll_interval=1)
            gh.test_cases.delete(case_id)


def replay_marks(stack: Stack, aid: str) -> list[tuple[str, Any]]:
    from sqlalchemy import select

    from gh_server.models import ReplayFrame

    with stack.state.db() as s:
        rows = s.execute(select(ReplayFrame.label, ReplayFrame.event).where(ReplayFrame.attempt_id == aid)
                         .order_by(ReplayFrame.seq)).all()
    return [(label, event) for label, event in rows if label in ("takeover", "handback")]


def as_agent(stack: Stack, aid: str, method: str, op: str, **kw: Any) -> httpx.Response:
    """A machine API request with the attempt's agent token, as the agent would make it."""
    doc = json.loads((stack.gate_dir / f"{aid}.token").read_text())
    return httpx.request(method, f"{doc['url']}/{op}", timeout=3600,
                         headers={"Authorization": f"Bearer {doc['token']}"}, **kw)


def test_a_takeover_holds_the_agent_and_its_time_and_hands_back(stack: Stack, looking: Any) -> None:
    """Two admins press Take over at once: one holds. The agent's requests wait while held (its screen is
    answered fresh at hand-back, its input `taken_over`), the task's one-minute limit does not run for a
    hold longer than it, the person's command fixes the machine, and the attempt passes by its check and is
    assisted. A takeover of the finished attempt is refused with its outcome."""
    aid, run_id = looking(minutes=1)
    other_key, _ = new_key(stack, "admin")

    async def both() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as c:
            return list(await asyncio.gather(*(
                c.post(f"/v1/attempts/{aid}/takeover", headers={"Authorization": f"Bearer {k}"})
                for k in (stack.admin_key, other_key))))

    first, second = asyncio.run(both())
    assert sorted([first.status_code, second.status_code]) == [200, 409], (first.text, second.text)
    won, lost = (first, second) if first.status_code == 200 else (second, first)
    holder_key = stack.admin_key if won is first else other_key
    took = won.json()
    assert took["object"] == "takeover" and took["attempt_id"] == aid and took["view"]["read_only"] is False
    refused = lost.json()["error"]
    assert refused["code"] == "held" and refused["held_by"] == took["by"] and refused["since"] == took["started_at"]
    taken_at = time.time()

    shown = attempt(stack, aid)
    assert shown["assisted"] is True and shown["takeover"]["by"] == took["by"]
    assert shown["live_url"] == f"{stack.base_url}/attempts/{aid}"
    assert shown["takeovers"][0]["ended_at"] is None and shown["takeovers"][0]["by"] == took["by"]

    pool = ThreadPoolExecutor(2)
    try:
        screen: Future[httpx.Response] = pool.submit(as_agent, stack, aid, "GET", "screen")
        typed: Future[httpx.Response] = pool.submit(as_agent, stack, aid, "POST", "input",
                                                    json={"events": [{"type": "key", "keys": ["ENTER"]}]})
        with Viewer(ws_url(stack, took["view"]["url"])) as v:
            assert v.handshake() == (720, 400)
            for _ in range(4):  # a console not ready yet drops keys: retype after a while
                v.type("touch /tmp/by-human")
                try:
                    await_for(lambda: in_guest(stack, aid, "test -e /tmp/by-human") == 0,
                              what="the person's command run", timeout=30)
                    break
                except AssertionError:
                    continue
            else:
                raise AssertionError("the person's command never ran")
            # What a person's browser (noVNC) sends for keys beyond ASCII: the euro sign, Cyrillic zhe, keypad 4,
            # and keypad 2 as QEMU's extended key event. Each types (or is typed), so each is counted, never kept.
            for sym in (EURO, ZHE, KP_4):
                v.press(sym)
            for down in (1, 0):
                v.send(struct.pack(">BBHII", 255, 0, down, KP_2, 0x50))
            v.pointer(10, 10, 1)
            v.pointer(10, 10, 0)
            # Held past the task's whole limit, on the runner's clock, and the task runs on.
            task_clock = stack.daemon.leases.running[aid].attempt._hold.clock  # type: ignore[union-attr]
            await_for(lambda: task_clock.held and task_clock.held_seconds() > 70, what="a hold past the limit",
                      timeout=300, every=2)
            assert attempt(stack, aid)["status"] == "running"
            assert not screen.done() and not typed.done()  # the agent's requests wait
            handed_at = time.time()
            back = api(stack, "POST", f"/v1/attempts/{aid}/handback", holder_key)
            assert back.status_code == 200, back.text
            assert v.close_reason().reason == "closed"  # the holder's view ends with the hold
        entry = back.json()
        assert entry["object"] == "takeover" and entry["ended_by"] == "handed_back" and entry["held_seconds"] > 70
        assert entry["counts"]["typed"] >= len("touch /tmp/by-human") and entry["counts"]["clicks"] == 1
        assert {"kind": "key", "keys": "Return"} in [{k: e[k] for k in ("kind", "keys")} for e in entry["events"]
                                                     if e["kind"] == "key"]
        assert entry["counts"]["typed"] >= len("touch /tmp/by-human") + 4
        assert "touch" not in json.dumps(entry)  # what was typed is counted, never kept
        assert {e["keys"].split("+")[-1] for e in entry["events"] if e["kind"] == "key"} <= set(HumanKey)
        seen = screen.result(timeout=120)
        assert seen.status_code == 200 and seen.content.startswith(b"\x89PNG")
        refused_input = typed.result(timeout=120)
        assert refused_input.status_code == 409 and refused_input.json()["error"]["code"] == "taken_over"
    finally:
        pool.shutdown(wait=False, cancel_futures=True)

    screens = stack.gate_dir / f"{aid}.screens"
    # The looker was held mid-look: no screen of its own was answered while held (one in flight at the take
    # may land just after it), and it looks again after the hand-back.
    assert len([1 for _, got in lines(screens) if taken_at + 1 < got < handed_at]) == 0, lines(screens)
    await_for(lambda: any(asked > handed_at for asked, _ in lines(screens)), what="the looker looking again")
    (stack.gate_dir / f"{aid}.done").write_text("1")

    done = stack.sdk().test_runs.wait(run_id, timeout=600, poll_interval=1)
    assert done["status"] == "completed", done
    final = attempt(stack, aid)
    assert final["outcome"] == "passed" and final["assisted"] is True, final
    assert final["task_end"]["reason"] == "finished"  # not its time limit: the hold was not its time
    assert final["metrics"]["held_seconds"] > 70 and final["takeover"] is None and final["live_url"] is None
    assert [t["ended_by"] for t in final["takeovers"]] == ["handed_back"]
    # No member reads a keysym of what the person typed: not in the attempt, not in its replay's page.
    replay = httpx.get(final["replay_url"], timeout=60)
    assert replay.status_code == 200 and "handed_back" in replay.text
    for shown in (json.dumps(final), replay.text):
        for sym in (EURO, ZHE, KP_4, KP_2):
            assert f"0x{sym:04x}" not in shown.lower() and f'"{sym}"' not in shown, hex(sym)
    # The replay marks the span: a frame where the person took the machine, and one where they gave it back.
    assert replay_marks(stack, aid) == [("takeover", {"human": "takeover"}), ("handback", {"human": "handback"})]
    again = api(stack, "POST", f"/v1/attempts/{aid}/takeover")
    assert again.status_code == 409, again.text
    assert again.json()["error"]["code"] == "not_running" and again.json()["error"]["outcome"] == "passed"
    assert api(stack, "POST", f"/v1/attempts/{aid}/handback").json()["error"]["code"] == "not_held"


def test_a_holder_who_leaves_is_ended_idle_and_the_agent_goes_on(stack: Stack, looking: Any) -> None:
    """The browser closes mid-takeover: after the idle period the machine goes back to the agent."""
    desk = stack.state.gateway.takeovers
    desk.idle_s = 8.0
    try:
        aid, run_id = looking(minutes=5, test="true")
        took = api(stack, "POST", f"/v1/attempts/{aid}/takeover")
        assert took.status_code == 200 and took.json()["idle_seconds"] == 8.0, took.text
        with Viewer(ws_url(stack, took.json()["view"]["url"])) as v:
            v.handshake()
        ended = await_for(lambda: attempt(stack, aid)["takeovers"][0]["ended_by"], what="the hold's idle end",
                          timeout=120)
        assert ended == "idle"
        since = time.time()
        screens = stack.gate_dir / f"{aid}.screens"
        await_for(lambda: any(got > since for _, got in lines(screens)), what="the looker looking again")
        assert api(stack, "POST", f"/v1/attempts/{aid}/handback").json()["error"]["code"] == "not_held"
    finally:
        desk.idle_s = stack.state.settings.takeover_idle_seconds
    (stack.gate_dir / f"{aid}.done").write_text("1")
    stack.sdk().test_runs.wait(run_id, timeout=600, poll_interval=1)
    final = attempt(stack, aid)
    assert final["outcome"] == "passed" and final["assisted"] is True


def test_a_short_live_abuse_campaign_leaves_the_others_watching_and_the_admin_taking_over(
        stack: Stack, looking: Any) -> None:
    """bench/live_abuse.py's campaign, short, on one machine: a member's key sends a 2 MiB message of
    KeyEvents on its watcher's view (deflated as a browser offers it), then takes every watcher's seat it
    can. Its flood ends only its own view; it seats MAX_WATCHES_PER_KEY_MACHINE watchers of the machine
    (before: as many as the runner's 10 watcher seats), so another member still watches; and the admin's
    takeover view gets the screen, and hands back."""
    from gh_server.live.screen_relay import MAX_WATCHES_PER_KEY_MACHINE

    aid, _ = looking(minutes=5, test="true")
    attacker, _ = new_key(stack, "member")
    victim, _ = new_key(stack, "member")

    def watch(key: str) -> Viewer:
        r = api(stack, "POST", f"/v1/attempts/{aid}/view", key)
        assert r.status_code == 200, r.text
        return Viewer(ws_url(stack, r.json()["url"]), deflate=True)

    with watch(attacker) as flood:
        flood.handshake()
        with contextlib.suppress(ConnectionClosed):  # the server may close it mid-send
            flood.send(struct.pack(">BBxxI", 4, 1, 0x61) * (2 * 1024 * 1024 // 8))
        ended = flood.close_reason(timeout=60)
        # The transport's bound (1009) or the view's share (viewer_too_fast).
        assert ended.code == 1009 or ended.reason == "viewer_too_fast", ended
    assert api(stack, "GET", "/v1/runners").status_code == 200
    seated: list[Viewer] = []
    try:
        while True:  # past its share the key is refused at the ticket, before any socket
            r = api(stack, "POST", f"/v1/attempts/{aid}/view", attacker)
            if r.status_code == 429:
                assert r.json()["error"]["code"] == "too_many_views", r.text
                break
            assert r.status_code == 200 and len(seated) < MAX_WATCHES_PER_KEY_MACHINE, r.text
            v = Viewer(ws_url(stack, r.json()["url"]))
            seated.append(v)
            v.handshake()
        assert len(seated) == MAX_WATCHES_PER_KEY_MACHINE
        with watch(victim) as v:
            v.handshake()
            v.update(incremental=False)
            assert v.updates == 1 and any(v.fb)
        took = api(stack, "POST", f"/v1/attempts/{aid}/takeover")
        assert took.status_code == 200, took.text
        with Viewer(ws_url(stack, took.json()["view"]["url"])) as holder:
            holder.handshake()
            holder.update(incremental=False)
            assert holder.updates == 1
        assert api(stack, "POST", f"/v1/attempts/{aid}/handback").status_code == 200
    finally:
        for v in seated:
            v.close()
    (stack.gate_dir / f"{aid}.done").write_text("1")
