"""A simulated runner: the protocol module and a websocket, no daemon and no machines.

It speaks to the real gateway like gh-runner does (hello, heartbeats, lease_accept/refuse, statuses,
results, machine responses), with behaviour the test chooses. Every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection

from gh_wire import protocol

DEFAULT_WAIT = 30.0


def now() -> datetime:
    return datetime.now(UTC)


class SimRunner:
    def __init__(self, ws_url: str, token: str, *, name: str = "sim", slots: int = 2, labels: list[str] | None = None,
                 images: list[str] | None = None, held: list[tuple[str, int]] | None = None,
                 in_flight: list[str] | None = None) -> None:
        self.ws_url = ws_url
        self.token = token
        self.hello = protocol.Hello(
            version="sim-1", name=name, slots=slots, labels=labels or [],
            images=[protocol.ImageAd(name=i, os="linux", version="1", checksum="sha256:0") for i in (images or [])],
            start_states=[protocol.HeldVersion(start_state_id=s, version=v) for s, v in (held or [])],
            in_flight=in_flight or [],
        )
        self.ws: ClientConnection | None = None
        self.inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.stash: list[Any] = []
        self.welcome: protocol.Welcome | None = None
        self.close_code: int | None = None
        self.closed = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._heartbeats: asyncio.Task[None] | None = None
        self.on_message: Callable[[Any], Any] | None = None  # return True to swallow the message

    async def connect(self, send_hello: bool = True) -> SimRunner:
        self.ws = await websockets.connect(self.ws_url, additional_headers={"Authorization": f"Bearer {self.token}"},
                                           open_timeout=DEFAULT_WAIT, max_size=protocol.MAX_FRAME_BYTES)
        self._reader = asyncio.create_task(self._read())
        if send_hello:
            await self.send(self.hello)
            self.welcome = await self.expect("welcome")
        return self

    async def _read(self) -> None:
        assert self.ws is not None
        try:
            async for raw in self.ws:
                msg = protocol.parse_server_message(raw)
                if self.on_message is not None:
                    handled = self.on_message(msg)
                    if asyncio.iscoroutine(handled):
                        handled = await handled
                    if handled:
                        continue
                self.inbox.put_nowait(msg)
        except websockets.ConnectionClosed:
            pass
        finally:
            self.close_code = self.ws.close_code
            self.closed.set()

    async def send(self, msg: Any) -> None:
        assert self.ws is not None
        await self.ws.send(protocol.encode(msg))

    async def send_raw(self, raw: str | bytes) -> None:
        assert self.ws is not None
        await self.ws.send(raw)

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
        """Send heartbeats every `every` seconds until closed, as gh-runner does: for a test that waits
        longer than the server's dead-peer bound for something to arrive (the test servers declare a
        runner silent for 3 s dead)."""
        async def beat() -> None:
            while True:
                await self.send(protocol.Heartbeat(at=now(), busy=0, slots=self.hello.slots))
                await asyncio.sleep(every)
        self._heartbeats = asyncio.create_task(beat())
        return self

    async def close(self) -> None:
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._heartbeats
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.ws.close(), 10)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader

    # -- attempt helpers ----------------------------------------------------------------------

    async def status(self, attempt_id: str, status: str, phase: str | None = None) -> None:
        await self.send(protocol.AttemptStatus(attempt_id=attempt_id, status=status,  # type: ignore[arg-type]
                                               phase=phase or status, at=now()))

    async def finish(self, attempt_id: str, outcome: str = "passed", error: str | None = None,
                     answer: str | None = "", check_after: str | None = "True") -> protocol.ResultAck:
        res = protocol.AttemptResult(
            attempt_id=attempt_id, outcome=outcome, error=error, answer=answer,  # type: ignore[arg-type]
            check_before=protocol.CheckOutput(exit_code=0, stdout_tail="False", verdict="False"),
            check_after=None if check_after is None else protocol.CheckOutput(
                exit_code=0, stdout_tail=check_after,
                verdict=check_after if check_after in ("True", "False") else None),
            metrics=protocol.AttemptMetrics(active_seconds=1.5, steps=2),
            started_at=now(), finished_at=now(),
        )
        await self.send(protocol.AttemptFinished(result=res))
        ack: protocol.ResultAck = await self.expect("result_ack", where=lambda m: m.attempt_id == attempt_id)
        return ack


def raw_json(obj: Any) -> str:
    return json.dumps(obj)
