"""The viewer's half of RFB 3.8 (RFC 6143), parsed: what a browser may send a machine's display.

Pure (no I/O): `ClientStream.feed(bytes)` returns whole messages, each with its bytes, in order, and
keeps the rest until more arrives. The relay (gh_server/live/screen_relay.py) forwards a message's bytes
or drops them; nothing the viewer sends reaches the display unparsed, so a read-only viewer's
input is dropped here on the server, whatever the page does.

Accepted, in order: the ProtocolVersion ("RFB 003.008": the version QEMU offers), the security
type None (1), ClientInit (its shared flag always set to 1: a viewer
asking for the display alone would disconnect every other view of it), then messages
SetPixelFormat (0), SetEncodings (2), FramebufferUpdateRequest (3), KeyEvent (4), PointerEvent
(5), ClientCutText (6), EnableContinuousUpdates (150), ClientFence (248), SetDesktopSize (251)
and QEMU's extended key event (255, subtype 0): what noVNC sends QEMU. Anything else raises
`RfbError`, and the relay ends the view.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import Enum, StrEnum

VERSION = b"RFB 003.008\n"
SECURITY_NONE = 1
MAX_CUT_TEXT = 1024 * 1024  # a pasted text longer than this ends the view
MAX_FENCE_PAYLOAD = 64  # RFB's own bound
MAX_ENCODINGS = 1024
MAX_SCREENS = 16


class RfbError(Exception):
    """The viewer sent something that is not RFB as accepted here (the message says what)."""


class Kind(StrEnum):
    VERSION = "version"
    SECURITY = "security"
    CLIENT_INIT = "client_init"
    SET_PIXEL_FORMAT = "set_pixel_format"
    SET_ENCODINGS = "set_encodings"
    UPDATE_REQUEST = "framebuffer_update_request"
    KEY = "key_event"
    POINTER = "pointer_event"
    CUT_TEXT = "client_cut_text"
    CONTINUOUS_UPDATES = "enable_continuous_updates"
    FENCE = "client_fence"
    SET_DESKTOP_SIZE = "set_desktop_size"
    QEMU_KEY = "qemu_extended_key_event"


# What changes the machine rather than the view of it: dropped for a read-only viewer.
INPUT_KINDS = frozenset({Kind.KEY, Kind.POINTER, Kind.CUT_TEXT, Kind.QEMU_KEY, Kind.SET_DESKTOP_SIZE})
# What makes QEMU encode or send the display again for this client: a watcher's are paced
# (gh_server/live/screen_relay.py, WATCH_UPDATE_GAP_S), whatever their kind.
DISPLAY_WORK_KINDS = frozenset({Kind.SET_PIXEL_FORMAT, Kind.SET_ENCODINGS, Kind.UPDATE_REQUEST,
                                Kind.CONTINUOUS_UPDATES, Kind.SET_DESKTOP_SIZE})
# The fixed-size input messages a read-only stream drops in runs, without a Message each: type -> size.
_DROPPED_RUNS = {4: 8, 5: 6}


@dataclass(frozen=True)
class Message:
    kind: Kind
    data: bytes  # exactly the bytes to forward
    key_down: bool = False  # KEY / QEMU_KEY: a press (not a release)


class _Phase(Enum):
    VERSION = 1
    SECURITY = 2
    CLIENT_INIT = 3
    MESSAGES = 4


class ClientStream:
    """Splits the viewer's byte stream into messages. After an `RfbError` the stream is unusable.

    A read-only stream (`drop_input`) cuts runs of key and pointer events out of its buffer in one go and
    counts them in `dropped`: they never become messages. Its other input still does (the relay drops it).
    """

    def __init__(self, max_cut_text: int = MAX_CUT_TEXT, drop_input: bool = False) -> None:
        self._buf = bytearray()
        self._phase = _Phase.VERSION
        self._max_cut_text = max_cut_text
        self._drop_input = drop_input
        self.dropped = 0

    def feed(self, data: bytes) -> list[Message]:
        """The whole messages `data` completes, in order.

        Raises:
            RfbError: the stream is not RFB as accepted here.
        """
        self._buf += data
        out: list[Message] = []
        while True:
            if self._drop_input and self._phase is _Phase.MESSAGES:
                self._drop_runs()
            msg = self._next()
            if msg is None:
                return out
            out.append(msg)

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def _drop_runs(self) -> None:
        buf, at, n, dropped = self._buf, 0, len(self._buf), 0
        while at < n and (size := _DROPPED_RUNS.get(buf[at])) is not None and at + size <= n:
            at += size
            dropped += 1
        if at:
            del buf[:at]
            self.dropped += dropped

    def _take(self, n: int) -> bytes:
        chunk = bytes(self._buf[:n])
        del self._buf[:n]
        return chunk

    def _next(self) -> Message | None:
        buf = self._buf
        if self._phase is _Phase.VERSION:
            if len(buf) < 12:
                if not b"RFB 003.00".startswith(bytes(buf[:10])):
                    raise RfbError("not an RFB ProtocolVersion")
                return None
            version = self._take(12)
            if version != VERSION:
                raise RfbError(f"RFB version {version[:11]!r} is not 3.8")
            self._phase = _Phase.SECURITY
            return Message(Kind.VERSION, version)
        if self._phase is _Phase.SECURITY:
            if not buf:
                return None
            if buf[0] != SECURITY_NONE:
                raise RfbError(f"security type {buf[0]} is not None (1)")
            self._phase = _Phase.CLIENT_INIT
            return Message(Kind.SECURITY, self._take(1))
        if self._phase is _Phase.CLIENT_INIT:
            if not buf:
                return None
            self._take(1)
            self._phase = _Phase.MESSAGES
            return Message(Kind.CLIENT_INIT, b"\x01")  # shared, always
        return self._message()

    def _need(self, n: int) -> bool:
        return len(self._buf) >= n

    def _message(self) -> Message | None:
        buf = self._buf
        if not buf:
            return None
        mtype = buf[0]
        if mtype == 0:
            return Message(Kind.SET_PIXEL_FORMAT, self._take(20)) if self._need(20) else None
        if mtype == 2:
            if not self._need(4):
                return None
            (count,) = struct.unpack_from(">H", buf, 2)
            if count > MAX_ENCODINGS:
                raise RfbError(f"SetEncodings with {count} encodings")
            size = 4 + 4 * count
            return Message(Kind.SET_ENCODINGS, self._take(size)) if self._need(size) else None
        if mtype == 3:
            return Message(Kind.UPDATE_REQUEST, self._take(10)) if self._need(10) else None
        if mtype == 4:
            if not self._need(8):
                return None
            data = self._take(8)
            return Message(Kind.KEY, data, key_down=data[1] != 0)
        if mtype == 5:
            return Message(Kind.POINTER, self._take(6)) if self._need(6) else None
        if mtype == 6:
            if not self._need(8):
                return None
            (length,) = struct.unpack_from(">i", buf, 4)
            size = abs(length)  # negative: the extended clipboard's form, the same bytes follow
            if size > self._max_cut_text:
                raise RfbError(f"ClientCutText of {size} bytes is over the {self._max_cut_text} byte limit")
            return Message(Kind.CUT_TEXT, self._take(8 + size)) if self._need(8 + size) else None
        if mtype == 150:
            return Message(Kind.CONTINUOUS_UPDATES, self._take(10)) if self._need(10) else None
        if mtype == 248:
            if not self._need(9):
                return None
            length = buf[8]
            if length > MAX_FENCE_PAYLOAD:
                raise RfbError(f"ClientFence payload of {length} bytes")
            return Message(Kind.FENCE, self._take(9 + length)) if self._need(9 + length) else None
        if mtype == 251:
            if not self._need(8):
                return None
            screens = buf[6]
            if screens > MAX_SCREENS:
                raise RfbError(f"SetDesktopSize with {screens} screens")
            size = 8 + 16 * screens
            return Message(Kind.SET_DESKTOP_SIZE, self._take(size)) if self._need(size) else None
        if mtype == 255:
            if not self._need(2):
                return None
            if buf[1] != 0:
                raise RfbError(f"QEMU client message subtype {buf[1]} is not accepted")
            if not self._need(12):
                return None
            data = self._take(12)
            (down,) = struct.unpack_from(">H", data, 2)
            return Message(Kind.QEMU_KEY, data, key_down=down != 0)
        raise RfbError(f"RFB client message type {mtype} is not accepted")


__all__ = ["DISPLAY_WORK_KINDS", "INPUT_KINDS", "ClientStream", "Kind", "Message", "RfbError"]
