"""Live views: a machine's screen piped to the server on a websocket of its own (docs/protocol.md, "Live views").

On `view_open` the runner finds the machine (an open start state's, or an attempt's), opens its
screen stream (`Machine.open_screen_stream`: RFB from the hypervisor's display), dials
`VIEW_PATH` on the server it is connected to with its runner token, and copies bytes both ways
until one side ends. What it guarantees:

- The control connection never carries a screen byte, and no view awaits anything the session,
  a lease, a heartbeat or a result waits on: each view is a task of its own.
- Bounded: at most `max_views` views on the runner and `max_per_machine` on one machine (more are
  refused with `too_many_views`). Watchers (`watch_only`) never take the last `driver_seats` of either:
  the person holding a takeover, or an admin at a start state, always finds a seat, however many
  members watch. A chunk of at most CHUNK bytes is in flight each way; every send
  (to the server, to the display) must finish within SEND_TIMEOUT_S or the view ends with
  `send_timeout`. Waiting for the next screen bytes is not bounded: an idle screen sends nothing.
- A view ends with one reason (a `ViewEndReason`): it is the close reason of its socket, or a
  `view_refused` on the control connection when the socket was never up. The machine's stream
  ends with the machine (closed, saved, its attempt torn down): `machine_gone`.
- A watcher never sees what the replay would mask. A `watch_only` view of an attempt is refused with
  `masked` once a secret has been typed there (the attempt's `masked` event, set by its replay just
  before the secret's keys go in: gh_runner/replay.py), and an open one ends with `masked` then: no
  display byte read after that moment is sent on. A view that is not watch-only (the person holding
  a takeover) goes on.
- Each view reads the display on a stream of its own, so a view that ends (a watcher dropped as too
  slow by the server) ends only its own stream; the agent's screenshots do not go through it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from gh_common.timeouts import within
from gh_runner import __version__
from gh_runner.config import is_loopback
from gh_runner.log import get_logger
from gh_wire.protocol import CLOSE_VIEW_ENDED, VIEW_PATH, ViewClose, ViewOpen, ViewRefused
from gh_wire.vocab import ViewEndReason
from providers.base import Machine
from providers.errors import NoScreenStream, ProviderError

log = get_logger("gh_runner.live_views")

# One attempt's machine: 10 watchers, the person holding it, and a seat for the holder's reload (its old
# view ending as the new one opens).
MAX_VIEWS_PER_MACHINE = 12
MAX_VIEWS = 32  # a runner of a few slots, each machine watched
DRIVER_SEATS = 2  # of each bound, the views watchers never take
CHUNK = 64 * 1024  # bytes read from the display per send
MACHINE_WAIT_S = 90.0  # a start state's machine still being made (the first on a runner builds a warm snapshot)
OPEN_TIMEOUT_S = 8.0  # opening the screen stream; dialling the server
SEND_TIMEOUT_S = 10.0  # one chunk to the server, or one message to the display
CLOSE_TIMEOUT_S = 2.0


@dataclass
class _View:
    view_id: str
    machine_id: str
    watch_only: bool = False
    task: asyncio.Task[None] | None = None
    ended: ViewEndReason | None = None  # set by `close` before the task is cancelled


def view_url(control_url: str, view_id: str) -> str:
    """The view socket's URL on the same server (scheme, host, port) as the control connection."""
    parts = urlsplit(control_url)
    return urlunsplit((parts.scheme, parts.netloc, VIEW_PATH.format(view_id=view_id), "", ""))


class LiveViews:
    """The runner's live views. `machine_for(msg, timeout)` finds a view's machine, waiting up to
    `timeout` for one being made (None: not running here);
    `control_url` is the URL the session is connected to now; `send` puts a message on the
    control connection (a refusal: small, and never awaited past the session's own bound);
    `masked_of(attempt_id)` is the attempt's event set once a secret is typed there (None: not
    running here)."""

    def __init__(self, machine_for: Callable[[ViewOpen, float], Awaitable[Machine | None]],
                 control_url: Callable[[], str], token: str, send: Callable[[BaseModel], Awaitable[bool]], *,
                 masked_of: Callable[[str], asyncio.Event | None] = lambda _attempt_id: None,
                 max_views: int = MAX_VIEWS, max_per_machine: int = MAX_VIEWS_PER_MACHINE,
                 driver_seats: int = DRIVER_SEATS, send_timeout: float = SEND_TIMEOUT_S) -> None:
        self._machine_for = machine_for
        self._masked_of = masked_of
        self._control_url = control_url
        self._token = token
        self._send = send
        self.max_views = max_views
        self.max_per_machine = max_per_machine
        self.driver_seats = driver_seats
        self.send_timeout = send_timeout
        self.views: dict[str, _View] = {}
        self._refusals: set[asyncio.Task[None]] = set()

    def open(self, msg: ViewOpen) -> None:
        """Start serving `msg` (returns at once: the machine is looked for, and a refusal sent, in the
        view's own task)."""
        if msg.view_id in self.views:
            self._spawn_refusal(msg.view_id, ViewEndReason.CLOSED, "a view with this id is open already")
            return
        if _full(list(self.views.values()), self.max_views, self.driver_seats, msg.watch_only):
            self._spawn_refusal(msg.view_id, ViewEndReason.TOO_MANY_VIEWS,
                                f"this runner serves at most {self.max_views} views, "
                                f"{self.driver_seats} of them kept for the person driving a machine")
            return
        view = _View(msg.view_id, "", watch_only=msg.watch_only)
        self.views[msg.view_id] = view
        view.task = asyncio.create_task(self._serve(view, msg), name=f"view-{msg.view_id}")

    def close(self, msg: ViewClose) -> bool:
        """End a view now with the server's reason; False when it is not open here."""
        view = self.views.get(msg.view_id)
        if view is None or view.task is None:
            return False
        view.ended = msg.reason
        view.task.cancel()
        return True

    async def close_all(self) -> None:
        """End every view (the runner is stopping); returns once their tasks are done."""
        tasks = []
        for view in list(self.views.values()):
            if view.task is not None:
                view.ended = ViewEndReason.CLOSED
                view.task.cancel()
                tasks.append(view.task)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # -- one view ------------------------------------------------------------------------------

    def _spawn_refusal(self, view_id: str, reason: ViewEndReason, text: str) -> None:
        log.info("live view refused", view_id=view_id, reason=reason.value, detail=text)

        async def send() -> None:
            with contextlib.suppress(Exception):
                await within(self.send_timeout, self._send(ViewRefused(view_id=view_id, reason=reason,
                                                                       message=text[:300])))

        task = asyncio.create_task(send(), name=f"view-refused-{view_id}")
        self._refusals.add(task)  # held until done: the loop keeps only weak references to tasks
        task.add_done_callback(self._refusals.discard)

    async def _serve(self, view: _View, msg: ViewOpen) -> None:
        writer: asyncio.StreamWriter | None = None
        ws: ClientConnection | None = None
        reason = ViewEndReason.CLOSED
        try:
            machine = await self._machine_for(msg, MACHINE_WAIT_S)
            if machine is None:
                what = f"attempt {msg.attempt_id}" if msg.attempt_id else f"start state {msg.start_state_id}"
                await self._refuse(view, ViewEndReason.NO_MACHINE, f"{what} has no machine running on this runner")
                return
            masked = self._masked_of(msg.attempt_id) if msg.watch_only and msg.attempt_id else None
            if masked is not None and masked.is_set():
                await self._refuse(view, ViewEndReason.MASKED, f"a secret was typed in attempt {msg.attempt_id}: "
                                   "its watchers see its replay's masked frames, not the screen")
                return
            on_machine = [v for v in self.views.values() if v.machine_id == machine.machine_id]
            if _full(on_machine, self.max_per_machine, self.driver_seats, msg.watch_only):
                await self._refuse(view, ViewEndReason.TOO_MANY_VIEWS,
                                   f"a machine has at most {self.max_per_machine} views, {self.driver_seats} of "
                                   "them kept for the person driving it")
                return
            view.machine_id = machine.machine_id
            try:
                reader, writer_ = await within(OPEN_TIMEOUT_S, machine.open_screen_stream(OPEN_TIMEOUT_S))
                writer = writer_
            except NoScreenStream as e:
                await self._refuse(view, ViewEndReason.NO_SCREEN, str(e))
                return
            except (ProviderError, OSError, TimeoutError) as e:
                await self._refuse(view, ViewEndReason.SCREEN_FAILED, str(e) or type(e).__name__)
                return
            url = view_url(self._control_url(), view.view_id)
            try:
                ws = await connect(
                    url, additional_headers={"Authorization": f"Bearer {self._token}"},
                    user_agent_header=f"gh-runner/{__version__}", open_timeout=OPEN_TIMEOUT_S,
                    ping_interval=None,  # the viewer's side and the display tell a dead peer
                    close_timeout=CLOSE_TIMEOUT_S, max_size=CHUNK * 4, max_queue=16, write_limit=CHUNK * 4,
                    proxy=None if is_loopback(urlsplit(url).hostname or "") else True,
                )
            except (OSError, InvalidHandshake, TimeoutError) as e:
                await self._refuse(view, ViewEndReason.DIAL_FAILED, f"{type(e).__name__}: {e}")
                return
            log.info("live view open", view_id=view.view_id, machine_id=view.machine_id)
            reason = await self._pipe(reader, writer_, ws, masked)
        except asyncio.CancelledError:
            reason = view.ended or ViewEndReason.CLOSED
        finally:
            # Own bounds: this runs when the view was cancelled too, and must not hang the runner's stop.
            if ws is not None:
                with contextlib.suppress(Exception):
                    await within(CLOSE_TIMEOUT_S, ws.close(CLOSE_VIEW_ENDED, reason.value))
            if writer is not None:
                writer.close()
                with contextlib.suppress(Exception):
                    await within(CLOSE_TIMEOUT_S, writer.wait_closed())
            self.views.pop(view.view_id, None)
            if ws is not None:
                log.info("live view ended", view_id=view.view_id, reason=reason.value)

    async def _refuse(self, view: _View, reason: ViewEndReason, text: str) -> None:
        log.info("live view refused", view_id=view.view_id, reason=reason.value, detail=text)
        with contextlib.suppress(Exception):
            await within(self.send_timeout, self._send(ViewRefused(view_id=view.view_id, reason=reason,
                                                                   message=text[:300])))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    ws: ClientConnection, masked: asyncio.Event | None) -> ViewEndReason:
        """Copy both ways until one side ends, or `masked` is set; the reason it ended."""

        async def screen_to_server() -> ViewEndReason:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    return ViewEndReason.MACHINE_GONE
                if masked is not None and masked.is_set():
                    return ViewEndReason.MASKED  # read after the secret's first key: never sent
                try:
                    await within(self.send_timeout, ws.send(data))
                except TimeoutError:
                    return ViewEndReason.SEND_TIMEOUT
                except ConnectionClosed:
                    return ViewEndReason.VIEWER_CLOSED

        async def server_to_screen() -> ViewEndReason:
            try:
                async for data in ws:
                    if isinstance(data, str):
                        return ViewEndReason.RFB_PROTOCOL
                    writer.write(data)
                    await within(self.send_timeout, writer.drain())
            except TimeoutError:
                return ViewEndReason.SEND_TIMEOUT
            except (ConnectionResetError, BrokenPipeError):
                return ViewEndReason.MACHINE_GONE
            except ConnectionClosed:
                pass
            return _said(ws) or ViewEndReason.VIEWER_CLOSED

        async def until_masked() -> ViewEndReason:
            if masked is None:
                await asyncio.Future()  # never: this view is not a watcher's
            else:
                await masked.wait()
            return ViewEndReason.MASKED

        up = asyncio.create_task(screen_to_server())
        down = asyncio.create_task(server_to_screen())
        hidden = asyncio.create_task(until_masked())
        tasks = (hidden, up, down)  # masked first: it wins over an end that came with it
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            first = next(t for t in tasks if t in done)
            try:
                return first.result()
            except (OSError, ConnectionClosed):
                return ViewEndReason.MACHINE_GONE if first is up else ViewEndReason.VIEWER_CLOSED
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t


def _full(views: list[_View], bound: int, driver_seats: int, watch_only: bool) -> bool:
    """Whether a new view (a watcher's when `watch_only`) finds `views` at its bound."""
    if len(views) >= bound:
        return True
    return watch_only and sum(v.watch_only for v in views) >= bound - driver_seats


def _said(ws: ClientConnection) -> ViewEndReason | None:
    """The reason the server gave in its close frame (the viewer's end: `viewer_too_slow`, ...)."""
    frame = ws.protocol.close_rcvd
    try:
        return ViewEndReason(frame.reason) if frame is not None else None
    except ValueError:
        return None


__all__ = ["DRIVER_SEATS", "MAX_VIEWS", "MAX_VIEWS_PER_MACHINE", "LiveViews", "view_url"]
