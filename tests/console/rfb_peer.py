"""The guest's end of an RFB 3.8 connection (security type None) behind a WebSocket route of the test's
gh-server, standing in for the live channel so that the console's own side of the live-view contract
(docs/console.md: the ticket's url, noVNC, read_only) is tested on its own: the handshake, a
solid-colour framebuffer, and a record of every message the viewer sent."""

from __future__ import annotations

import asyncio
import struct
import threading

from starlette.websockets import WebSocket, WebSocketDisconnect

WIDTH, HEIGHT = 64, 48
COLOUR = (200, 30, 40)  # red, green, blue
UPDATE_REQUEST, KEY_EVENT, POINTER_EVENT = 3, 4, 5
# The client's fixed-size messages by type: SetPixelFormat, FramebufferUpdateRequest, KeyEvent, PointerEvent.
FIXED = {0: 20, UPDATE_REQUEST: 10, KEY_EVENT: 8, POINTER_EVENT: 6}
PIXEL_FORMAT = ">BBBBHHHBBB3x"
SEND_TIMEOUT_S = 10.0


class RfbPeer:
    def __init__(self) -> None:
        self._buf = bytearray()
        self._stage = 0  # 0 version, 1 security choice, 2 client init, 3 messages
        self._pixel_format = b""
        self._messages: list[tuple[int, bytes]] = []
        self._lock = threading.Lock()  # the server's loop writes, the test thread reads
        self._ws: WebSocket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = threading.Event()  # the viewer went away

    def sent(self, kind: int) -> list[bytes]:
        """The viewer's messages of one type, in order."""
        with self._lock:
            return [m for t, m in self._messages if t == kind]

    async def serve(self, ws: WebSocket) -> None:
        offered = ws.scope.get("subprotocols") or []
        await ws.accept(subprotocol="binary" if "binary" in offered else None)
        self._ws, self._loop = ws, asyncio.get_running_loop()
        await ws.send_bytes(b"RFB 003.008\n")
        try:
            while True:
                msg = await ws.receive()
                if msg["type"] == "websocket.disconnect":
                    return
                data = msg.get("bytes") or (msg.get("text") or "").encode("latin-1")
                for out in self._feed(data):
                    await ws.send_bytes(out)
        except WebSocketDisconnect:
            return
        finally:
            self.closed.set()

    def push_frame(self) -> None:
        """Another frame, sent from the test's thread: the viewer answers it with its next
        FramebufferUpdateRequest, which on the ordered WebSocket comes after anything it sent before."""
        assert self._ws is not None and self._loop is not None and self._pixel_format
        asyncio.run_coroutine_threadsafe(self._ws.send_bytes(self._update()), self._loop).result(SEND_TIMEOUT_S)

    def hang_up(self) -> None:
        """The view ends from the machine's side (as the relay ends a holder's view at a dropped link)."""
        assert self._ws is not None and self._loop is not None
        asyncio.run_coroutine_threadsafe(self._ws.close(4010, "machine_gone"), self._loop).result(SEND_TIMEOUT_S)

    def _feed(self, data: bytes) -> list[bytes]:
        out: list[bytes] = []
        with self._lock:
            self._buf += data
            while (reply := self._step()) is not None:
                out += reply
        return out

    def _step(self) -> list[bytes] | None:
        """One step of the conversation on what is buffered: the replies, or None when more is needed."""
        b = self._buf
        if self._stage == 0 and len(b) >= 12:  # the viewer's version
            del b[:12]
            self._stage = 1
            return [bytes([1, 1])]  # one security type: None
        if self._stage == 1 and len(b) >= 1:
            del b[:1]
            self._stage = 2
            return [struct.pack(">I", 0)]  # SecurityResult: OK
        if self._stage == 2 and len(b) >= 1:  # ClientInit
            del b[:1]
            self._stage = 3
            name = b"console test"
            fmt = struct.pack(PIXEL_FORMAT, 32, 24, 0, 1, 255, 255, 255, 16, 8, 0)
            return [struct.pack(">HH", WIDTH, HEIGHT) + fmt + struct.pack(">I", len(name)) + name]
        if self._stage == 3 and b:
            return self._message()
        return None

    def _message(self) -> list[bytes] | None:
        b = self._buf
        kind = b[0]
        if kind in FIXED:
            size = FIXED[kind]
        elif kind == 2 and len(b) >= 4:  # SetEncodings
            size = 4 + 4 * struct.unpack(">H", b[2:4])[0]
        elif kind == 6 and len(b) >= 8:  # ClientCutText
            size = 8 + struct.unpack(">I", b[4:8])[0]
        else:
            return None
        if len(b) < size:
            return None
        msg = bytes(b[:size])
        del b[:size]
        first_request = kind == UPDATE_REQUEST and not any(t == UPDATE_REQUEST for t, _ in self._messages)
        self._messages.append((kind, msg))
        if kind == 0:
            self._pixel_format = msg[4:20]
        return [self._update()] if first_request else []

    def _update(self) -> bytes:
        """One raw rectangle over the whole screen in the pixel format the viewer asked for."""
        bpp, _depth, big_endian, _true, _rm, _gm, _bm, rs, gs, bs = struct.unpack(PIXEL_FORMAT, self._pixel_format)
        assert bpp == 32, f"this peer speaks 32-bit pixels only, the viewer asked for {bpp}"
        r, g, b = COLOUR
        pixel = struct.pack(">I" if big_endian else "<I", (r << rs) | (g << gs) | (b << bs))
        head = struct.pack(">BxH", 0, 1) + struct.pack(">HHHHi", 0, 0, WIDTH, HEIGHT, 0)
        return head + pixel * (WIDTH * HEIGHT)
