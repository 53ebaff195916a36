"""uvicorn's WebSocket protocol with a live viewer's bounds at the transport (docs/security.md, "Live views").

uvicorn negotiates per-message deflate and sets the largest message (`ws_max_size`, 16 MiB by default)
once for every WebSocket, in the protocol, before the app sees the path: ASGI has no way for a route
to refuse an extension. Deflate lets a viewer send 2 MiB of RFB messages as 3 KB; 16 MiB is what one
unread message may cost. So for the viewer's path (gh_server/live/screen_relay.py, VIEWER_PATH) this
protocol refuses the extension and bounds a message to MAX_MESSAGE before the handshake is answered.
The runners' sockets keep uvicorn's settings (their JSON frames carry screenshots and script output).

uvicorn's sans-I/O protocol pauses reading after each message until the app takes it, so a viewer
the relay is not reading yet (its view still opening on the runner) holds at most one message here.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

LIVE_PREFIX = "/v1/live/"  # VIEWER_PATH's fixed part
# noVNC sends at most 10 KiB per WebSocket message (core/websock.js, _sQbufferSize); slack for others.
MAX_MESSAGE = 64 * 1024


class LiveBoundedWebSockets(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol; a live viewer's socket gets no deflate and MAX_MESSAGE."""

    def handle_connect(self, event: Any) -> None:
        if event.path.startswith(LIVE_PREFIX):
            self.conn.available_extensions = []
            self.conn.max_size = MAX_MESSAGE
        super().handle_connect(event)


__all__ = ["LIVE_PREFIX", "MAX_MESSAGE", "LiveBoundedWebSockets"]
