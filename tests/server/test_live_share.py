"""No viewer costs the server more than its share (gh_server/live/screen_relay.py, budget.py, rfb.py): what a view
sends is counted before it is parsed, a watcher's display work is paced whatever its kind, and a silent
watcher ends. The relay's pipe runs here between in-memory sockets, as in tests/server/test_live_pacing.py;
the transport's part (no deflate, a small message bound) is tests/server/test_live_sockets.py."""

from __future__ import annotations

import asyncio
import itertools
import struct
import time
from datetime import UTC, datetime
from typing import Any, cast

from gh_server.live import screen_relay as relay_module
from gh_server.live.inputs import InputCount
from gh_server.live.screen_relay import WATCH_UPDATE_GAP_S, LiveRelay, _Pending
from gh_server.live.tickets import Ticket
from gh_wire.vocab import ViewEndReason

HANDSHAKE = b"RFB 003.008\n" + b"\x01" + b"\x01"
KEY_DOWN_A = struct.pack(">BBxxI", 4, 1, 0x61)


def set_encodings(*encodings: int) -> bytes:
    return struct.pack(">BxH", 2, len(encodings)) + b"".join(struct.pack(">i", e) for e in encodings)


class Viewer:
    """The browser's end: the messages it was given, then silence (or a close, when `then_close`)."""

    def __init__(self, messages: list[bytes]) -> None:
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        for m in messages:
            self.inbox.put_nowait({"type": "websocket.receive", "bytes": m})
        self.taken = 0

    async def receive(self) -> dict[str, Any]:
        m = await self.inbox.get()
        self.taken += 1
        return m

    async def send_bytes(self, data: bytes) -> None:
        pass


class Runner:
    """The runner's end: when each chunk arrived, and how many bytes in all."""

    def __init__(self) -> None:
        self.got: list[tuple[float, bytes]] = []
        self.changed = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await asyncio.Event().wait()
        raise AssertionError

    async def send_bytes(self, data: bytes) -> None:
        self.got.append((time.monotonic(), data))
        self.changed.set()

    @property
    def size(self) -> int:
        return sum(len(d) for _, d in self.got)


def view(*, watcher: bool) -> tuple[Ticket, _Pending]:
    """A watcher's view of an attempt, or (not `watcher`) an admin's of an open start state."""
    ticket = Ticket(value="lv_x", key_id="k", key_name="k", read_only=watcher, expires_at=datetime.now(UTC),
                    deadline=0.0, attempt_id="at_1" if watcher else None, start_state_id=None if watcher else "ss_1")
    pending = _Pending(key_id="k", arrived=asyncio.get_running_loop().create_future(), attempt_id=ticket.attempt_id)
    return ticket, pending


def start(viewer: Viewer, runner: Runner, ticket: Ticket, pending: _Pending) -> asyncio.Task[ViewEndReason]:
    relay = LiveRelay(cast(Any, None))
    relay._touch = _no_touch  # type: ignore[method-assign]  # a start state's idle clock: no database here
    return asyncio.create_task(relay._pipe(cast(Any, viewer), cast(Any, runner), ticket, pending,
                                           InputCount(key_id="k", key_name="k")))


async def _no_touch(start_state_id: str) -> None:
    pass


async def test_a_read_only_views_2_mib_of_key_events_ends_it_before_a_message_is_parsed() -> None:
    """The issue's attack: 262,144 KeyEvents in one WebSocket message (3 KB deflated) cost 0.83 s of the
    loop. Now the message is over the view's bound and ends it, and nothing of it reaches the runner."""
    ticket, pending = view(watcher=True)
    runner = Runner()
    piped = start(Viewer([HANDSHAKE, KEY_DOWN_A * (2 * 1024 * 1024 // 8)]), runner, ticket, pending)
    async with asyncio.timeout(10):
        assert await piped == ViewEndReason.VIEWER_TOO_FAST
    assert runner.size <= len(HANDSHAKE)


async def test_a_watcher_past_its_share_of_small_messages_is_dropped() -> None:
    """Each message within the transport's bound, but more of them than a watcher's share a second."""
    ticket, pending = view(watcher=True)
    viewer = Viewer([HANDSHAKE] + [KEY_DOWN_A * 1024] * 400)
    piped = start(viewer, Runner(), ticket, pending)
    async with asyncio.timeout(10):
        assert await piped == ViewEndReason.VIEWER_TOO_FAST
    assert viewer.taken < 400


async def test_a_drivers_clipboard_paste_in_novncs_10_kib_messages_goes_through() -> None:
    """The share leaves a person room: a 1 MiB ClientCutText as noVNC sends it (core/websock.js, 10 KiB
    messages) all reaches the runner."""
    text = b"x" * (1024 * 1024)
    cut = struct.pack(">BxxxI", 6, len(text)) + text
    ticket, pending = view(watcher=False)
    runner = Runner()
    piped = start(Viewer([HANDSHAKE] + [cut[i:i + 10 * 1024] for i in range(0, len(cut), 10 * 1024)]),
                  runner, ticket, pending)
    async with asyncio.timeout(30):
        while runner.size < len(HANDSHAKE) + len(cut):
            runner.changed.clear()
            assert not piped.done(), piped.result()
            await runner.changed.wait()
    pending.end(ViewEndReason.CLOSED)
    assert await piped == ViewEndReason.CLOSED


async def test_a_watchers_set_encodings_flood_is_paced_like_its_update_requests() -> None:
    """SetEncodings (and SetPixelFormat) make QEMU send the display again: a watcher's reach the runner
    WATCH_UPDATE_GAP_S apart, as its update requests do (they bypassed the pacing before)."""
    ticket, pending = view(watcher=True)
    runner = Runner()
    flood = [set_encodings(16, 0, -223 - n) for n in range(6)]
    piped = start(Viewer([HANDSHAKE, *flood]), runner, ticket, pending)
    async with asyncio.timeout(30):
        while sum(d[:1] == b"\x02" for _, d in runner.got) < len(flood):
            runner.changed.clear()
            assert not piped.done(), piped.result()
            await runner.changed.wait()
    pending.end(ViewEndReason.CLOSED)
    assert await piped == ViewEndReason.CLOSED
    at = [t for t, d in runner.got if d[:1] == b"\x02"]
    gaps = [b - a for a, b in itertools.pairwise(at)]
    assert min(gaps) >= WATCH_UPDATE_GAP_S * 0.95, gaps


async def test_a_silent_watcher_ends_idle_and_a_silent_driver_does_not(monkeypatch: Any) -> None:
    monkeypatch.setattr(relay_module, "WATCH_IDLE_S", 0.3)
    ticket, pending = view(watcher=True)
    async with asyncio.timeout(10):
        assert await start(Viewer([HANDSHAKE]), Runner(), ticket, pending) == ViewEndReason.WATCH_IDLE
    ticket, pending = view(watcher=False)
    runner = Runner()
    piped = start(Viewer([HANDSHAKE]), runner, ticket, pending)
    async with asyncio.timeout(10):
        await runner.changed.wait()
    done, _ = await asyncio.wait([piped], timeout=1.0)  # over three idle bounds: a driver is never idled out
    assert not done
    pending.end(ViewEndReason.CLOSED)
    assert await piped == ViewEndReason.CLOSED


class AnsweringRunner(Runner):
    """A runner whose screen is still until the test changes it (`answer`): QEMU answers an incremental
    update request only once something changed."""

    def __init__(self) -> None:
        super().__init__()
        self.outbox: asyncio.Queue[bytes] = asyncio.Queue()

    async def receive(self) -> dict[str, Any]:
        return {"type": "websocket.receive", "bytes": await self.outbox.get()}

    def answer(self) -> None:
        self.outbox.put_nowait(struct.pack(">BxH", 0, 0))  # a FramebufferUpdate of no rectangles


async def test_a_watcher_of_a_still_screen_is_not_idle_until_it_stops_asking(monkeypatch: Any) -> None:
    """noVNC asks for the screen once and asks again only after an answer: watching a screen that does not
    change, it sends nothing. Its request waiting is not idleness (before: ended after WATCH_IDLE_S of
    silence); once answered, a viewer that does not ask again is idle."""
    monkeypatch.setattr(relay_module, "WATCH_IDLE_S", 0.3)
    ticket, pending = view(watcher=True)
    runner = AnsweringRunner()
    ask = struct.pack(">BBHHHH", 3, 1, 0, 0, 640, 480)
    piped = start(Viewer([HANDSHAKE, ask]), runner, ticket, pending)
    async with asyncio.timeout(10):
        while not any(d[:1] == b"\x03" for _, d in runner.got):
            runner.changed.clear()
            await runner.changed.wait()
    done, _ = await asyncio.wait([piped], timeout=1.2)  # four idle bounds with its request unanswered
    assert not done, piped.result()
    runner.answer()  # the screen changed: answered, and this viewer asks no more
    async with asyncio.timeout(10):
        assert await piped == ViewEndReason.WATCH_IDLE
