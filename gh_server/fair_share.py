"""Each caller's share of the server: at most `api_in_flight_per_caller` of one caller's HTTP requests are
served at once; the rest wait their turn, in order, and past `api_waiting_per_caller` waiting are refused
with 429 before anything is read or looked up. An ASGI middleware outside the app.

gh-server serves every request on one event loop (its handlers' database work in a thread pool, under
one GIL), and asyncio runs every ready request a step at a time: twenty requests sent at once by one
member (a page of tickets, a script's `asyncio.gather`) were all served side by side, and another
caller's request sent meanwhile finished only when most of them had, about twenty requests' work later
(bench/live_abuse.py, unread_open and tickets_only: 42-47 ms against an idle p99 of 10 ms). With a share,
the other caller waits behind at most a share's worth: at 4 it still took 21-34 ms at the burst's start,
at 1 10-11 ms; 2 keeps one caller's requests overlapping a database wait. A caller's own burst takes
about as long as before: the server's CPU, not its concurrency, bounds it.

A caller is its credential, hashed (never kept): the Bearer key, else the console's session cookie, else
(no credential: the health check, the console's files, a 401 to come) the client's address, as the
trusted proxy says it. A slot is held until the response starts, so a long download (an export) does not
keep the caller's other requests waiting. Not shared: WebSockets (the runners', a live viewer's: bounded
by their own protocols) and the machine API (an agent's exec may run an hour; gh_server/agents/
machine_limits.py bounds it per attempt token).
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass

from gh_server.agents.machine_limits import token_key
from gh_server.bodylimit import ASGIApp, Message, Receive, Scope, Send
from gh_server.console_sessions import COOKIE, SECURE_COOKIE
from gh_server.errors import send_too_many


@dataclass
class _Share:
    slots: asyncio.Semaphore  # wakes its waiters in the order they came
    callers: int = 0  # requests served or waiting


class FairShare:
    def __init__(self, app: ASGIApp, *, in_flight: int, waiting: int, not_shared: tuple[str, ...] = ()) -> None:
        self.app = app
        self.in_flight = in_flight
        self.waiting = waiting
        self.not_shared = not_shared
        self._shares: dict[str, _Share] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or str(scope.get("path", "")).startswith(self.not_shared):
            await self.app(scope, receive, send)
            return
        caller = caller_of(scope)
        share = self._shares.get(caller)
        if share is None:
            share = self._shares[caller] = _Share(asyncio.Semaphore(self.in_flight))
        if share.callers >= self.in_flight + self.waiting:
            limit = self.in_flight + self.waiting
            await send_too_many(send, limit, f"{limit} requests of this caller are already being served or "
                                             "waiting: wait for some to finish")
            return
        share.callers += 1
        held = False
        try:
            await share.slots.acquire()
            held = True

            async def sending(message: Message) -> None:
                nonlocal held
                if held and message["type"] == "http.response.start":
                    held = False
                    share.slots.release()  # the answer has begun: its body is not the server's work
                await send(message)

            await self.app(scope, receive, sending)
        finally:
            if held:
                share.slots.release()
            share.callers -= 1
            if share.callers == 0:
                del self._shares[caller]


def caller_of(scope: Scope) -> str:
    """Whose share a request is: a hash of its credential, else its client's address."""
    # The token as auth reads it: "Bearer k" and "bearer  k " are one caller, not two shares.
    if (key := token_key(scope)) is not None:
        return "key:" + key
    cookie: bytes | None = None
    for name, value in scope.get("headers") or ():
        if name == b"cookie":
            cookie = value
    if cookie is not None:
        for part in cookie.split(b";"):
            k, _, v = part.strip().partition(b"=")
            if k in (COOKIE.encode(), SECURE_COOKIE.encode()) and v:
                return "session:" + hashlib.sha256(v).hexdigest()
    client = scope.get("client")
    return f"addr:{client[0] if client else '-'}"


__all__ = ["FairShare", "caller_of"]
