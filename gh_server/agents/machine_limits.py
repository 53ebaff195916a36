"""Limits of the machine API (docs/agents.md), enforced before a request reaches the runner.

An agent is untrusted, and every machine request travels to the runner on the one websocket that also
carries every other attempt's requests on that runner: a request too big for it, or too many at once,
would hurt attempts that are not the agent's. So:
- `exec`'s env: at most ENV_MAX_ENTRIES entries and ENV_MAX_BYTES bytes (names and values, UTF-8);
- `input`: at most EVENTS_MAX events per request;
- at most `Settings.machine_api_max_in_flight` requests in flight per token: more get 429 at once
  (an ASGI middleware on the machine API's path, so it holds before any handler or grant lookup).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from gh_server.bodylimit import ASGIApp, Receive, Scope, Send
from gh_server.errors import send_too_many

ENV_MAX_ENTRIES = 64
ENV_MAX_BYTES = 64 * 1024
EVENTS_MAX = 100


def check_env(env: Mapping[str, str]) -> Mapping[str, str]:
    """ValueError (a 400 naming `env`) past the limits, or for a name or value no guest's environment can
    hold (a NUL anywhere, `=` in a name, an empty name): refused here, as the agent's request, rather
    than failing in the guest channel as if the machine were at fault."""
    for k, v in env.items():
        if not k or "=" in k or "\x00" in k:
            raise ValueError(f"has a name no environment can hold ({k[:40]!r}): names are non-empty, "
                             "without '=' or NUL")
        if "\x00" in v:
            raise ValueError(f"{k[:40]} holds a NUL character, which no environment can hold")
        try:
            k.encode(), v.encode()
        except UnicodeEncodeError:
            raise ValueError(f"{k[:40]!r} is not valid UTF-8 (a lone surrogate)") from None
    if len(env) > ENV_MAX_ENTRIES:
        raise ValueError(f"has {len(env)} entries; the limit is {ENV_MAX_ENTRIES}")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in env.items())
    if size > ENV_MAX_BYTES:
        raise ValueError(f"is {size:,} bytes; the limit is {ENV_MAX_BYTES:,} (names and values)")
    return env


class InFlightLimit:
    """429 for a token's request beyond `limit` in flight on paths under `prefix`."""

    def __init__(self, app: ASGIApp, prefix: str, limit: int) -> None:
        self.app = app
        self.prefix = prefix
        self.limit = limit
        self._in_flight: dict[str, int] = {}  # token hash -> requests being served

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        key = token_key(scope)
        if key is None:  # no token: the handler answers 401
            await self.app(scope, receive, send)
            return
        n = self._in_flight.get(key, 0)
        if n >= self.limit:
            await send_too_many(send, self.limit, f"{self.limit} machine requests of this attempt are already in "
                                                  "flight; wait for one to finish")
            return
        self._in_flight[key] = n + 1
        try:
            await self.app(scope, receive, send)
        finally:
            left = self._in_flight.get(key, 1) - 1
            if left > 0:
                self._in_flight[key] = left
            else:
                self._in_flight.pop(key, None)


def token_key(scope: Scope) -> str | None:
    """The hash of the request's Bearer token, as auth reads it (scheme in any case, spaces stripped)."""
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return hashlib.sha256(token.strip()).hexdigest()  # never keep the token itself
    return None


