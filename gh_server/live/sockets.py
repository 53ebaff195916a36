"""uvicorn's WebSocket protocol with a live viewer's bounds at the transport (docs/security.md, "Live views").

uvicorn negotiates per-message deflate and sets the largest message (`ws_max_size`, 16 MiB by default)
once for every WebSocket, in the protocol, before the app sees the path: ASGI has no way for a route
to refuse an extension. Deflate lets a viewer send 2 MiB of RFB messages as 3 KB; 16 MiB is what one
unread message may cost. So for the viewer's path (gh_server/live/screen_relay.py, VIEWER_PATH) this
protocol refuses the extension and bounds a message to MAX_MESSAGE before the handshake is answered.
The runners' sockets keep uvicorn's settings (their JSON frames carry screenshots and script output).

uvicorn's sans-I/O protocol pauses reading after each message until the app takes it, but it parses the
whole of each read first: 256 KiB from the kernel at once, which as 18-byte frames (SetEncodings, say) is
14,563 messages parsed and queued in one callback, 36 ms of the server's one loop, before the relay has
taken the first. So a viewer's bytes go to the parser PARSE_STEP at a time, and only while no message of
it waits for the relay: what it sent beyond stays unparsed, its socket unread, until the relay takes what
was parsed. A viewer the relay is not reading yet (its view still opening on the runner) costs one step.

Once the server has closed a viewer's socket (its view ended), uvicorn reads on until the viewer's close
reply, for up to 10 s, parsing every frame before it. A viewer that reads answers at once, its reply a few
bytes behind what it had in flight; one that sends without reading has megabytes queued in the kernel
ahead of any reply, and sends on meanwhile: all of it was read and parsed on the server's one loop after its
view had ended, outside every bound of the view. So past CLOSING_SLACK bytes after the close, the socket is
dropped unread.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

LIVE_PREFIX = "/v1/live/"  # VIEWER_PATH's fixed part
# noVNC sends at most 10 KiB per WebSocket message (core/websock.js, _sQbufferSize); slack for others.
MAX_MESSAGE = 64 * 1024
# What a viewer may still send once its socket is closed: one message it had in flight and its close reply.
CLOSING_SLACK = MAX_MESSAGE + 1024
# How much of a viewer's bytes the parser takes at once: 227 frames of 18 bytes, about half a millisecond.
PARSE_STEP = 4096


class LiveBoundedWebSockets(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol; a live viewer's socket gets no deflate and MAX_MESSAGE, its
    bytes parsed PARSE_STEP at a time as the relay takes its messages, and is dropped unread when it sends
    more than CLOSING_SLACK after the server closed it."""

    live = False
    connected = False  # its handshake request is parsed: from here on, a socket that is not live is uvicorn's
    after_close = 0  # bytes received since the server's close frame
    unparsed: bytearray  # read from the socket, not given to the parser yet (a live viewer's, or before the request)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unparsed = bytearray()  # deleting from its front is cheap: no copy of the rest per step

    def handle_connect(self, event: Any) -> None:
        self.connected = True
        if event.path.startswith(LIVE_PREFIX):
            self.live = True
            self.conn.available_extensions = []
            self.conn.max_size = MAX_MESSAGE
        super().handle_connect(event)

    def data_received(self, data: bytes) -> None:
        if self.live and self.close_sent:
            self.after_close += len(data)
        if self.connected and not self.live:
            super().data_received(data)
            return
        # The first bytes are the handshake request as uvicorn's HTTP protocol hands it over (a few hundred
        # bytes): until it is parsed, which socket this is is not known, so they are stepped too.
        self.unparsed += data
        self._parse()

    def _parse(self) -> None:
        """Give the parser what was read, a step at a time, until a message waits for the relay; keep the
        rest, and the socket unread, until it is taken. Once the server has closed the socket, what comes
        is discarded (uvicorn reads on for the viewer's close reply), up to CLOSING_SLACK."""
        while self.unparsed and not self.transport.is_closing():
            if self.close_sent:
                if self.after_close > CLOSING_SLACK:
                    self.transport.abort()  # its close frame is sent; what it sends on is not ours to read
                    return
            elif self.queue.qsize() > 0:
                break
            # a runner's socket, say, is uvicorn's as it is once its request is parsed
            n = len(self.unparsed) if self.connected and not self.live else PARSE_STEP
            step = bytes(self.unparsed[:n])
            del self.unparsed[:n]
            super().data_received(step)
        if self.unparsed and not self.read_paused:
            self.read_paused = True  # as uvicorn pauses when it queues a message: reading resumes on receive()
            self.transport.pause_reading()

    async def receive(self) -> Any:
        message = await self.queue.get()
        if self.queue.empty() and self.unparsed:
            self._parse()
        if self.read_paused and self.queue.empty() and not self.unparsed:
            self.read_paused = False
            self.transport.resume_reading()
        return message

    async def send(self, message: Any) -> None:
        closing = message.get("type") == "websocket.close" and not self.close_sent
        await super().send(message)
        if closing and self.live and self.close_sent:
            # What was read and not parsed was in flight at the close: it counts against CLOSING_SLACK, and
            # the viewer's close reply may be in it.
            self.after_close = len(self.unparsed)
            self._parse()


__all__ = ["CLOSING_SLACK", "LIVE_PREFIX", "MAX_MESSAGE", "PARSE_STEP", "LiveBoundedWebSockets"]
