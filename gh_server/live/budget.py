"""A live viewer's share of the server: what one view may send, counted before anything it sent is parsed
(docs/security.md, "Live views").

The viewer's bytes are parsed on gh-server's one event loop (gh_server/live/screen_relay.py), so one view that
sends without bound would stall the API, the runners' heartbeats and every agent's timing. Each view
gets two token buckets, one of bytes and one of WebSocket messages, filled at a steady rate up to a
burst; a message that finds either bucket short ends the view with `viewer_too_fast` before it is
parsed. The transport's part (no per-message deflate, a small `max_size`) is gh_server/live/sockets.py.

noVNC sends a message per input event and per update request, and batches what it sends into at most
10 KiB (core/websock.js), so a person typing, dragging or pasting a clipboard stays far inside the
driver's share. A watcher sends only update requests and its pixel format, so its share is smaller.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# The person driving the machine (an attempt's holder, a start state's admin): a 1 MiB clipboard paste
# at once (rfb.MAX_CUT_TEXT), 64 KiB a second after it; 200 messages at once, 100 a second after.
DRIVER_BYTES_PER_S = 64 * 1024
DRIVER_BYTES_BURST = 1024 * 1024 + 64 * 1024
DRIVER_MESSAGES_PER_S = 100.0
DRIVER_MESSAGES_BURST = 200.0
# A watcher: noVNC's start (its version, ClientInit, SetPixelFormat, SetEncodings) and an update request
# after each update it gets, at most a few tens a second.
WATCHER_BYTES_PER_S = 4 * 1024
WATCHER_BYTES_BURST = 16 * 1024
WATCHER_MESSAGES_PER_S = 50.0
WATCHER_MESSAGES_BURST = 100.0


@dataclass(frozen=True)
class Share:
    bytes_per_s: float
    bytes_burst: float
    messages_per_s: float
    messages_burst: float


DRIVER = Share(DRIVER_BYTES_PER_S, DRIVER_BYTES_BURST, DRIVER_MESSAGES_PER_S, DRIVER_MESSAGES_BURST)
WATCHER = Share(WATCHER_BYTES_PER_S, WATCHER_BYTES_BURST, WATCHER_MESSAGES_PER_S, WATCHER_MESSAGES_BURST)


class Budget:
    """One view's buckets, full at the start."""

    def __init__(self, share: Share, clock: Callable[[], float] = time.monotonic) -> None:
        self.share = share
        self._clock = clock
        self._at = clock()
        self._bytes = share.bytes_burst
        self._messages = share.messages_burst

    def spend(self, size: int) -> bool:
        """Take one message of `size` bytes; False (nothing taken) when the view is past its share."""
        now = self._clock()
        elapsed, self._at = max(0.0, now - self._at), now
        s = self.share
        self._bytes = min(s.bytes_burst, self._bytes + elapsed * s.bytes_per_s)
        self._messages = min(s.messages_burst, self._messages + elapsed * s.messages_per_s)
        if size > self._bytes or self._messages < 1.0:
            return False
        self._bytes -= size
        self._messages -= 1.0
        return True


__all__ = ["DRIVER", "WATCHER", "Budget", "Share"]
