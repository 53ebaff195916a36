"""uvicorn's WebSocket protocol with a live viewer's bounds at the transport (docs/security.md, "Live views").

uvicorn negotiates per-message deflate and sets the largest message (`ws_max_size`, 16 MiB by default)
once for every WebSocket, in the protocol, before the app sees the path: ASGI has no way for a route
to refuse an extension. Deflate lets a viewer send 2 MiB of RFB messages as 3 KB; 16 MiB is what one
unread message may cost. So for the viewer's path (gh_server/live/screen_relay.py, VIEWER_PATH) this
protocol refuses the extension and bounds a message to MAX_MESSAGE before the handshake is answered.
The runners' sockets keep uvicorn's settings (their JSON frames carry screenshots and script output).

uvicorn's sans-I/O protocol pauses reading after each message until the app takes it, so a viewer
the relay is not reading yet (its view still opening on the runner) holds at most one message here.

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


class LiveBoundedWebSockets(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol; a live viewer's socket gets no deflate and MAX_MESSAGE, and is
    dropped unread when it sends more than CLOSING_SLACK after the server closed it."""

    live = False
    after_close = 0  # bytes received since the server's close frame

    def handle_connect(self, event: Any) -> None:
        if event.path.startswith(LIVE_PREFIX):
            self.live = True
            self.conn.available_extensions = []
            self.conn.max_size = MAX_MESSAGE
        super().handle_connect(event)

    def data_received(self, data: bytes) -> None:
        if self.live and self.close_sent:
            self.after_close += len(data)
            if self.after_close > CLOSING_SLACK:
                self.transport.abort()  # its close frame is sent; what it sends on is not ours to read
                return
        super().data_received(data)


__all__ = ["CLOSING_SLACK", "LIVE_PREFIX", "MAX_MESSAGE", "LiveBoundedWebSockets"]
