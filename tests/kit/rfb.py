"""A small RFB 3.8 viewer over a WebSocket, as noVNC is one, for the live-view tests and bench/live_view.py.

Sync (websockets' sync client), raw encoding at 32 bits per pixel, DesktopSize understood. It keeps the
framebuffer so a caller can see pixels change. Not a product: it knows what QEMU's VNC server sends.
"""

from __future__ import annotations

import contextlib
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

RETURN = 0xFF0D
RAW, DESKTOP_SIZE = 0, -223


class Closed(Exception):
    """The server closed the view; `code` and `reason` say how."""

    def __init__(self, code: int | None, reason: str) -> None:
        super().__init__(f"closed ({code}): {reason}")
        self.code = code
        self.reason = reason


def keysym(ch: str) -> int:
    """The X keysym of a printable ASCII character (Latin-1 keysyms are the code points)."""
    if len(ch) != 1 or not 0x20 <= ord(ch) < 0x7F:
        raise ValueError(f"no keysym here for {ch!r}")
    return ord(ch)


class Viewer:
    def __init__(self, url: str, *, origin: str | None = None, max_queue: int | None = 16,
                 deflate: bool = False) -> None:
        """`deflate`: offer permessage-deflate as browsers do (off by default: a test that fills buffers
        wants the bytes it asks for on the wire)."""
        headers = {"Origin": origin} if origin else None
        self.ws: ClientConnection = connect(url, subprotocols=["binary"], additional_headers=headers,  # type: ignore[list-item]
                                            max_size=None, max_queue=max_queue, open_timeout=30, close_timeout=2,
                                            ping_interval=None,
                                            compression="deflate" if deflate else None)
        self._buf = bytearray()
        self.width = self.height = 0
        self.fb = bytearray()
        self.received = 0  # bytes from the server
        self.updates = 0  # framebuffer updates read

    # -- bytes ---------------------------------------------------------------------------------

    def _fill(self, n: int, deadline: float) -> None:
        while len(self._buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"wanted {n} bytes, have {len(self._buf)}")
            try:
                data = self.ws.recv(timeout=left)
            except ConnectionClosed as e:
                rcvd = e.rcvd
                raise Closed(rcvd.code if rcvd else None, rcvd.reason if rcvd else "") from None
            if isinstance(data, str):
                raise AssertionError("a text frame on an RFB view")
            self.received += len(data)
            self._buf += data

    def read(self, n: int, timeout: float = 30.0) -> bytes:
        self._fill(n, time.monotonic() + timeout)
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def send(self, data: bytes) -> None:
        self.ws.send(data)

    # -- RFB -----------------------------------------------------------------------------------

    def handshake(self, timeout: float = 150.0) -> tuple[int, int]:
        """Version, security None, ClientInit (shared), ServerInit; then 32 bpp raw. The screen's size."""
        version = self.read(12, timeout)  # the first bytes wait for a machine still being made
        timeout = 30.0
        assert version == b"RFB 003.008\n", version
        self.send(version)
        n = self.read(1, timeout)[0]
        types = self.read(n, timeout)
        assert 1 in types, types
        self.send(b"\x01")
        (result,) = struct.unpack(">I", self.read(4, timeout))
        assert result == 0, result
        self.send(b"\x01")
        w, h = struct.unpack(">HH", self.read(4, timeout))
        self.read(16, timeout)  # the server's pixel format; ours is set next
        (name_len,) = struct.unpack(">I", self.read(4, timeout))
        self.read(name_len, timeout)
        self._resize(w, h)
        self.send(b"\x00\x00\x00\x00" + struct.pack(">BBBBHHHBBB3x", 32, 24, 0, 1, 255, 255, 255, 16, 8, 0))
        self.send(struct.pack(">BxH", 2, 2) + struct.pack(">ii", RAW, DESKTOP_SIZE))
        return w, h

    def _resize(self, w: int, h: int) -> None:
        self.width, self.height = w, h
        self.fb = bytearray(w * h * 4)

    def request(self, incremental: bool = True) -> None:
        self.send(struct.pack(">BBHHHH", 3, int(incremental), 0, 0, self.width, self.height))

    def key(self, sym: int, down: bool) -> None:
        self.send(struct.pack(">BBxxI", 4, int(down), sym))

    def press(self, sym: int) -> None:
        self.key(sym, True)
        self.key(sym, False)

    def type(self, text: str, enter: bool = True) -> None:
        for ch in text:
            self.press(keysym(ch))
        if enter:
            self.press(RETURN)

    def pointer(self, x: int, y: int, buttons: int = 0) -> None:
        self.send(struct.pack(">BBHH", 5, buttons, x, y))

    def read_message(self, timeout: float = 30.0) -> str:
        """Read one server message (applying an update to `fb`); its name."""
        deadline = time.monotonic() + timeout
        mtype = self.read(1, timeout)[0]
        left = lambda: max(0.01, deadline - time.monotonic())  # noqa: E731
        if mtype == 0:
            (n,) = struct.unpack(">xH", self.read(3, left()))
            for _ in range(n):
                x, y, w, h, enc = struct.unpack(">HHHHi", self.read(12, left()))
                if enc == RAW:
                    data = self.read(w * h * 4, left())
                    for row in range(h):
                        at = ((y + row) * self.width + x) * 4
                        self.fb[at:at + w * 4] = data[row * w * 4:(row + 1) * w * 4]
                elif enc == DESKTOP_SIZE:
                    self._resize(w, h)
                else:
                    raise AssertionError(f"encoding {enc} was not asked for")
            self.updates += 1
            return "update"
        if mtype == 1:
            _, _, n = struct.unpack(">xHH", self.read(5, left()))
            self.read(6 * n, left())
            return "colour_map"
        if mtype == 2:
            return "bell"
        if mtype == 3:
            (n,) = struct.unpack(">3xI", self.read(7, left()))
            self.read(n, left())
            return "cut_text"
        raise AssertionError(f"server message type {mtype}")

    def update(self, incremental: bool = True, timeout: float = 30.0) -> None:
        """Ask for an update and read messages until one arrives."""
        self.request(incremental)
        deadline = time.monotonic() + timeout
        while self.read_message(max(0.01, deadline - time.monotonic())) != "update":
            pass

    def close_reason(self, timeout: float = 60.0) -> Closed:
        """Read (and drop) whatever is left until the server's close; its code and reason."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.read(len(self._buf) + 1, max(0.01, deadline - time.monotonic()))
            except Closed as c:
                return c

    def close(self) -> None:
        self.ws.close()

    def __enter__(self) -> Viewer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@contextlib.contextmanager
def stalled_viewer(url: str) -> Iterator[Viewer]:
    """A viewer that keeps asking for full frames and never reads them, for the block (the relay must drop it
    with `viewer_too_slow`, and nobody else may notice)."""
    v = Viewer(url, max_queue=1)
    v.handshake()
    stop = threading.Event()

    def ask_and_never_read() -> None:
        while not stop.is_set():
            try:
                v.request(incremental=False)
            except Exception:
                return
            stop.wait(0.05)

    asker = threading.Thread(target=ask_and_never_read, daemon=True)
    asker.start()
    try:
        yield v
    finally:
        stop.set()
        asker.join(10)
        v.close()
