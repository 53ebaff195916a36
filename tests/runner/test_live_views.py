"""gh_runner/live_views.py against a websocket server of the test's and a display that is a local socket."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve

from gh_runner.live_views import DRIVER_SEATS, MAX_VIEWS_PER_MACHINE, LiveViews
from gh_wire.protocol import CLOSE_VIEW_ENDED, ViewOpen, ViewRefused
from gh_wire.vocab import ViewEndReason
from providers.errors import NoScreenStream

pytestmark = pytest.mark.asyncio

TOKEN = "gh_rn_test"


class Display:
    """A display server on a local socket: says the RFB banner, echoes what it gets upper-cased."""

    def __init__(self) -> None:
        self.clients: list[asyncio.StreamWriter] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.clients.append(writer)
        writer.write(b"RFB 003.008\n")
        while data := await reader.read(1024):
            writer.write(data.upper())

    def stop_all(self) -> None:
        for w in self.clients:
            w.close()


class FakeMachine:
    machine_id = "m1"

    def __init__(self, port: int | None) -> None:
        self.port = port

    async def open_screen_stream(self, timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.port is None:
            raise NoScreenStream("no display")
        return await asyncio.open_connection("127.0.0.1", self.port)


class Server:
    """The server's side of view sockets: each one's bytes, and how it was closed."""

    def __init__(self) -> None:
        self.sockets: asyncio.Queue[ServerConnection] = asyncio.Queue()
        self.paths: list[str] = []
        self.auth: list[str | None] = []

    async def handler(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        self.paths.append(ws.request.path)
        self.auth.append(ws.request.headers.get("Authorization"))
        await self.sockets.put(ws)
        await ws.wait_closed()


@pytest.fixture
async def env() -> AsyncIterator[dict[str, Any]]:
    display = Display()
    dsrv = await asyncio.start_server(display.serve, "127.0.0.1", 0)
    server = Server()
    async with serve(server.handler, "127.0.0.1", 0) as wsrv:
        port = wsrv.sockets[0].getsockname()[1]
        sent: asyncio.Queue[Any] = asyncio.Queue()

        async def send(msg: Any) -> bool:
            sent.put_nowait(msg)
            return True

        machines: dict[str, FakeMachine] = {"ss_ok": FakeMachine(dsrv.sockets[0].getsockname()[1]),
                                            "ss_blind": FakeMachine(None)}

        async def machine_for(msg: ViewOpen, timeout: float) -> Any:
            return machines.get(msg.start_state_id or "")

        views = LiveViews(machine_for, lambda: f"ws://127.0.0.1:{port}/v1/runners/connect", TOKEN, send,
                          max_per_machine=1)
        # An attempt's machine, and its replay's masked event (gh_runner/replay.py).
        masked = asyncio.Event()

        async def attempt_machine(msg: ViewOpen, timeout: float) -> Any:
            return machines["ss_ok"] if msg.attempt_id == "at_w" else None

        watched = LiveViews(attempt_machine, lambda: f"ws://127.0.0.1:{port}/v1/runners/connect", TOKEN, send,
                            masked_of=lambda aid: masked if aid == "at_w" else None)
        try:
            yield {"views": views, "server": server, "sent": sent, "display": display, "watched": watched,
                   "masked": masked}
        finally:
            await views.close_all()
            await watched.close_all()
            display.stop_all()
            dsrv.close()
            await dsrv.wait_closed()


async def refusal(sent: asyncio.Queue[Any]) -> ViewRefused:
    async with asyncio.timeout(10):
        msg = await sent.get()
    assert isinstance(msg, ViewRefused)
    return msg


async def test_bytes_flow_both_ways_on_a_socket_of_its_own(env: dict[str, Any]) -> None:
    env["views"].open(ViewOpen(view_id="view0001", start_state_id="ss_ok"))
    async with asyncio.timeout(10):
        ws = await env["server"].sockets.get()
        assert await ws.recv() == b"RFB 003.008\n"
        await ws.send(b"hello")
        assert await ws.recv() == b"HELLO"
    assert env["server"].paths == ["/v1/runners/views/view0001"]
    assert env["server"].auth == [f"Bearer {TOKEN}"]
    assert env["sent"].empty()  # nothing on the control connection


async def test_the_machine_going_ends_the_view_with_the_reason(env: dict[str, Any]) -> None:
    env["views"].open(ViewOpen(view_id="view0002", start_state_id="ss_ok"))
    async with asyncio.timeout(10):
        ws = await env["server"].sockets.get()
        await ws.recv()
        task = env["views"].views["view0002"].task
        env["display"].stop_all()
        await ws.wait_closed()
    assert (ws.close_code, ws.close_reason) == (CLOSE_VIEW_ENDED, ViewEndReason.MACHINE_GONE.value)
    async with asyncio.timeout(10):
        await task  # it ends just after the close it sent
    assert env["views"].views == {}


async def test_no_machine_and_no_display_are_refused_on_the_control_connection(env: dict[str, Any]) -> None:
    env["views"].open(ViewOpen(view_id="view0003", start_state_id="ss_gone"))
    assert (await refusal(env["sent"])).reason is ViewEndReason.NO_MACHINE
    env["views"].open(ViewOpen(view_id="view0004", start_state_id="ss_blind"))
    assert (await refusal(env["sent"])).reason is ViewEndReason.NO_SCREEN


async def test_views_per_machine_are_bounded(env: dict[str, Any]) -> None:
    env["views"].open(ViewOpen(view_id="view0005", start_state_id="ss_ok"))
    async with asyncio.timeout(10):
        await env["server"].sockets.get()
    env["views"].open(ViewOpen(view_id="view0006", start_state_id="ss_ok"))
    assert (await refusal(env["sent"])).reason is ViewEndReason.TOO_MANY_VIEWS


async def test_close_all_ends_every_view(env: dict[str, Any]) -> None:
    env["views"].open(ViewOpen(view_id="view0007", start_state_id="ss_ok"))
    async with asyncio.timeout(10):
        ws = await env["server"].sockets.get()
        assert await ws.recv() == b"RFB 003.008\n"  # piping
        await env["views"].close_all()
        with contextlib.suppress(Exception):
            await ws.wait_closed()
    assert (ws.close_code, ws.close_reason) == (CLOSE_VIEW_ENDED, ViewEndReason.CLOSED.value)


async def test_a_secret_typed_ends_the_watchers_views_and_refuses_new_ones(env: dict[str, Any]) -> None:
    """A watcher's view (watch_only) ends with `masked` once the attempt's replay masks; a view that is not
    watch-only (the person holding a takeover) goes on; a new watcher is refused with `masked`."""
    watched: LiveViews = env["watched"]
    watched.open(ViewOpen(view_id="watch001", attempt_id="at_w", watch_only=True))
    watched.open(ViewOpen(view_id="holder01", attempt_id="at_w"))
    async with asyncio.timeout(10):
        first, second = await env["server"].sockets.get(), await env["server"].sockets.get()
        by_path = {ws.request.path: ws for ws in (first, second) if ws.request is not None}
        watcher, holder = by_path["/v1/runners/views/watch001"], by_path["/v1/runners/views/holder01"]
        assert await watcher.recv() == b"RFB 003.008\n" and await holder.recv() == b"RFB 003.008\n"
        env["masked"].set()
        await watcher.wait_closed()
    assert (watcher.close_code, watcher.close_reason) == (CLOSE_VIEW_ENDED, ViewEndReason.MASKED.value)
    async with asyncio.timeout(10):
        await holder.send(b"still here")
        assert await holder.recv() == b"STILL HERE"
    watched.open(ViewOpen(view_id="watch002", attempt_id="at_w", watch_only=True))
    refused = await refusal(env["sent"])
    assert (refused.view_id, refused.reason) == ("watch002", ViewEndReason.MASKED)
    assert env["server"].paths.count("/v1/runners/views/watch002") == 0


async def test_twelve_watchers_leave_the_driver_its_seat(env: dict[str, Any]) -> None:
    """The issue's attack: 12 idle member watchers of one machine shut the admin's takeover view out with
    `too_many_views`. Watchers now take at most MAX_VIEWS_PER_MACHINE - DRIVER_SEATS; the holder's view opens."""
    watched: LiveViews = env["watched"]
    for n in range(MAX_VIEWS_PER_MACHINE):
        watched.open(ViewOpen(view_id=f"watch{n:03d}", attempt_id="at_w", watch_only=True))
    seated = MAX_VIEWS_PER_MACHINE - DRIVER_SEATS
    async with asyncio.timeout(20):
        for _ in range(seated):
            await env["server"].sockets.get()
        refused = [await refusal(env["sent"]) for _ in range(DRIVER_SEATS)]
    assert {r.reason for r in refused} == {ViewEndReason.TOO_MANY_VIEWS}
    watched.open(ViewOpen(view_id="holder01", attempt_id="at_w"))
    async with asyncio.timeout(10):
        holder = await env["server"].sockets.get()
        assert holder.request is not None and holder.request.path == "/v1/runners/views/holder01"
        assert await holder.recv() == b"RFB 003.008\n"
    assert env["sent"].empty()
