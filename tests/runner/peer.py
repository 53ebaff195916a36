"""A test peer: a small websocket server speaking the server side of `gh_wire.protocol`.

Real websockets, real frames, the shared protocol module; the behaviour a test needs is switched
on by attributes (silent, auto_ack, close code on connect, HTTP status, resume list). Every
message the runner sends is recorded with the number of the connection it came on, and tests wait
for what they expect with `wait_for` (an event per message, with a deadline), never a sleep.

Results are applied the way the control plane must: once per attempt id (`applied`), however many
copies arrive (`result_copies`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from gh_wire.protocol import (
    MAX_FRAME_BYTES,
    AttemptFinished,
    AttemptResult,
    FrozenCase,
    Heartbeat,
    Hello,
    Lease,
    ProtocolError,
    ResultAck,
    StartStateRef,
    Welcome,
    encode,
    parse_runner_message,
)

WAIT = 30.0  # generous: this machine is shared and loaded


@dataclass
class Received:
    conn: int
    msg: Any
    at: float


@dataclass
class Peer:
    heartbeat_interval: float = 0.2
    dead_after: float = 2.0
    token: str = "gh_rn_testtoken_0123456789"
    auto_ack: bool = True
    silent: bool = False  # stop sending anything (heartbeats included) once welcomed
    close_on_connect: int | None = None  # accept, then close with this code
    http_status: int | None = None  # refuse the handshake with this HTTP status
    name: str | None = None  # the registered name the welcome tells the runner
    resume: Callable[[Hello], list[str]] | None = None  # default: resume everything the runner has
    on_message: Callable[[Any], Awaitable[None]] | None = None  # reacts to each runner message (bench)
    record: bool = True  # keep every message (tests); a long bench keeps only heartbeats
    status_acks: bool = False  # say so in the welcome when the runner's hello asks for them
    not_here_refusals: bool = False  # the welcome says the server reads `attempt_not_here`
    received: list[Received] = field(default_factory=list)
    errors_from_runner: list[Any] = field(default_factory=list)
    applied: dict[str, AttemptResult] = field(default_factory=dict)
    result_copies: dict[str, int] = field(default_factory=dict)
    connections: int = 0
    handshakes: int = 0
    auth_headers: list[str | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._server: Server | None = None
        self._conn: ServerConnection | None = None
        self._event = asyncio.Event()
        self.port = 0

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self, port: int = 0) -> str:
        self._server = await serve(self._handle, "127.0.0.1", port, process_request=self._process_request,
                                   ping_interval=None, max_size=MAX_FRAME_BYTES, close_timeout=1)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.url

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/runners/connect"

    async def stop(self) -> None:
        """Shut the server down (the runner sees the connection close)."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 10)
            self._server = None

    def kill(self) -> None:
        """Die without a closing handshake: drop the TCP connection and stop listening."""
        if self._conn is not None:
            self._conn.transport.abort()
        if self._server is not None:
            self._server.close(close_connections=False)
            self._server = None

    async def close_current(self, code: int = 1000, reason: str = "") -> None:
        if self._conn is not None:
            await self._conn.close(code, reason)

    # -- talking -------------------------------------------------------------------------------

    async def send(self, msg: Any) -> None:
        assert self._conn is not None, "no runner connected"
        await self._conn.send(encode(msg))

    async def send_raw(self, frame: str | bytes) -> None:
        assert self._conn is not None, "no runner connected"
        await self._conn.send(frame)

    async def wait_for(self, pred: Callable[[Received], bool], timeout: float = WAIT, start: int = 0) -> Received:
        """The first message from index `start` on that matches, waiting up to `timeout` seconds."""
        deadline = time.monotonic() + timeout
        i = start
        while True:
            while i < len(self.received):
                if pred(self.received[i]):
                    return self.received[i]
                i += 1
            left = deadline - time.monotonic()
            if left <= 0:
                kinds = [type(r.msg).__name__ for r in self.received[-20:]]
                raise AssertionError(f"timed out waiting for a message; last received: {kinds}")
            self._event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout=min(left, 0.5))

    async def wait_type(self, mtype: str, timeout: float = WAIT, start: int = 0,
                        where: Callable[[Any], bool] = lambda m: True) -> Any:
        r = await self.wait_for(lambda r: getattr(r.msg, "type", None) == mtype and where(r.msg), timeout, start)
        return r.msg

    async def wait_until(self, cond: Callable[[], bool], timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("timed out waiting for a condition")
            self._event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout=min(left, 0.5))

    def of_type(self, mtype: str) -> list[Any]:
        return [r.msg for r in self.received if getattr(r.msg, "type", None) == mtype]

    # -- server side ---------------------------------------------------------------------------

    def _process_request(self, conn: ServerConnection, request: Request) -> Response | None:
        self.handshakes += 1
        self.auth_headers.append(request.headers.get("Authorization"))
        if self.http_status is not None:
            return Response(self.http_status, "refused", Headers(), b"token refused\n")
        return None

    async def _handle(self, conn: ServerConnection) -> None:
        self.connections += 1
        n = self.connections
        self._conn = conn
        hb: asyncio.Task[None] | None = None
        try:
            if self.close_on_connect is not None:
                await conn.close(self.close_on_connect, "test close")
                return
            async for raw in conn:
                try:
                    msg = parse_runner_message(raw)
                except ProtocolError as e:
                    self.errors_from_runner.append(e)
                    continue
                if self.record or isinstance(msg, Heartbeat | Hello):
                    self.received.append(Received(n, msg, time.monotonic()))
                    self._event.set()
                if isinstance(msg, Hello):
                    resume = self.resume(msg) if self.resume else list(msg.in_flight)
                    await conn.send(encode(Welcome(runner_id="rn_test", heartbeat_interval=self.heartbeat_interval,
                                                   dead_after=self.dead_after, resume=resume,
                                                   name=self.name,
                                                   status_acks=self.status_acks and msg.status_acks,
                                                   not_here_refusals=self.not_here_refusals)))
                    hb = asyncio.create_task(self._heartbeats(conn))
                elif isinstance(msg, AttemptFinished):
                    aid = msg.result.attempt_id
                    self.result_copies[aid] = self.result_copies.get(aid, 0) + 1
                    self.applied.setdefault(aid, msg.result)  # idempotent by attempt id
                    if self.auto_ack:
                        await conn.send(encode(ResultAck(attempt_id=aid)))
                if self.on_message is not None:
                    await self.on_message(msg)
        except ConnectionClosed:
            pass
        finally:
            if hb is not None:
                hb.cancel()
            if self._conn is conn:
                self._conn = None
            self._event.set()

    async def _heartbeats(self, conn: ServerConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                if not self.silent:
                    await conn.send(encode(Heartbeat(at=datetime.now(UTC))))
                await asyncio.sleep(self.heartbeat_interval)


def make_lease(attempt_id: str, image: str = "linux-tiny", **case: Any) -> Lease:
    fields: dict[str, Any] = {"test_case_id": "tc_1", "name": "case one", "prompt": "fix it",
                              "setup_script": "true", "check_script": 'echo "$GH_EXPECT"'}
    fields.update(case)
    return Lease(attempt_id=attempt_id, agent_id="ag_noop", case=FrozenCase(**fields),
                 start_state=StartStateRef(kind="image", image=image))
