"""A live viewer's socket is bounded by its transport (gh_server/live/sockets.py): no per-message deflate,
which let a member send 2 MiB of KeyEvents as 3 KB, and a message bound far below uvicorn's 16 MiB, checked
as the frame's header arrives. The runners' sockets keep uvicorn's settings."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from kit.net import free_port
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gh_server.live.sockets import CLOSING_SLACK, MAX_MESSAGE, LiveBoundedWebSockets
from gh_wire import protocol
from gh_wire.vocab import ViewEndReason

from .conftest import RunningServer, make_settings


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """gh-server with its runner gateway (the live routes come with it), and no runner: its ws:// base."""
    settings, data_dir = make_settings(None, gateway=True)
    running = RunningServer(settings)
    running.start()
    try:
        yield f"ws://127.0.0.1:{settings.port}"
    finally:
        running.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


async def test_a_viewers_socket_refuses_deflate_and_a_runners_keeps_it(server: str) -> None:
    async with connect(server + "/v1/live/lv_unknown", compression="deflate", open_timeout=10) as ws:
        assert ws.response is not None and "Sec-WebSocket-Extensions" not in ws.response.headers
        with pytest.raises(ConnectionClosed):
            async with asyncio.timeout(10):
                await ws.recv()
    assert ws.close_code == protocol.CLOSE_VIEW_ENDED and ws.close_reason == ViewEndReason.TICKET_INVALID
    async with connect(server + protocol.VIEW_PATH.format(view_id="v1"), compression="deflate",
                       open_timeout=10) as ws:
        assert ws.response is not None
        assert "permessage-deflate" in ws.response.headers.get("Sec-WebSocket-Extensions", "")


@pytest.fixture(scope="module")
def reader() -> Iterator[str]:
    """uvicorn with LiveBoundedWebSockets and one route at the viewer's path that reads until the end."""

    async def endpoint(ws: WebSocket) -> None:
        await ws.accept()
        while (await ws.receive())["type"] != "websocket.disconnect":
            pass

    app = Starlette(routes=[WebSocketRoute("/v1/live/{ticket}", endpoint)])
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                        ws=LiveBoundedWebSockets))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"ws://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=30)


async def test_a_viewers_message_over_the_bound_closes_its_socket_1009(reader: str) -> None:
    async with connect(reader + "/v1/live/lv_x", max_size=None, open_timeout=10) as ws:
        await ws.send(b"\x04\x01\x00\x00\x00\x00\x00\x61" * (MAX_MESSAGE // 8))  # at the bound: taken
        await ws.send(b"\x04\x01\x00\x00\x00\x00\x00\x61" * (2 * 1024 * 1024 // 8))
        with pytest.raises(ConnectionClosed):
            async with asyncio.timeout(10):
                await ws.recv()
    assert ws.close_code == 1009  # message too big


def _tcp_max(name: str) -> int:
    return int(open(f"/proc/sys/net/ipv4/{name}").read().split()[2])


def test_a_viewer_that_sends_on_after_its_view_ended_is_dropped_unread(server: str) -> None:
    """The server closes a view (here at once: an unknown ticket); the viewer reads the close frame and
    sends on without answering it. uvicorn alone read and parsed everything it sent for 10 s more."""
    port = int(server.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /v1/live/lv_unknown HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Key: " + base64.b64encode(os.urandom(16)) +
                     b"\r\nSec-WebSocket-Version: 13\r\n\r\n")
        got = b""
        while b"\r\n\r\n" not in got:
            got += sock.recv(4096)
        head, _, rest = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101")
        while len(rest) < 2 or len(rest) < 2 + (rest[1] & 0x7F):
            rest += sock.recv(4096)
        assert rest[0] == 0x88  # the server's close frame: the view ended
        assert struct.unpack(">H", rest[2:4])[0] == protocol.CLOSE_VIEW_ENDED
        assert rest[4:2 + rest[1]].decode() == ViewEndReason.TICKET_INVALID

        payload = 60 * 1024  # under MAX_MESSAGE: each frame is one the view would have taken
        frame = struct.pack(">BBH", 0x82, 0x80 | 126, payload) + b"\x00" * 4 + b"\x04" * payload
        # Past what the kernel holds between the two sockets, every byte sent was read by the server.
        held = _tcp_max("tcp_rmem") + _tcp_max("tcp_wmem") + CLOSING_SLACK + 256 * 1024
        sent, dropped = 0, False
        sock.settimeout(5)
        while sent < 4 * held:
            try:
                sock.sendall(frame)
            except (ConnectionResetError, BrokenPipeError):
                dropped = True
                break
            except TimeoutError:
                break  # no longer read, and not dropped
            sent += len(frame)
        assert dropped, f"sent {sent / 2**20:.1f} MiB after the close and the socket was not dropped"
        assert sent <= held
