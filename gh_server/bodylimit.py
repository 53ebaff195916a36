"""Request bodies are bounded before anything reads them: an ASGI middleware outside the app.

The limit is checked twice: against `Content-Length` before a byte is read, and against the bytes
actually received (a chunked body, or a client that lies about its length). The whole body is held
here, up to the limit, before the app is called, so neither auth nor JSON parsing nor a handler ever
runs on a body that is too large: a 60 MB unauthenticated POST costs at most the limit in memory and
gets its 413 at once. WebSocket and lifespan scopes pass through (the gateway bounds its own frames).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_MAX_BODY = 4 * 1024 * 1024
# A batch of up to 500 cases is the one body that legitimately runs larger than a single case
# (two 100,000-character scripts JSON-escape to at most ~1.2 MB); bigger batches are split by the client.
DEFAULT_MAX_BATCH_BODY = 32 * 1024 * 1024
BATCH_PATHS = ("/v1/test_cases/batch",)


# Before a 413 the rest of the body is read and thrown away (never kept), for at most this long and this
# many bytes, as nginx's lingering close does after: uvicorn closes the connection once the answer is
# sent, so a client that sends its whole body before it reads (urllib, requests, httpx) would otherwise
# get a connection reset, not the 413 that says why (an agent must see why it was refused).
LINGER_S = 5.0
LINGER_MAX = 64 * 1024 * 1024


class BodyTooLarge(Exception):
    pass


def _error(limit: int) -> bytes:
    msg = f"The request body is larger than {limit:,} bytes, the limit for this endpoint; send a smaller one."
    return json.dumps({"error": {"type": "invalid_request", "message": msg, "limit_bytes": limit}}).encode()


class BodyLimit:
    def __init__(self, app: ASGIApp, max_body: int = DEFAULT_MAX_BODY,
                 max_batch_body: int = DEFAULT_MAX_BATCH_BODY) -> None:
        self.app = app
        self.max_body = max_body
        self.max_batch_body = max_batch_body

    def limit_for(self, path: str) -> int:
        return self.max_batch_body if path in BATCH_PATHS else self.max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(str(scope.get("path", "")))
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _linger(receive)
            await _refuse(send, limit)
            return
        try:
            messages = await _read_all(receive, limit)
        except BodyTooLarge:
            await _linger(receive)
            await _refuse(send, limit)
            return
        replay = iter(messages)

        async def replayed() -> Message:
            # After the body, whatever the server sends next (a disconnect) comes from the real channel.
            return next(replay, None) or await receive()

        await self.app(scope, replayed, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server (h11/httptools) refuses a malformed one itself
    return None


async def _read_all(receive: Receive, limit: int) -> list[Message]:
    messages: list[Message] = []
    size = 0
    while True:
        msg = await receive()
        messages.append(msg)
        if msg.get("type") != "http.request":
            return messages  # a disconnect: let the app see it
        size += len(msg.get("body", b""))
        if size > limit:
            raise BodyTooLarge
        if not msg.get("more_body", False):
            return messages


async def _linger(receive: Receive) -> None:
    """Discard what is left of a refused body, bounded in time and bytes (LINGER_S, LINGER_MAX): past
    either bound the 413 goes out anyway and the client may see the connection close first."""
    drained = 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(LINGER_S):
            while drained <= LINGER_MAX:
                msg = await receive()
                if msg.get("type") != "http.request" or not msg.get("more_body", False):
                    return
                drained += len(msg.get("body", b""))


async def _refuse(send: Send, limit: int) -> None:
    body = _error(limit)
    # Connection: close, because the rest of the body is never read: the connection cannot be reused.
    await send({"type": "http.response.start", "status": 413, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
