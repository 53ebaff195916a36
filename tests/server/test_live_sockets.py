"""A live viewer's socket is bounded by its transport (gh_server/live/sockets.py): no per-message deflate,
which let a member send 2 MiB of KeyEvents as 3 KB, and a message bound far below uvicorn's 16 MiB, checked
as the frame's header arrives. The runners' sockets keep uvicorn's settings."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import shutil
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest
import uvicorn
from kit.net import free_port
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from websockets.protocol import Protocol

from gh_server.live.sockets import CLOSING_SLACK, MAX_MESSAGE, PARSE_STEP, LiveBoundedWebSockets
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


@contextlib.contextmanager
def viewer_route(endpoint: Callable[[WebSocket], Awaitable[None]]) -> Iterator[int]:
    """uvicorn with LiveBoundedWebSockets in a thread, `endpoint` at the viewer's path: its port."""
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
        yield port
    finally:
        srv.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def reader() -> Iterator[str]:
    """uvicorn with LiveBoundedWebSockets and one route at the viewer's path that reads until the end."""

    async def endpoint(ws: WebSocket) -> None:
        await ws.accept()
        while (await ws.receive())["type"] != "websocket.disconnect":
            pass

    with viewer_route(endpoint) as port:
        yield f"ws://127.0.0.1:{port}"


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


def _upgrade(sock: socket.socket, path: str) -> bytes:
    """A WebSocket handshake by hand on `sock`: what came after the server's 101 answer."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\n"
                 "Sec-WebSocket-Version: 13\r\n\r\n".encode())
    got = b""
    while b"\r\n\r\n" not in got:
        got += sock.recv(4096)
    head, _, rest = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101")
    return rest


def test_a_viewer_that_sends_on_after_its_view_ended_is_dropped_unread(server: str) -> None:
    """The server closes a view (here at once: an unknown ticket); the viewer reads the close frame and
    sends on without answering it. uvicorn alone read and parsed everything it sent for 10 s more."""
    port = int(server.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        rest = _upgrade(sock, "/v1/live/lv_unknown")
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


class Taker:
    """What the taker's route and the test tell each other."""

    def __init__(self) -> None:
        self.took_one = threading.Event()
        self.take_rest = threading.Event()


@pytest.fixture(scope="module")
def taker() -> Iterator[tuple[int, Taker]]:
    """uvicorn with LiveBoundedWebSockets and one route at the viewer's path that takes one message, waits
    until the test says, then takes the rest up to b"end" and answers how many it took and their sha256."""
    said = Taker()

    async def endpoint(ws: WebSocket) -> None:
        await ws.accept()
        first = await ws.receive()
        said.took_one.set()
        await asyncio.to_thread(said.take_rest.wait, 30)
        digest, n = hashlib.sha256(first["bytes"]), 1
        while (m := await ws.receive())["type"] != "websocket.disconnect" and m.get("bytes") != b"end":
            digest.update(m["bytes"])
            n += 1
        await ws.send_text(f"{n} {digest.hexdigest()}")
        await ws.close()

    with viewer_route(endpoint) as port:
        yield port, said


def _masked(payload: bytes) -> bytes:
    """A client's binary frame (masked with zeros: the bytes as they are), payload under 126 bytes."""
    return struct.pack(">BB", 0x82, 0x80 | len(payload)) + b"\x00" * 4 + payload


def test_a_viewers_bytes_are_parsed_a_step_at_a_time_as_they_are_taken(
        taker: tuple[int, Taker], monkeypatch: pytest.MonkeyPatch) -> None:
    """Its view open, a viewer sends 20,000 SetEncodings-sized messages at once. uvicorn parsed each read
    whole (256 KiB of 14-byte frames: 36 ms of the loop, all of it queued) before the route took the first;
    here the parser gets PARSE_STEP at a time, and nothing more while a message waits. When the route
    takes them all, every message arrives, in order."""
    port, said = taker
    fed: list[int] = []
    receive_data = Protocol.receive_data

    def recorded(self: Protocol, data: bytes) -> None:
        fed.append(len(data))
        receive_data(self, data)

    monkeypatch.setattr(Protocol, "receive_data", recorded)
    payloads = [struct.pack(">BxHI", 2, 1, i) for i in range(20_000)]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        rest = _upgrade(sock, "/v1/live/lv_x")
        handshake = len(fed)  # the request, as uvicorn gave it to the WebSocket protocol
        blob = b"".join(_masked(p) for p in payloads) + _masked(b"end")
        sender = threading.Thread(target=sock.sendall, args=(blob,), daemon=True)  # blocks while it is not read
        sender.start()
        assert said.took_one.wait(30), "the route got no message"
        frames = fed[handshake:]
        assert max(frames) <= PARSE_STEP, frames[:5]  # uvicorn gave the parser each read whole
        assert sum(frames) <= 2 * PARSE_STEP, f"{sum(frames)} bytes parsed for the first message"
        said.take_rest.set()
        while len(rest) < 2 or len(rest) < 2 + (rest[1] & 0x7F):
            rest += sock.recv(4096)
        assert rest[0] == 0x81  # the route's answer, a text frame
        n, digest = rest[2:2 + rest[1]].decode().split()
        sender.join(30)
    assert int(n) == len(payloads) and digest == hashlib.sha256(b"".join(payloads)).hexdigest()
