"""The relay of live views: a viewer's WebSocket (`/v1/live/{ticket}`) joined to the runner's view socket
(`/v1/runners/views/{view_id}`), with bounded queues between them (docs/protocol.md, "Live views").

1. The viewer opens `/v1/live/{ticket}` (same origin: an Origin header must name the Host). The ticket
   is taken (once), the machine must still be open on a runner connected here that takes views, and
   the ticket's key must not be revoked since.
2. The runner is sent `view_open` on its control connection; it dials `/v1/runners/views/{view_id}`
   with its runner token within OPEN_TIMEOUT_S, or says `view_refused` with a reason.
3. Bytes flow. Runner to viewer through a queue of QUEUE_CHUNKS chunks: a viewer that leaves it full
   for VIEWER_SLOW_S (or does not take one chunk in that time) is dropped with `viewer_too_slow`, and
   the runner's socket is never left unread longer than that. Viewer to runner: each WebSocket message
   is first counted against the view's share (gh_server/live/budget.py; past it, `viewer_too_fast`),
   then goes through the RFB parser (gh_server/live/rfb.py): a read-only viewer's key and pointer
   events are cut out unparsed and the rest of its input dropped here; a watcher's messages that make
   QEMU send the display again are paced, and a watcher that stops asking for the screen ends
   (WATCH_IDLE_S, `watch_idle`; a request waiting for a still screen to change keeps it);
   a start state's admin's is counted (gh_server/live/inputs.py) and moves its idle clock; an
   attempt's passes only through the takeover's gate (gh_server/takeover/gate.py): while that view's key
   holds the attempt, as the hold's human steps. The holder's view is opened on the runner as not
   watch-only; every other view of an attempt is watch-only. A hold's end ends its holder's views.
   A key has at most MAX_WATCHES_PER_KEY watchers' views open here, MAX_WATCHES_PER_KEY_MACHINE of one
   machine (fewer than its runner's watcher seats: one key cannot shut the others out), and a ticket for
   a watcher's view past that share is refused before anything is looked up (`watch_seats_taken`, with
   its unused tickets): a burst of watchers costs one refusal each, not a socket's opening; the views that
   drive (a holder's, a start state admin's) are never counted against it, nor against the runner's
   watcher seats
   (gh_runner/live_views.py). A holder's view that fails to open before its hold had any input undoes
   the hold (the gate's `view_ended`): no attempt is left assisted and paused with no screen.
4. Either end closes both, with one `ViewEndReason` as the close reason (code 4010). The server ends
   them too: the views of a key are kept by its id, and its revocation ends them with `key_revoked`
   (ServerState.key_revoked, from DELETE /v1/api_keys/{id}).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from fastapi import WebSocket
from fastapi.concurrency import run_in_threadpool

from gh_common.timeouts import timeout, within
from gh_server import runner_rows
from gh_server.live import inputs
from gh_server.live.budget import DRIVER, WATCHER, Budget
from gh_server.live.inputs import InputCount
from gh_server.live.rfb import DISPLAY_WORK_KINDS, INPUT_KINDS, ClientStream, Kind, RfbError
from gh_server.live.sockets import MAX_MESSAGE
from gh_server.live.tickets import Ticket, Tickets
from gh_server.models import ApiKey, Attempt, StartState
from gh_server.state import ServerState
from gh_server.takeover.desk import Hold, TakeoverDesk
from gh_server.takeover.gate import HolderGate
from gh_wire import protocol
from gh_wire.vocab import AttemptStatus, ViewEndReason

log = logging.getLogger(__name__)

VIEWER_PATH = "/v1/live/{ticket}"
OPEN_TIMEOUT_S = 120.0  # view_open to the runner's socket (the runner's own bounds add up to 106 s)
QUEUE_CHUNKS = 64  # runner -> viewer; a runner chunk is at most 64 KiB (gh_runner/live_views.py)
VIEWER_SLOW_S = 5.0  # a viewer that takes nothing for this long is dropped
SEND_TIMEOUT_S = 10.0  # one viewer message to the runner
# A watcher's framebuffer update requests, and every other message that makes QEMU send or encode the
# display again (rfb.DISPLAY_WORK_KINDS: SetPixelFormat, SetEncodings...), reach the runner at most this
# often (5 a second). QEMU encodes and sends a screen change for each client that asks: 8 watchers of a
# machine whose screen changes all the time, each asking again at once after every update as noVNC does,
# made the agent's step 20-30% slower on 2 cores; paced to 5 a second, within the noise
# (bench/agent_step.py, "8 viewers zrle 5/s"). The person holding the machine, and an admin at an open
# start state, are not paced: they drive it.
WATCH_UPDATE_GAP_S = 0.2
VIEWER_BACKLOG = 16  # viewer -> runner messages waiting for their turn (a watcher's paced requests)
MAX_VIEWER_MESSAGE = MAX_MESSAGE  # one WebSocket message from the viewer (the transport's bound, checked again)
# A watcher that has not asked for the screen (FramebufferUpdateRequest) this long since its last answer
# is ended. A request the runner has not answered keeps it: QEMU answers an incremental request only once
# the screen changes, so a viewer watching a still screen asks nothing more while it waits (_Watching).
WATCH_IDLE_S = 300.0
MAX_WATCHES_PER_KEY = 16  # watchers' views of one key open here at once (noVNC: one per watch page)
# Watchers' views of one key on one machine: well under the runner's watcher seats of a machine
# (gh_runner/live_views.py: MAX_VIEWS_PER_MACHINE - DRIVER_SEATS, 10), so one key cannot take them all and
# shut the other members out of watching it (16 per key could before).
MAX_WATCHES_PER_KEY_MACHINE = 4
TOUCH_EVERY_S = 10.0  # input moves the start state's last_input_at at most this often
CLOSE_TIMEOUT_S = 2.0
# An attempt whose machine is up (or being made): its view may open.
LIVE_ATTEMPT = frozenset({AttemptStatus.PREPARING, AttemptStatus.RUNNING, AttemptStatus.CHECKING})


@dataclass
class _Pending:
    key_id: str
    arrived: asyncio.Future[WebSocket | protocol.ViewRefused]
    attempt_id: str | None = None
    holds: bool = False  # the holder's view of an attempt taken over
    watching: bool = False  # a watcher's view (read-only): counted against its key's MAX_WATCHES_PER_KEY
    machine: str | None = None  # the attempt's or start state's id (MAX_WATCHES_PER_KEY_MACHINE)
    runner_id: str = ""  # known once the machine is found
    done: asyncio.Event = field(default_factory=asyncio.Event)
    reason: ViewEndReason = ViewEndReason.CLOSED
    stop: asyncio.Event = field(default_factory=asyncio.Event)  # the server ends the view (`stop_reason`)
    stop_reason: ViewEndReason = ViewEndReason.CLOSED

    def end(self, reason: ViewEndReason) -> None:
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()


@dataclass
class _Watching:
    """Whether a watcher still watches: it asked for the screen and the runner has not answered yet, or its
    last answer came less than WATCH_IDLE_S ago (it asks again after each answer, as noVNC does)."""

    since: float  # the view's start, or the runner's last answer to a request
    asking: bool = False  # an update request the runner has not answered yet
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def asked(self) -> None:
        if not self.asking:
            self.asking = True
            self.changed.set()

    def answered(self) -> None:
        if self.asking:
            self.asking = False
            self.since = time.monotonic()
            self.changed.set()

    async def idle(self) -> ViewEndReason:
        """Return `watch_idle` once no request is waiting and none came for WATCH_IDLE_S since the last answer."""
        while True:
            self.changed.clear()
            if self.asking:
                await self.changed.wait()
                continue
            left = self.since + WATCH_IDLE_S - time.monotonic()
            if left <= 0:
                return ViewEndReason.WATCH_IDLE
            with contextlib.suppress(TimeoutError):
                async with timeout(left):
                    await self.changed.wait()


class LiveRelay:
    def __init__(self, st: ServerState, tickets: Tickets | None = None, takeovers: TakeoverDesk | None = None) -> None:
        self.st = st
        self.tickets = tickets or Tickets()
        # The takeover's gate: which view of an attempt drives it, and what its input becomes.
        self.gate = HolderGate(takeovers, self._hold_ended) if takeovers is not None else None
        self._pending: dict[str, _Pending] = {}
        self._by_key: dict[str, set[str]] = {}  # key id -> the ids of its views, so a revocation ends them
        self.ended: collections.Counter[ViewEndReason] = collections.Counter()  # views by how they ended
        self._opening: dict[str, tuple[asyncio.Lock, int]] = {}  # key id -> its opening's lock, and its users

    @property
    def open_views(self) -> int:
        return len(self._pending)

    def watch_seats_taken(self, key_id: str, machine: str) -> int:
        """The key's watchers of that machine: open or opening here, or asked for (an unused ticket)."""
        watching = sum(self._pending[v].watching and self._pending[v].machine == machine
                       for v in self._by_key.get(key_id, ()))
        return watching + self.tickets.unused(key_id, machine)

    def end_views_of(self, key_id: str, reason: ViewEndReason = ViewEndReason.KEY_REVOKED) -> int:
        """End every view of this key now (on the server's loop); how many there were."""
        ids = self._by_key.get(key_id, set())
        for view_id in ids:
            self._pending[view_id].end(reason)
        return len(ids)

    def _hold_ended(self, hold: Hold) -> None:
        """The holder's views of that attempt end with the hold (a page asks for a watcher's view anew)."""
        for p in self._pending.values():
            if p.holds and p.attempt_id == hold.attempt_id and p.key_id == hold.key_id:
                p.end(ViewEndReason.CLOSED)

    # -- the runner's side --------------------------------------------------------------------

    def refused(self, runner_id: str, msg: protocol.ViewRefused) -> None:
        """A runner's `view_refused` (the gateway's reader hands it here)."""
        p = self._pending.get(msg.view_id)
        if p is not None and p.runner_id == runner_id and not p.arrived.done():
            p.arrived.set_result(msg)

    async def runner_endpoint(self, ws: WebSocket, view_id: str) -> None:
        """`/v1/runners/views/{view_id}`: a runner's view socket, held until its viewer is done."""
        await ws.accept()
        scheme, _, token = ws.headers.get("authorization", "").partition(" ")
        found = None
        if scheme.lower() == "bearer" and token.strip():
            found = await run_in_threadpool(self._runner_by_token, token.strip())
        if found is None:
            await _close(ws, protocol.CLOSE_TOKEN_REVOKED, "unknown or revoked runner token")
            return
        p = self._pending.get(view_id)
        if p is None or p.runner_id != found or p.arrived.done():
            await _close(ws, protocol.CLOSE_VIEW_ENDED, ViewEndReason.CLOSED)
            return
        p.arrived.set_result(ws)
        try:
            await p.done.wait()  # the viewer's side reads and writes this socket; it sets `done` at its end
        finally:
            await _close(ws, protocol.CLOSE_VIEW_ENDED, p.reason)

    def _runner_by_token(self, token: str) -> str | None:
        with self.st.db() as s:
            found = runner_rows.runner_by_token(s, token)
        return found[0] if found is not None else None

    # -- the viewer's side --------------------------------------------------------------------

    async def viewer_endpoint(self, ws: WebSocket, ticket: str) -> None:
        """`/v1/live/{ticket}`: one viewer, from its ticket to its close."""
        offered = ws.scope.get("subprotocols") or []
        await ws.accept(subprotocol="binary" if "binary" in offered else None)
        origin, host = ws.headers.get("origin"), ws.headers.get("host")
        if origin is not None and (host is None or urlsplit(origin).netloc.lower() != host.lower()):
            await _close(ws, protocol.CLOSE_VIEW_ENDED, ViewEndReason.TICKET_INVALID)
            return
        t = self.tickets.take(ticket)
        if t is None:
            await _close(ws, protocol.CLOSE_VIEW_ENDED, ViewEndReason.TICKET_INVALID)
            return
        machine = t.attempt_id or t.start_state_id
        watches = [self._pending[v] for v in self._by_key.get(t.key_id, ()) if self._pending[v].watching]
        if t.read_only and (len(watches) >= MAX_WATCHES_PER_KEY
                            or sum(w.machine == machine for w in watches) >= MAX_WATCHES_PER_KEY_MACHINE):
            self.ended[ViewEndReason.TOO_MANY_VIEWS] += 1
            await _close(ws, protocol.CLOSE_VIEW_ENDED, ViewEndReason.TOO_MANY_VIEWS)
            return
        view_id = secrets.token_urlsafe(16)
        p = _Pending(t.key_id, asyncio.get_running_loop().create_future(), attempt_id=t.attempt_id,
                     watching=t.read_only, machine=machine)
        # Kept by its key before the key is checked, so a revocation from here on ends it.
        self._pending[view_id] = p
        self._by_key.setdefault(t.key_id, set()).add(view_id)
        count = InputCount(key_id=t.key_id, key_name=t.key_name)
        try:
            p.reason = await self._view(ws, t, view_id, p, count)
            if p.holds and self.gate is not None:
                await self.gate.view_ended(t, p.reason)
        finally:
            p.done.set()
            self._pending.pop(view_id, None)
            mine = self._by_key.get(t.key_id, set())
            mine.discard(view_id)
            if not mine:
                self._by_key.pop(t.key_id, None)
            self.ended[p.reason] += 1
            await _close(ws, protocol.CLOSE_VIEW_ENDED, p.reason)
            if count.any and t.start_state_id is not None:
                await self._record(t.start_state_id, count)
            log.info("live view %s ended: %s (%d keys, %d pointer events)", view_id, p.reason.value, count.keys,
                     count.pointer)

    def _runner_of(self, t: Ticket) -> str | None:
        """The runner holding the ticket's machine now; None when it is not running or the key was revoked."""
        with self.st.db() as s:
            key = s.get(ApiKey, t.key_id)
            if key is None or key.revoked_at is not None:
                return None
            if t.start_state_id is not None:
                ss = s.get(StartState, t.start_state_id)
                return ss.runner_id if ss is not None and ss.status == "open" else None
            a = s.get(Attempt, t.attempt_id) if t.attempt_id is not None else None
            return a.runner_id if a is not None and a.status in LIVE_ATTEMPT else None

    async def _view(self, ws: WebSocket, t: Ticket, view_id: str, p: _Pending, count: InputCount) -> ViewEndReason:
        async with self._opening_of(t.key_id):
            got = await self._open(t, view_id, p)
        if isinstance(got, ViewEndReason):
            return got
        return await self._pipe(ws, got, t, p, count)

    @contextlib.asynccontextmanager
    async def _opening_of(self, key_id: str) -> AsyncIterator[None]:
        """One view of a key opens at a time: a view's opening (a lookup, the runner's dial-back, its socket
        and QEMU's) is the most a view costs the server, and a page opens one. A key's burst of its
        MAX_WATCHES_PER_KEY_MACHINE watchers then opens one after another, not all at once on the one loop
        (bench/live_abuse.py, unread_open); other keys' views do not wait for it."""
        lock, users = self._opening.get(key_id, (asyncio.Lock(), 0))
        self._opening[key_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._opening[key_id]
            if users == 1:
                del self._opening[key_id]
            else:
                self._opening[key_id] = (lock, users - 1)

    async def _open(self, t: Ticket, view_id: str, p: _Pending) -> WebSocket | ViewEndReason:
        """The runner's socket of the view, or why it did not come."""
        runner_id = await run_in_threadpool(self._runner_of, t)
        gw = self.st.gateway
        if runner_id is None:
            return ViewEndReason.NO_MACHINE
        if gw is None or not gw.takes_views(runner_id):
            return ViewEndReason.RUNNER_UNAVAILABLE
        if p.stop.is_set():
            return p.stop_reason
        p.runner_id = runner_id
        # The holder's view drives the machine; every other view of an attempt is a watcher's, which the
        # runner ends once a secret is typed there.
        p.holds = self.gate is not None and self.gate.holder(t) is not None
        opened = protocol.ViewOpen(view_id=view_id, start_state_id=t.start_state_id, attempt_id=t.attempt_id,
                                   watch_only=t.attempt_id is not None and not p.holds)
        if not await gw.send(p.runner_id, opened):
            return ViewEndReason.RUNNER_UNAVAILABLE
        stopped = asyncio.create_task(p.stop.wait())
        either: list[asyncio.Future[Any]] = [p.arrived, stopped]  # the runner's socket, or the server's end
        try:
            await within(OPEN_TIMEOUT_S, asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED))
        except TimeoutError:
            pass
        finally:
            stopped.cancel()
        if not p.arrived.done() or p.stop.is_set():
            await gw.send(p.runner_id, protocol.ViewClose(view_id=view_id, reason=ViewEndReason.CLOSED))
            return p.stop_reason if p.stop.is_set() else ViewEndReason.RUNNER_UNAVAILABLE
        got = p.arrived.result()
        return got.reason if isinstance(got, protocol.ViewRefused) else got

    async def _pipe(self, viewer: WebSocket, runner: WebSocket, t: Ticket, p: _Pending,
                    count: InputCount) -> ViewEndReason:
        queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=QUEUE_CHUNKS)
        # Viewer -> runner, in order; each item says whether it makes QEMU work (paced for watchers).
        outbound: asyncio.Queue[tuple[bytes, bool]] = asyncio.Queue(maxsize=VIEWER_BACKLOG)
        watcher = t.attempt_id is not None and not p.holds
        gap = WATCH_UPDATE_GAP_S if watcher else 0.0
        watching = _Watching(since=time.monotonic())

        async def from_runner() -> ViewEndReason:
            while True:
                m = await runner.receive()
                if m["type"] == "websocket.disconnect":
                    return _reason(m.get("reason"), ViewEndReason.MACHINE_GONE)
                data = m.get("bytes")
                if data is None:
                    return ViewEndReason.CLOSED  # not the view protocol: end it
                watching.answered()
                try:
                    await within(VIEWER_SLOW_S, queue.put(data))
                except TimeoutError:
                    return ViewEndReason.VIEWER_TOO_SLOW

        async def to_viewer() -> ViewEndReason:
            while True:
                data = await queue.get()
                try:
                    await within(VIEWER_SLOW_S, viewer.send_bytes(data))
                except TimeoutError:
                    return ViewEndReason.VIEWER_TOO_SLOW

        async def from_viewer() -> ViewEndReason:
            parser = ClientStream(drop_input=t.read_only)
            budget = Budget(WATCHER if watcher else DRIVER)
            last_touch = 0.0
            while True:
                m = await viewer.receive()
                if m["type"] == "websocket.disconnect":
                    return ViewEndReason.VIEWER_CLOSED
                data = m.get("bytes")
                if data is None:
                    return ViewEndReason.RFB_PROTOCOL
                # Counted before a byte of it is parsed: the parse is what costs the server's one loop.
                if len(data) > MAX_VIEWER_MESSAGE or not budget.spend(len(data)):
                    return ViewEndReason.VIEWER_TOO_FAST
                try:
                    messages = parser.feed(data)
                except RfbError as e:
                    log.info("live view: the viewer's RFB ends it: %s", e)
                    return ViewEndReason.RFB_PROTOCOL
                out = bytearray()
                sent_input = False
                asks = False
                for msg in messages:
                    if msg.kind in INPUT_KINDS:
                        if t.read_only:
                            continue  # a read-only viewer's input stops here, whatever its page does
                        if t.attempt_id is not None:
                            if not (p.holds and self.gate is not None and self.gate.passes(t, msg)):
                                continue  # an attempt's machine takes a person's input only while held
                        sent_input = True
                        _count(count, msg.kind, msg.key_down)
                    asks = asks or msg.kind in DISPLAY_WORK_KINDS
                    if msg.kind is Kind.UPDATE_REQUEST:
                        watching.asked()
                    out += msg.data
                if out:
                    try:
                        await within(SEND_TIMEOUT_S, outbound.put((bytes(out), asks)))
                    except TimeoutError:
                        return ViewEndReason.SEND_TIMEOUT
                if sent_input and t.start_state_id is not None and time.monotonic() - last_touch > TOUCH_EVERY_S:
                    last_touch = time.monotonic()
                    await self._touch(t.start_state_id)

        async def to_runner() -> ViewEndReason:
            next_ask = 0.0
            while True:
                data, asks = await outbound.get()
                if asks and (wait := next_ask - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                try:
                    await within(SEND_TIMEOUT_S, runner.send_bytes(data))
                except TimeoutError:
                    return ViewEndReason.SEND_TIMEOUT
                except Exception:  # the runner's socket broke
                    return ViewEndReason.MACHINE_GONE
                if asks:
                    next_ask = time.monotonic() + gap

        async def stopped() -> ViewEndReason:
            await p.stop.wait()
            return p.stop_reason

        ends = [from_runner, to_viewer, from_viewer, to_runner, stopped, *([watching.idle] if watcher else [])]
        tasks = [asyncio.create_task(f()) for f in ends]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            first = next(t for t in tasks if t in done)
            try:
                return first.result()
            except Exception:  # a socket that broke under a send or receive
                return ViewEndReason.VIEWER_CLOSED if first is not tasks[0] else ViewEndReason.MACHINE_GONE
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _touch(self, start_state_id: str) -> None:
        def work() -> None:
            with self.st.db.begin() as s:
                inputs.touch(s, start_state_id)

        try:
            await run_in_threadpool(work)
        except Exception:
            log.exception("live view: could not move the start state's idle clock")

    async def _record(self, start_state_id: str, count: InputCount) -> None:
        def work() -> None:
            with self.st.db.begin() as s:
                inputs.record(s, start_state_id, count)
                inputs.touch(s, start_state_id)

        try:
            await run_in_threadpool(work)
        except Exception:
            log.exception("live view: could not record what was sent")


def _count(count: InputCount, kind: Kind, key_down: bool) -> None:
    now = datetime.now(UTC)
    count.first_at = count.first_at or now
    count.last_at = now
    if kind in (Kind.KEY, Kind.QEMU_KEY):
        count.keys += int(key_down)
    elif kind is Kind.POINTER:
        count.pointer += 1
    elif kind is Kind.CUT_TEXT:
        count.clipboard += 1


def _reason(text: Any, default: ViewEndReason) -> ViewEndReason:
    try:
        return ViewEndReason(text)
    except ValueError:
        return default


async def _close(ws: WebSocket, code: int, reason: str) -> None:
    with contextlib.suppress(Exception):
        await within(CLOSE_TIMEOUT_S, ws.close(code=code, reason=str(reason)[:120]))


__all__ = ["LIVE_ATTEMPT", "VIEWER_PATH", "LiveRelay"]
