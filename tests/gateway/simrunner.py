"""A simulated runner: the protocol module and a websocket, no daemon and no machines.

It speaks to the real gateway like gh-runner does (hello, heartbeats, lease_accept/refuse, statuses,
results, machine responses), with behaviour the test chooses. Every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import websockets
from websockets.asyncio.client import ClientConnection

from gh_wire import protocol

DEFAULT_WAIT = 30.0
T = TypeVar("T")


def now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class _Closed:
    """The socket closed, with this code: the last thing handed to the test's loop."""
    code: int | None


class _IoThread:
    """An event loop of the simulated runner's own, in a thread: its socket is read, and the server's
    heartbeats answered, while the test's loop is busy (a test's synchronous database write on a loaded
    host took seconds in CI, and a runner that answered from the test's loop went silent past the
    dead-peer bound: close 4008 in a test about something else)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="simrunner-io", daemon=True)
        self._thread.start()

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the runner's loop and wait for it from the caller's."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def start(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


class SimRunner:
    """The protocol side of gh-runner, driven by a test. Its socket lives on a loop of its own
    (`_IoThread`), where it answers each server heartbeat with one of its own, as a live runner
    keeps itself alive; `answer_heartbeats=False` makes a runner that goes silent after hello (the
    dead-peer test). What arrives is handed to the test's loop in order: `on_message`, then `expect`."""

    def __init__(self, ws_url: str, token: str, *, name: str = "sim", slots: int = 2, labels: list[str] | None = None,
                 images: list[str] | None = None, held: list[tuple[str, int]] | None = None,
                 in_flight: list[str] | None = None, answer_heartbeats: bool = True, scores: bool = True) -> None:
        self.ws_url = ws_url
        self.token = token
        self.hello = protocol.Hello(
            version="sim-1", name=name, slots=slots, labels=labels or [],
            images=[protocol.ImageAd(name=i, os="linux", version="1", checksum="sha256:0") for i in (images or [])],
            start_states=[protocol.HeldVersion(start_state_id=s, version=v) for s, v in (held or [])],
            in_flight=in_flight or [],
            scores=scores,  # False: a runner from before scores (hello without `scores`)
        )
        self.answer_heartbeats = answer_heartbeats
        self._last_beat = protocol.Heartbeat(at=now(), slots=slots)
        self.ws: ClientConnection | None = None
        self.inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.stash: list[Any] = []
        self.welcome: protocol.Welcome | None = None
        self.close_code: int | None = None
        self.closed = asyncio.Event()
        self._io: _IoThread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._arrivals: asyncio.Queue[Any] = asyncio.Queue()  # on the test's loop, in the order read
        self._reader: concurrent.futures.Future[Any] | None = None
        self._deliverer: asyncio.Task[None] | None = None
        self._heartbeats: concurrent.futures.Future[Any] | None = None
        self.on_message: Callable[[Any], Any] | None = None  # return True to swallow the message

    async def connect(self, send_hello: bool = True) -> SimRunner:
        self._loop = asyncio.get_running_loop()
        self._io = _IoThread()

        async def dial() -> ClientConnection:
            return await websockets.connect(self.ws_url, additional_headers={"Authorization": f"Bearer {self.token}"},
                                            open_timeout=DEFAULT_WAIT, max_size=protocol.MAX_FRAME_BYTES)
        self.ws = await self._io.run(dial())
        self._deliverer = asyncio.create_task(self._deliver())
        self._reader = self._io.start(self._read())
        if send_hello:
            await self.send(self.hello)
            self.welcome = await self.expect("welcome")
        return self

    async def _read(self) -> None:
        """On the runner's loop: read, answer heartbeats, hand every message to the test's loop."""
        assert self.ws is not None and self._loop is not None
        try:
            async for raw in self.ws:
                msg = protocol.parse_server_message(raw)
                if self.answer_heartbeats and msg.type == "heartbeat":
                    await self.ws.send(protocol.encode(self._beat()))
                self._loop.call_soon_threadsafe(self._arrivals.put_nowait, msg)
        except websockets.ConnectionClosed:
            pass
        finally:
            code = self.ws.close_code
            with contextlib.suppress(RuntimeError):  # the test's loop already closed
                self._loop.call_soon_threadsafe(self._arrivals.put_nowait, _Closed(code))

    async def _deliver(self) -> None:
        """On the test's loop: each message to `on_message` (awaited, in order), then to the inbox."""
        while True:
            msg = await self._arrivals.get()
            if isinstance(msg, _Closed):
                self.close_code = msg.code
                self.closed.set()
                return
            if self.on_message is not None:
                handled = self.on_message(msg)
                if asyncio.iscoroutine(handled):
                    handled = await handled
                if handled:
                    continue
            self.inbox.put_nowait(msg)

    def _beat(self) -> protocol.Heartbeat:
        """A heartbeat that repeats what the test's last one said (busy, draining, paused): an answer
        must keep the runner alive without undoing a drain or a pause the test declared."""
        return self._last_beat.model_copy(update={"at": now()})

    async def send(self, msg: Any) -> None:
        if isinstance(msg, protocol.Heartbeat):
            self._last_beat = msg
        await self.send_raw(protocol.encode(msg))

    async def send_raw(self, raw: str | bytes) -> None:
        assert self.ws is not None and self._io is not None
        await self._io.run(self.ws.send(raw))

    async def expect(self, mtype: str, timeout: float = DEFAULT_WAIT,
                     where: Callable[[Any], bool] | None = None) -> Any:
        """The next message of this type (others are kept for later expects), or fail at the deadline."""
        for i, m in enumerate(self.stash):
            if m.type == mtype and (where is None or where(m)):
                return self.stash.pop(i)
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise AssertionError(f"no {mtype} within {timeout} s; got {[m.type for m in self.stash]}")
            try:
                m = await asyncio.wait_for(self.inbox.get(), left)
            except TimeoutError:
                continue
            if m.type == mtype and (where is None or where(m)):
                return m
            self.stash.append(m)

    async def sync(self) -> None:
        """Round trip: the server handles a connection's frames in order, so once the answer to a bad
        frame is back, everything sent before it has been handled."""
        await self.send_raw('{"type": "sync-probe"}')
        await self.expect("error", where=lambda m: "sync-probe" in m.message)

    async def wait_closed(self, timeout: float = DEFAULT_WAIT) -> int | None:
        await asyncio.wait_for(self.closed.wait(), timeout)
        return self.close_code

    def keep_alive(self, every: float = 0.5) -> SimRunner:
        """Send heartbeats every `every` seconds until closed, as gh-runner does, besides the answers
        to the server's: for a test whose server sends its own rarely."""
        assert self._io is not None

        async def beat() -> None:
            assert self.ws is not None
            while True:
                await self.ws.send(protocol.encode(self._beat()))
                await asyncio.sleep(every)
        self._heartbeats = self._io.start(beat())
        return self

    async def close(self) -> None:
        io = self._io
        if io is None:
            return
        for fut in (self._heartbeats, self._reader):
            if fut is not None:
                io.loop.call_soon_threadsafe(fut.cancel)
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(io.run(self.ws.close()), 10)
        for fut in (self._heartbeats, self._reader):
            if fut is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(asyncio.wrap_future(fut), 10)
        if self._deliverer is not None:
            if not self.closed.is_set():
                self._deliverer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._deliverer
        io.stop()
        self._io = None

    # -- attempt helpers ----------------------------------------------------------------------

    async def status(self, attempt_id: str, status: str, phase: str | None = None) -> None:
        await self.send(protocol.AttemptStatus(attempt_id=attempt_id, status=status,  # type: ignore[arg-type]
                                               phase=phase or status, at=now()))

    async def finish(self, attempt_id: str, outcome: str = "passed", error: str | None = None,
                     answer: str | None = "", check_after: str | None = "True",
                     save_points: list[protocol.SavePoint] | None = None) -> protocol.ResultAck:
        res = protocol.AttemptResult(
            attempt_id=attempt_id, outcome=outcome, error=error, answer=answer,  # type: ignore[arg-type]
            check_before=protocol.CheckOutput(exit_code=0, stdout_tail="False", verdict="False"),
            check_after=None if check_after is None else protocol.CheckOutput(
                exit_code=0, stdout_tail=check_after,
                verdict=check_after if check_after in ("True", "False") else None),
            metrics=protocol.AttemptMetrics(active_seconds=1.5, steps=2),
            started_at=now(), finished_at=now(), save_points=save_points,
        )
        await self.send(protocol.AttemptFinished(result=res))
        ack: protocol.ResultAck = await self.expect("result_ack", where=lambda m: m.attempt_id == attempt_id)
        return ack


def raw_json(obj: Any) -> str:
    return json.dumps(obj)
