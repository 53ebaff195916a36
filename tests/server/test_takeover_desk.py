"""The takeover desk (gh_server/takeover/desk.py) with a fake clock, a fake runner link and a real SQLite
database: two takes at once, the cap, the idle end, an attempt not in its task, the agents' gate
(gh_server/agents/base.py Machine), and the human steps read from RFB input (gh_server/live/human_steps.py).
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pydantic
import pytest
from kit.poll import until
from sqlalchemy import create_engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from gh_runner.live_views import DRIVER_SEATS, MAX_VIEWS_PER_MACHINE
from gh_server import replays
from gh_server.agents import grants
from gh_server.agents.base import TAKEN_OVER, Machine, MachineError
from gh_server.dbqueue import DbQueue
from gh_server.live.human_steps import MAX_EVENTS, HumanSteps
from gh_server.live.rfb import Kind, Message
from gh_server.live.screen_relay import MAX_WATCHES_PER_KEY_MACHINE, LiveRelay, _Pending
from gh_server.models import ApiKey, Attempt, Base, MachineGrant
from gh_server.takeover.desk import Refused, TakeoverDesk
from gh_wire import protocol
from gh_wire.vocab import HumanKey, TakeoverEnd, ViewEndReason

CAP_S, IDLE_S = 600.0, 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Link:
    """The gateway as the desk sees it: what it was sent, and the agent's clock."""

    def __init__(self, db: sessionmaker[Session], dbq: DbQueue) -> None:
        self.db = db
        self.dbq = dbq
        self.sent: list[pydantic.BaseModel] = []
        self.clock_held: dict[str, bool] = {}
        self.connected = True
        self.session = "s_1"  # the runner's connection here
        self.elsewhere = False  # a shared database, the runner in another process

    async def send(self, runner_id: str, msg: pydantic.BaseModel) -> bool:
        self.sent.append(msg)
        return self.connected

    def hold_session(self, runner_id: str) -> str | None:
        return self.session if self.connected else None

    def holds_elsewhere(self, runner_id: str) -> bool:
        return self.elsewhere

    def task_held(self, attempt_id: str, held: bool) -> None:
        self.clock_held[attempt_id] = held


@pytest.fixture()
async def desk() -> AsyncIterator[tuple[TakeoverDesk, Link, Clock]]:
    engine = create_engine("sqlite://", connect_args={"check_same_thread": False}, poolclass=StaticPool)
    Base.metadata.create_all(engine)
    db = sessionmaker(engine, expire_on_commit=False)
    with db.begin() as s:
        for aid, status, outcome in (("at_run", "running", None), ("at_done", "done", "passed")):
            s.add(Attempt(id=aid, test_run_id="tr_1", run_case_id=1, test_case_id="tc_1", agent_id="cmd",
                          try_number=1, status=status, outcome=outcome, runner_id="rn_1"))
    dbq = DbQueue(db)
    await dbq.start()
    link, clock = Link(db, dbq), Clock()
    d = TakeoverDesk(link, CAP_S, IDLE_S, clock=clock)
    try:
        yield d, link, clock
    finally:
        await d.close()
        await dbq.stop()
        engine.dispose()


def row(link: Link, aid: str = "at_run") -> Attempt:
    with link.db() as s:
        a = s.get(Attempt, aid)
        assert a is not None
        return a


async def test_two_takes_at_once_one_holds_the_other_is_told_who(desk: Any) -> None:
    d, link, _ = desk
    got = await asyncio.gather(d.take("at_run", "k_a", "alice"), d.take("at_run", "k_b", "bob"),
                               return_exceptions=True)
    held = [g for g in got if not isinstance(g, BaseException)]
    refused = [g for g in got if isinstance(g, Refused)]
    assert len(held) == 1 and len(refused) == 1
    assert refused[0].code == "held" and refused[0].extra["held_by"] == held[0].key_name
    assert link.sent == [protocol.TaskHold(attempt_id="at_run", held=True)] and link.clock_held["at_run"] is True
    a = row(link)
    assert a.assisted is True and a.takeovers[0]["by"] == held[0].key_name and a.takeovers[0]["ended_at"] is None
    again = await d.take("at_run", held[0].key_id, held[0].key_name)  # the holder reloads: its hold
    assert again is held[0]


async def test_a_hold_ends_at_its_cap_and_on_idle_whichever_comes_first(desk: Any) -> None:
    d, link, clock = desk
    hold = await d.take("at_run", "k_a", "alice")
    clock.now += IDLE_S - 1
    d.human_input(hold, Message(Kind.KEY, struct.pack(">BBxxI", 4, 1, 0xFF0D), key_down=True))
    clock.now += IDLE_S - 1  # input moved the idle clock: not idle yet
    await d.expire_due()
    assert d.held("at_run")
    clock.now += 2
    await d.expire_due()
    assert not d.held("at_run") and hold.ended_by is TakeoverEnd.IDLE
    assert link.sent[-1] == protocol.TaskHold(attempt_id="at_run", held=False) and link.clock_held["at_run"] is False
    entry = row(link).takeovers[0]
    assert entry["ended_by"] == "idle" and entry["held_seconds"] == pytest.approx(2 * IDLE_S)
    assert entry["counts"] == {"keys": 1, "clicks": 0, "typed": 0}

    capped = await d.take("at_run", "k_a", "alice")
    for _ in range(int(CAP_S // (IDLE_S / 2))):  # busy all along: only the cap ends it
        clock.now += IDLE_S / 2
        d.human_input(capped, Message(Kind.POINTER, struct.pack(">BBHH", 5, 0, 1, 1)))
        await d.expire_due()
    assert capped.ended_by is TakeoverEnd.CAP and [t["ended_by"] for t in row(link).takeovers] == ["idle", "cap"]


async def test_the_agents_grant_outlives_its_time_by_the_time_held(desk: Any) -> None:
    d, link, clock = desk
    expires = datetime(2030, 1, 1, tzinfo=UTC)
    with link.db.begin() as s:
        grants.add(s, "tok", "at_run", "rn_1", None, expires)

    def expiry() -> datetime:
        with link.db() as s:
            g = s.get(MachineGrant, "tok")
            assert g is not None
            return g.expires_at

    await d.take("at_run", "k_a", "alice")
    assert expiry() == expires + timedelta(seconds=CAP_S)  # a hold may last its whole cap
    clock.now += 42
    await d.hand_back("at_run")
    assert expiry() == expires + timedelta(seconds=42)  # what was held, no more


async def test_an_attempt_not_in_its_task_is_refused_with_its_outcome(desk: Any) -> None:
    d, link, _ = desk
    with pytest.raises(Refused) as e:
        await d.take("at_done", "k_a", "alice")
    assert e.value.code == "not_running" and e.value.extra == {"status": "done", "outcome": "passed"}
    link.connected = False
    with pytest.raises(Refused) as gone:
        await d.take("at_run", "k_a", "alice")
    assert gone.value.code == "not_connected" and not d.held("at_run") and row(link).assisted is False
    with pytest.raises(Refused) as nobody:
        await d.hand_back("at_run")
    assert nobody.value.code == "not_held"


async def test_the_agents_requests_wait_then_a_screen_is_fresh_and_an_action_is_taken_over(desk: Any) -> None:
    d, _, _ = desk
    relayed: list[str] = []

    async def relay(runner_id: str, req: protocol.MachineRequest, timeout: float) -> protocol.MachineResponse:
        relayed.append(req.op)
        return protocol.MachineResponse(request_id=req.request_id, ok=True, png_b64="iVBORw0KGgo=")

    m = Machine(relay, "rn_1", "at_run", gate=d)
    await m.input([])
    assert relayed == ["input"]  # nobody holds it: straight through
    await d.take("at_run", "k_a", "alice")
    screen = asyncio.ensure_future(m.screen())
    action = asyncio.ensure_future(m.input([]))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not screen.done() and not action.done() and relayed == ["input"]
    entry = await d.hand_back("at_run")
    assert entry["ended_by"] == "handed_back"
    assert await screen == b"\x89PNG\r\n\x1a\n" and relayed == ["input", "screen"]
    with pytest.raises(MachineError) as refused:
        await action
    assert refused.value.refusal == protocol.MachineRefusal.TAKEN_OVER and str(refused.value) == TAKEN_OVER


async def test_the_attempt_leaving_its_task_ends_the_hold(desk: Any) -> None:
    d, link, _ = desk
    hold = await d.take("at_run", "k_a", "alice")
    d.runner_gone("rn_1", "s_1")
    await asyncio.wait_for(hold.ended.wait(), 10)
    await d.close()  # the end's record is written
    assert row(link).takeovers[0]["ended_by"] == "attempt_ended" and row(link).assisted is True


def key(sym: int, down: bool = True) -> Message:
    return Message(Kind.KEY, struct.pack(">BBxxI", 4, int(down), sym), key_down=down)


def test_human_steps_count_typing_and_name_keys_chords_and_clicks() -> None:
    steps = HumanSteps()
    at = datetime(2026, 1, 1, tzinfo=UTC)
    for ch in "ls -l":
        steps.add(key(ord(ch)), at)
        steps.add(key(ord(ch), down=False), at)
    steps.add(key(0xFFE1), at)  # shift
    steps.add(key(ord("A")), at)  # a capital: typed
    steps.add(key(0xFFE1, down=False), at)
    steps.add(key(0xFF0D), at)
    for sym in (0xFFE3, 0xFFE9, ord("t")):  # ctrl+alt+t
        steps.add(key(sym), at)
    for sym in (ord("t"), 0xFFE9, 0xFFE3):
        steps.add(key(sym, down=False), at)
    steps.add(Message(Kind.POINTER, struct.pack(">BBHH", 5, 4, 30, 40)), at)  # right button down
    steps.add(Message(Kind.POINTER, struct.pack(">BBHH", 5, 0, 30, 40)), at)
    steps.add(Message(Kind.POINTER, struct.pack(">BBHH", 5, 8, 30, 40)), at)  # the wheel: no click
    assert steps.as_counts() == {"keys": 2, "clicks": 1, "typed": 6}
    assert [{k: v for k, v in e.items() if k != "at"} for e in steps.events] == [
        {"kind": "typed", "count": 6}, {"kind": "key", "keys": "Return"}, {"kind": "key", "keys": "ctrl+alt+t"},
        {"kind": "click", "x": 30, "y": 40, "button": "right"}]
    assert "ls" not in str(steps.events)
    for _ in range(MAX_EVENTS + 5):
        steps.add(key(0xFF09), at)
    assert len(steps.events) == MAX_EVENTS and steps.keys == 2 + MAX_EVENTS + 5
    assert steps.dropped == 4 + 5  # 4 kept before: 200 - 4 Tabs fit


def test_a_pasted_text_is_counted_as_typed_characters_and_never_kept() -> None:
    """The holder's paste (RFB ClientCutText, noVNC's clipboard box) types its characters into the machine:
    counted as typed and one `paste` event with how many, the text in neither (before: not counted at all)."""
    steps = HumanSteps()
    at = datetime(2026, 1, 1, tzinfo=UTC)
    text = "correct horse battery staple".encode("latin-1")
    steps.add(key(ord("x")), at)
    steps.add(Message(Kind.CUT_TEXT, struct.pack(">BxxxI", 6, len(text)) + text), at)
    steps.add(Message(Kind.CUT_TEXT, struct.pack(">BxxxI", 6, 0)), at)  # an empty clipboard: a paste of none
    assert steps.as_counts() == {"keys": 0, "clicks": 0, "typed": 1 + len(text)}
    assert [{k: v for k, v in e.items() if k != "at"} for e in steps.events] == [
        {"kind": "typed", "count": 1}, {"kind": "paste", "count": len(text)}, {"kind": "paste", "count": 0}]
    assert "horse" not in json.dumps(steps.events)
    entry = {"by": "alice", "counts": steps.as_counts(), "events": steps.events}
    (shown,) = replays._takeovers(None, [entry])  # the replay shows the paste, with its count only
    assert [(e["kind"], e["count"]) for e in shown["events"]] == [("typed", 1), ("paste", len(text)), ("paste", 0)]


def test_every_key_that_types_is_counted_and_only_listed_keys_are_named() -> None:
    """What a person's browser (noVNC) sends for keys outside ASCII: the euro sign, a Cyrillic letter, the
    keypad's digits and arrows, a Unicode keysym, a dead key's accent. Each is counted as typed; a chord
    names only a letter, a digit or a listed key; no keysym is stored in any form."""
    steps = HumanSteps()
    at = datetime(2026, 1, 1, tzinfo=UTC)
    secret = (0x20AC, 0x06D6, 0xFFB4, 0xFFB2, 0xFF96, 0x1000416, 0xFE51, ord("e"), 0x13BD, 0x07E1)
    for sym in secret:  # the euro sign, Cyrillic zhe, KP_4, KP_2, KP_Left, U+0416, dead_acute + e, OE, Greek
        steps.add(key(sym), at)
        steps.add(key(sym, down=False), at)
    steps.add(Message(Kind.QEMU_KEY, struct.pack(">BBHII", 255, 0, 1, 0xFFB7, 0x47), key_down=True), at)  # KP_7
    steps.add(key(0xFFE3), at)  # ctrl held: a Cyrillic letter, a keypad digit and a euro sign are chords of `other`
    for sym in (0x06C3, 0xFFB1, 0x20AC, ord("C"), 0xFF51):
        steps.add(key(sym), at)
        steps.add(key(sym, down=False), at)
    steps.add(key(0xFFE3, down=False), at)
    for sym in (0x1008FF12, 0xFFCA, 0xFF0D):  # a media key, F13: keys that type nothing and are not listed
        steps.add(key(sym), at)
    assert steps.as_counts() == {"keys": 8, "clicks": 0, "typed": len(secret) + 1}
    assert [{k: v for k, v in e.items() if k != "at"} for e in steps.events] == [
        {"kind": "typed", "count": len(secret) + 1},
        *({"kind": "key", "keys": k} for k in ("ctrl+other", "ctrl+other", "ctrl+other", "ctrl+c", "ctrl+Left",
                                              "other", "other", "Return"))]
    shown = json.dumps(steps.events)
    for sym in (*secret, 0xFFB7, 0x06C3, 0xFFB1, 0x1008FF12, 0xFFCA):
        assert f"{sym:x}" not in shown.lower() and str(sym) not in shown, hex(sym)
    assert not {"€", "ж", "Ж", "4", "2", "7", "1"} & set("".join(e.get("keys", "") for e in steps.events))
    assert {e["keys"].split("+")[-1] for e in steps.events if e["kind"] == "key"} <= {*HumanKey, "c"}


async def test_a_hold_ends_with_the_runners_connection_it_was_taken_on_not_an_older_one(desk: Any) -> None:
    d, link, _ = desk
    link.session = "s_2"  # the runner reconnected; its old connection's close has not been handled yet
    hold = await d.take("at_run", "k_a", "alice")
    d.runner_gone("rn_1", "s_1")  # now it is
    await asyncio.sleep(0)
    assert d.held("at_run") and hold.ended_by is None
    d.runner_gone("rn_1", "s_2")  # the connection it was taken on
    await asyncio.wait_for(hold.ended.wait(), 10)
    assert hold.ended_by is TakeoverEnd.ATTEMPT_ENDED


@pytest.fixture()
async def elsewhere(desk: Any) -> AsyncIterator[tuple[TakeoverDesk, TakeoverDesk, Link]]:
    """Two processes on one database: `there` holds the runner (the desk fixture's), `here` does not."""
    there, link_there, _ = desk
    link_here = Link(link_there.db, link_there.dbq)
    link_here.connected, link_here.elsewhere = False, True
    here = TakeoverDesk(link_here, CAP_S, IDLE_S)
    try:
        yield there, here, link_here
    finally:
        await here.close()


def png_relay(relayed: list[str]) -> Any:
    async def relay(runner_id: str, req: protocol.MachineRequest, timeout: float) -> protocol.MachineResponse:
        relayed.append(req.op)
        return protocol.MachineResponse(request_id=req.request_id, ok=True, png_b64="iVBORw0KGgo=")
    return relay


async def test_requests_here_wait_on_a_hold_in_the_process_holding_the_runner(elsewhere: Any) -> None:
    there, here, link_here = elsewhere
    relayed: list[str] = []
    m = Machine(png_relay(relayed), "rn_1", "at_run", gate=here)
    # A process that died mid-hold left its entry open: past its cap, it is no hold.
    with link_here.db.begin() as s:
        a = s.get(Attempt, "at_run")
        assert a is not None
        a.takeovers = [{"by": "carol", "by_key_id": "k_c", "ended_at": None,
                        "started_at": (datetime.now(UTC) - timedelta(seconds=CAP_S + 1)).isoformat()}]
    await m.input([])
    assert relayed == ["input"] and not here.waiting
    relayed.clear()
    await there.take("at_run", "k_a", "alice")
    screen = asyncio.ensure_future(m.screen())
    action = asyncio.ensure_future(m.exec("true"))
    await until(lambda: here.waiting["at_run"] == 2, 10, "the two requests held here", every=0.01)
    assert relayed == [] and link_here.clock_held["at_run"] is True  # an agent here: its clock stops too
    with pytest.raises(Refused) as not_here:
        await here.hand_back("at_run")
    assert not_here.value.code == "not_connected"  # handed back where it is held, not "nobody holds it"
    await there.hand_back("at_run")
    assert await asyncio.wait_for(screen, 10) == b"\x89PNG\r\n\x1a\n" and relayed == ["screen"]
    with pytest.raises(MachineError) as refused:
        await action
    assert refused.value.refusal == protocol.MachineRefusal.TAKEN_OVER and relayed == ["screen"]
    assert link_here.clock_held["at_run"] is False and not here.waiting


async def test_a_request_turned_back_by_the_holding_process_waits_here_then_goes_on(elsewhere: Any) -> None:
    """It crossed as the hold began (its gate here saw none): the holding process turns it back, as
    gh_server/gateway.py answer_relayed does, and it waits here like the others."""
    there, here, _ = elsewhere
    relayed: list[str] = []
    taken: list[bool] = []

    async def relay(runner_id: str, req: protocol.MachineRequest, timeout: float) -> protocol.MachineResponse:
        if not taken:
            taken.append(True)
            await there.take("at_run", "k_a", "alice")
        if there.holding("at_run"):
            return protocol.MachineResponse(request_id=req.request_id, ok=False,
                                            refusal=protocol.MachineRefusal.TAKEN_OVER, error="held")
        relayed.append(req.op)
        return protocol.MachineResponse(request_id=req.request_id, ok=True, png_b64="iVBORw0KGgo=")

    m = Machine(relay, "rn_1", "at_run", gate=here)
    screen = asyncio.ensure_future(m.screen())
    await until(lambda: here.waiting["at_run"] == 1, 10, "the screen turned back and held here", every=0.01)
    action = asyncio.ensure_future(m.input([]))
    await until(lambda: here.waiting["at_run"] == 2, 10, "the input held too", every=0.01)
    await there.hand_back("at_run")
    assert await asyncio.wait_for(screen, 10) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(MachineError) as refused:
        await action
    assert refused.value.refusal == protocol.MachineRefusal.TAKEN_OVER and relayed == ["screen"]


async def test_a_takeover_whose_view_fails_leaves_no_hold(desk: Any) -> None:
    """The holder's view refused (`too_many_views`, no screen...) before any input: the hold is undone, so
    the attempt is not left assisted with its agent paused and no screen for anyone. An earlier takeover's
    entry stays, and a hold whose holder drove already is not undone by a reload's failed view."""
    d, link, clock = desk
    first = await d.take("at_run", "k_a", "alice")
    d.human_input(first, Message(Kind.KEY, struct.pack(">BBxxI", 4, 1, 0xFF0D), key_down=True))
    assert not await d.view_failed(first, ViewEndReason.TOO_MANY_VIEWS)  # it drove: a reload's failure
    assert d.held("at_run")
    await d.hand_back("at_run")
    clock.now += 5
    hold = await d.take("at_run", "k_b", "bob")
    assert len(row(link).takeovers) == 2
    assert await d.view_failed(hold, ViewEndReason.TOO_MANY_VIEWS)
    assert not d.held("at_run") and hold.ended.is_set()
    assert link.sent[-1] == protocol.TaskHold(attempt_id="at_run", held=False) and link.clock_held["at_run"] is False
    a = row(link)
    assert [t["by"] for t in a.takeovers] == ["alice"] and a.assisted is True

    with link.db.begin() as s:  # an attempt never taken over before
        s.add(Attempt(id="at_two", test_run_id="tr_1", run_case_id=2, test_case_id="tc_1", agent_id="cmd",
                      try_number=1, status="running", runner_id="rn_1"))
    only = await d.take("at_two", "k_b", "bob")
    assert row(link, "at_two").assisted is True
    assert await d.view_failed(only, ViewEndReason.NO_SCREEN)
    a = row(link, "at_two")
    assert a.assisted is False and not a.takeovers


class _Gateway:
    """The runner as the live relay sees it: it takes views, and refuses each `view_open` with `reason`."""

    def __init__(self, relay: Any, reason: ViewEndReason) -> None:
        self.relay, self.reason = relay, reason

    def takes_views(self, runner_id: str) -> bool:
        return True

    async def send(self, runner_id: str, msg: pydantic.BaseModel) -> bool:
        if isinstance(msg, protocol.ViewOpen):
            refusal = protocol.ViewRefused(view_id=msg.view_id, reason=self.reason, message="full")
            asyncio.get_running_loop().call_soon(self.relay.refused, runner_id, refusal)
        return True


class _Socket:
    """The holder's browser: it opens the view's WebSocket and is told how it closed."""

    headers: dict[str, str] = {}
    scope: dict[str, Any] = {"subprotocols": ["binary"]}

    def __init__(self) -> None:
        self.closed: tuple[int, str] | None = None

    async def accept(self, subprotocol: str | None = None) -> None:
        pass

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)


async def test_the_holders_view_refused_by_the_runner_undoes_the_hold_through_the_relay(desk: Any) -> None:
    """The chain the issue tried: the takeover's view closed at once with `too_many_views`; the relay hands
    that to the desk, and the hold is gone (before: the attempt stayed assisted and its agent paused)."""
    d, link, _ = desk
    with link.db.begin() as s:
        s.add(ApiKey(id="k_a", name="alice", role="admin", key_hash="0" * 64, prefix="gh_"))
    st = SimpleNamespace(db=link.db, gateway=None)
    relay = LiveRelay(st, takeovers=d)  # type: ignore[arg-type]
    st.gateway = _Gateway(relay, ViewEndReason.TOO_MANY_VIEWS)
    ticket = relay.tickets.issue(key_id="k_a", key_name="alice", read_only=False, attempt_id="at_run")
    await d.take("at_run", "k_a", "alice")
    ws = _Socket()
    async with asyncio.timeout(30):
        await relay.viewer_endpoint(ws, ticket.value)  # type: ignore[arg-type]
    assert ws.closed == (protocol.CLOSE_VIEW_ENDED, ViewEndReason.TOO_MANY_VIEWS)
    assert not d.held("at_run")
    a = row(link)
    assert a.assisted is False and not a.takeovers
    assert link.sent[-1] == protocol.TaskHold(attempt_id="at_run", held=False)


def _members_relay(desk: Any) -> tuple[Any, LiveRelay]:
    """A live relay on the desk's database with two member keys, k_a and k_b, and no gateway yet."""
    d, link, _ = desk
    with link.db.begin() as s:
        for kid in ("k_a", "k_b"):
            s.add(ApiKey(id=kid, name=kid, role="member", key_hash=kid * 32, prefix="gh_"))
    st = SimpleNamespace(db=link.db, gateway=None)
    return st, LiveRelay(st, takeovers=d)  # type: ignore[arg-type]


async def test_one_key_cannot_take_every_watcher_seat_of_a_machine(desk: Any) -> None:
    """A member's key with its share of watchers' views of one machine open gets `too_many_views` for
    another of that machine (before: 16 per key, more than the runner's 10 watcher seats of a machine);
    another key's watcher of that machine, and this key's of another machine, are not refused here."""
    st, relay = _members_relay(desk)
    st.gateway = _Gateway(relay, ViewEndReason.NO_SCREEN)  # a view that reaches the runner ends so here
    loop = asyncio.get_running_loop()
    for n in range(MAX_WATCHES_PER_KEY_MACHINE):  # k_a's watchers of at_run, open
        relay._pending[f"v{n}"] = _Pending("k_a", loop.create_future(), attempt_id="at_run", watching=True,
                                           machine="at_run")
        relay._by_key.setdefault("k_a", set()).add(f"v{n}")
    assert MAX_WATCHES_PER_KEY_MACHINE * 2 <= MAX_VIEWS_PER_MACHINE - DRIVER_SEATS  # no key takes half

    async def watch(key_id: str, attempt_id: str) -> tuple[int, str] | None:
        ticket = relay.tickets.issue(key_id=key_id, key_name=key_id, read_only=True, attempt_id=attempt_id)
        ws = _Socket()
        async with asyncio.timeout(30):
            await relay.viewer_endpoint(ws, ticket.value)  # type: ignore[arg-type]
        return ws.closed

    assert await watch("k_a", "at_run") == (protocol.CLOSE_VIEW_ENDED, ViewEndReason.TOO_MANY_VIEWS)
    assert await watch("k_b", "at_run") == (protocol.CLOSE_VIEW_ENDED, ViewEndReason.NO_SCREEN)
    assert await watch("k_a", "at_done") == (protocol.CLOSE_VIEW_ENDED, ViewEndReason.NO_MACHINE)


class _SlowRunner:
    """A runner that takes views and answers each `view_open` only when the test says (`refuse`)."""

    def __init__(self, relay: Any) -> None:
        self.relay = relay
        self.opened: list[protocol.ViewOpen] = []
        self.sent = asyncio.Event()

    def takes_views(self, runner_id: str) -> bool:
        return True

    async def send(self, runner_id: str, msg: pydantic.BaseModel) -> bool:
        if isinstance(msg, protocol.ViewOpen):
            self.opened.append(msg)
            self.sent.set()
        return True

    def refuse(self, msg: protocol.ViewOpen) -> None:
        self.relay.refused("rn_1", protocol.ViewRefused(view_id=msg.view_id, reason=ViewEndReason.NO_SCREEN,
                                                        message="none"))

    async def until_opened(self, n: int) -> None:
        async with asyncio.timeout(30):
            while len(self.opened) < n:
                self.sent.clear()
                await self.sent.wait()


async def test_one_keys_views_open_one_after_another(desk: Any) -> None:
    """Issue 49: a key's burst of views costs the server one view's opening at a time (bench/live_abuse.py,
    unread_open). While one view of k_a waits for the runner, k_a's next is not sent to the runner; k_b's is."""
    st, relay = _members_relay(desk)
    runner = _SlowRunner(relay)
    st.gateway = runner

    async def watch(key_id: str) -> tuple[int, str] | None:
        ticket = relay.tickets.issue(key_id=key_id, key_name=key_id, read_only=True, attempt_id="at_run")
        ws = _Socket()
        await relay.viewer_endpoint(ws, ticket.value)  # type: ignore[arg-type]
        return ws.closed

    first = asyncio.create_task(watch("k_a"))
    await runner.until_opened(1)
    second = asyncio.create_task(watch("k_a"))
    other = asyncio.create_task(watch("k_b"))
    await runner.until_opened(2)
    for _ in range(20):  # k_a's second view has had every chance to reach the runner
        await asyncio.sleep(0)
    assert len(runner.opened) == 2 and not second.done()
    runner.refuse(runner.opened[0])
    await runner.until_opened(3)
    for msg in runner.opened[1:]:
        runner.refuse(msg)
    async with asyncio.timeout(30):
        ended = await asyncio.gather(first, second, other)
    assert ended == [(protocol.CLOSE_VIEW_ENDED, ViewEndReason.NO_SCREEN)] * 3
    assert relay._opening == {}
