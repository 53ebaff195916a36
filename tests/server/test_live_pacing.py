"""A watcher's framebuffer update requests reach the runner paced (gh_server/live/screen_relay.py,
WATCH_UPDATE_GAP_S); the person driving the machine is never paced. The relay's pipe runs here between
two in-memory sockets, so what is asserted is the order and spacing of what the runner side receives."""

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
REQUESTS = 6


def update_request(incremental: int = 1) -> bytes:
    return struct.pack(">BBHHHH", 3, incremental, 0, 0, 720, 400)


class Viewer:
    """The browser's end: its messages, then nothing until the test ends the view."""

    def __init__(self, messages: list[bytes]) -> None:
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        for m in messages:
            self.inbox.put_nowait({"type": "websocket.receive", "bytes": m})

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def send_bytes(self, data: bytes) -> None:
        pass


class Runner:
    """The runner's end: it records when each message arrived."""

    def __init__(self) -> None:
        self.got: list[tuple[float, bytes]] = []
        self.asked = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await asyncio.Event().wait()  # the display sends nothing here
        raise AssertionError

    async def send_bytes(self, data: bytes) -> None:
        self.got.append((time.monotonic(), data))
        if sum(d[:1] == b"\x03" for _, d in self.got) >= REQUESTS:
            self.asked.set()


async def pipe(*, attempt: bool, holds: bool) -> list[float]:
    """When the runner got each of REQUESTS update requests the viewer sent at once."""
    ticket = Ticket(value="lv_x", key_id="k", key_name="k", read_only=attempt and not holds,
                    expires_at=datetime.now(UTC), deadline=0.0, attempt_id="at_1" if attempt else None,
                    start_state_id=None if attempt else "ss_1")
    pending = _Pending(key_id="k", arrived=asyncio.get_running_loop().create_future(),
                       attempt_id=ticket.attempt_id, holds=holds)
    viewer = Viewer([HANDSHAKE, update_request(0)] + [update_request() for _ in range(REQUESTS - 1)])
    runner = Runner()
    relay = LiveRelay(cast(Any, None))
    piped = asyncio.create_task(relay._pipe(cast(Any, viewer), cast(Any, runner), ticket, pending,
                                            InputCount(key_id="k", key_name="k")))
    async with asyncio.timeout(30):
        await runner.asked.wait()
    pending.end(ViewEndReason.CLOSED)
    assert await piped == ViewEndReason.CLOSED
    return [at for at, d in runner.got if d[:1] == b"\x03"]


async def test_a_watchers_update_requests_reach_the_runner_paced() -> None:
    at = await pipe(attempt=True, holds=False)
    gaps = [b - a for a, b in itertools.pairwise(at)]
    assert len(at) == REQUESTS and min(gaps) >= WATCH_UPDATE_GAP_S * 0.95, gaps


async def test_the_holder_and_a_start_states_admin_are_not_paced(monkeypatch: Any) -> None:
    # With a gap no pipe could wait out within the test's bound, only an unpaced pipe delivers them all.
    monkeypatch.setattr(relay_module, "WATCH_UPDATE_GAP_S", 3600.0)
    for attempt, holds in ((True, True), (False, False)):
        assert len(await pipe(attempt=attempt, holds=holds)) == REQUESTS
