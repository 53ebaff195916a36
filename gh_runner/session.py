"""The websocket session to the control plane: dial out, hello/welcome, heartbeats, reconnect.

The session owns the transport and liveness only; what messages mean is the handler's (the
daemon's) business. Guarantees it gives the handler:

- `make_hello()` is called for every connection, so the hello is always current (images, held
  versions, in-flight attempts); `on_welcome()` runs before any other server message is handed on.
- Heartbeats go out every `welcome.heartbeat_interval`; a server silent for `welcome.dead_after`
  is declared dead (close code 4008) and the session reconnects.
- Reconnects wait a capped exponential backoff with jitter (`gh_common.backoff`), reset once a connection
  has stayed up for `stable_after` seconds, so a flapping server is never retried hot.
- Given several server URLs (gh-server processes on one database), each reconnect goes to the next
  one in turn: a runner whose server died is back on another within one backoff delay, with the same
  hello (its in-flight attempts go on there, its journaled results are resent and applied once).
- A revoked or unknown token (close code 4001, or HTTP 401/403 at the handshake) and a protocol
  mismatch (4002) are logged once, clearly, and retried only every `revoked_retry` seconds.
- A frame that cannot be parsed, or whose handling fails, is answered with an `error` message;
  the session stays up. An `error` from the server is logged, never answered (no error ping-pong).
- Nothing is sent over the frame limit (`encode_checked`): a machine answer too big to send goes
  out as that request's typed refusal, anything else too big is dropped with a log line; the
  connection, and every other request on it, stays up.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from gh_common.backoff import Backoff
from gh_common.timeouts import within
from gh_runner import __version__
from gh_runner.config import is_loopback
from gh_runner.log import get_logger, redactor
from gh_wire.protocol import (
    CLOSE_HEARTBEAT_TIMEOUT,
    CLOSE_PROTOCOL_UNSUPPORTED,
    CLOSE_REPLACED,
    CLOSE_TOKEN_REVOKED,
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    RUNNER_TOKEN_PREFIX,
    ErrorMsg,
    FrameTooLarge,
    Heartbeat,
    Hello,
    ProtocolError,
    Welcome,
    encode,
    encode_checked,
    parse_server_message,
    too_large_reply,
)


class SessionHandler(Protocol):
    async def make_hello(self) -> Hello: ...
    async def on_welcome(self, welcome: Welcome) -> None: ...
    async def on_message(self, msg: Any) -> None: ...
    def heartbeat(self) -> Heartbeat: ...
    def on_disconnected(self, reason: str) -> None: ...
    def on_reconnect_scheduled(self, failures: int, delay: float) -> None: ...


def token_hint(token: str) -> str:
    """What a refused token most likely is, when it is not a runner token at all ("" when it is one)."""
    if token.startswith(RUNNER_TOKEN_PREFIX):
        return ""
    make = "make one with `gh-server runners create NAME` (or POST /v1/runners with an admin API key)"
    if token.startswith("gh_"):
        return (f" (this is an API key, {token[:8]}..., not a runner token, {RUNNER_TOKEN_PREFIX}...: {make})")
    return f" (a runner token starts with {RUNNER_TOKEN_PREFIX}: {make})"


@dataclass
class _Outcome:
    reason: str
    slow: bool = False  # revoked token or protocol mismatch: do not retry hot
    refused: bool = False  # the server refused the token (unknown or revoked)
    welcomed: bool = False
    up_seconds: float = 0.0


class Session:
    def __init__(
        self,
        url: str | Sequence[str],
        token: str,
        handler: SessionHandler,
        *,
        backoff: Backoff | None = None,
        revoked_retry: float = 600.0,
        connect_timeout: float = 15.0,
        welcome_timeout: float = 30.0,
        stable_after: float = 10.0,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        """`on_refused`: when given, a refused token ends the session (it is called with the reason and
        `run()` returns) instead of being retried every `revoked_retry` seconds."""
        self.on_refused = on_refused
        self.urls = [url] if isinstance(url, str) else list(url)
        if not self.urls:
            raise ValueError("a session needs at least one server URL")
        self._at = 0  # which of `urls` the next connection dials
        self._token = token
        redactor.add(token)
        self.handler = handler
        self.backoff = backoff or Backoff(jitter=True)
        self.revoked_retry = revoked_retry
        self.connect_timeout = connect_timeout
        self.welcome_timeout = welcome_timeout
        self.stable_after = stable_after
        self._sleep = sleep or self._wait_stop
        self._stop = asyncio.Event()
        self._ws: ClientConnection | None = None
        self._closing: asyncio.Task[None] | None = None
        self._welcomed = False
        self._revoked_logged = False
        self.welcome: Welcome | None = None
        self.connections = 0
        self.last_rx = 0.0
        self.log = get_logger("gh_runner.session")

    @property
    def url(self) -> str:
        """The server this session is connected to, or dials next."""
        return self.urls[self._at]

    @property
    def connected(self) -> bool:
        return self._ws is not None and self._welcomed

    async def _wait_stop(self, delay: float) -> None:
        try:
            await within(delay, self._stop.wait())
        except TimeoutError:
            pass

    def stop(self) -> None:
        self._stop.set()
        ws = self._ws
        if ws is not None:
            self._closing = asyncio.get_running_loop().create_task(ws.close(1001, "runner going away"))

    async def keep_connected(self) -> None:
        """Connect, serve, reconnect, until `stop()`."""
        while not self._stop.is_set():
            outcome = await self._connect_once()
            if self._stop.is_set():
                break
            self.handler.on_disconnected(outcome.reason)
            self._at = (self._at + 1) % len(self.urls)  # a lost or unreachable server: try the next one
            if outcome.welcomed and outcome.up_seconds >= self.stable_after:
                self.backoff.reset()
            if outcome.refused and self.on_refused is not None:
                self.log.error(outcome.reason)
                self.on_refused(outcome.reason)
                break
            if outcome.slow:
                delay = self.revoked_retry
                if not self._revoked_logged:
                    self.log.error(outcome.reason + f"; retrying only every {delay:.0f} s until then")
                    self._revoked_logged = True
                else:
                    self.log.debug("still refused", reason=outcome.reason)
            else:
                delay = self.backoff.next_delay()
                self.log.warning("disconnected from server", reason=outcome.reason,
                                 retry_in=round(delay, 2))
            self.handler.on_reconnect_scheduled(self.backoff.failures, delay)
            await self._sleep(delay)

    async def send_message(self, msg: Any) -> bool:
        """Send a message on the current connection; False when there is none (callers retry later)."""
        ws = self._ws
        if ws is None or (not self._welcomed and not isinstance(msg, Hello)):
            return False
        try:
            frame = encode_checked(msg)
        except FrameTooLarge as e:
            stand_in = too_large_reply(msg, e)
            self.log.warning("message too large to send", type=e.msg_type, bytes=e.size, limit=e.limit,
                             replaced=stand_in is not None)
            if stand_in is None:
                return False
            frame = encode(stand_in)
        try:
            await ws.send(frame)
            return True
        except ConnectionClosed:
            return False

    async def _connect_once(self) -> _Outcome:
        host = urlsplit(self.url).hostname or ""
        try:
            ws = await connect(
                self.url,
                additional_headers={"Authorization": f"Bearer {self._token}"},
                user_agent_header=f"gh-runner/{__version__}",
                open_timeout=self.connect_timeout,
                ping_interval=None,  # liveness is the protocol's heartbeats
                close_timeout=2,
                max_size=MAX_FRAME_BYTES,
                max_queue=64,
                proxy=None if is_loopback(host) else True,
            )
        except InvalidStatus as e:
            status = e.response.status_code
            if status in (401, 403):
                return _Outcome(f"server refused the runner token (HTTP {status}): it is unknown or revoked; "
                                f"issue a new runner token and restart gh-runner with it{token_hint(self._token)}",
                                slow=True, refused=True)
            return _Outcome(f"server answered the websocket handshake with HTTP {status}")
        except InvalidURI as e:
            return _Outcome(f"bad server URL: {e}", slow=True)
        except (OSError, InvalidHandshake, TimeoutError) as e:
            return _Outcome(f"cannot connect to {self.url}: {type(e).__name__}: {e}")
        self.connections += 1
        self._ws = ws
        self._welcomed = False
        started = time.monotonic()
        outcome = _Outcome("connection ended")
        try:
            outcome = await self._serve(ws)
        except ConnectionClosed as e:
            outcome = self._closed_outcome(e)
        except Exception as e:  # a bug or a failing handler must cost one connection, not the session
            self.log.exception("session failed; reconnecting")
            outcome = _Outcome(f"runner error on the session: {type(e).__name__}: {redactor.scrub(str(e))[:200]}")
            await ws.close(1011, "runner error")
        finally:
            self._ws = None
            outcome.welcomed = self._welcomed
            self._welcomed = False
            outcome.up_seconds = time.monotonic() - started
            await ws.close()
        return outcome

    def _closed_outcome(self, e: ConnectionClosed) -> _Outcome:
        code = e.rcvd.code if e.rcvd is not None else None
        why = e.rcvd.reason if e.rcvd is not None and e.rcvd.reason else ""
        suffix = f": {why}" if why else ""
        if code == CLOSE_TOKEN_REVOKED:
            return _Outcome("server closed the session: the runner token is revoked or unknown (close code 4001); "
                            f"issue a new runner token and restart gh-runner with it{token_hint(self._token)}",
                            slow=True, refused=True)
        if code == CLOSE_PROTOCOL_UNSUPPORTED:
            return _Outcome(f"server does not speak protocol {PROTOCOL_VERSION} (close code 4002{suffix}); "
                            "upgrade gh-runner or the server", slow=True)
        if code == CLOSE_REPLACED:
            return _Outcome("another runner connected with the same token and replaced this session "
                            "(close code 4003); give each runner its own token")
        if code is None:
            return _Outcome("connection lost without a close frame")
        return _Outcome(f"server closed the session (code {code}{suffix})")

    async def _serve(self, ws: ClientConnection) -> _Outcome:
        hello = await self.handler.make_hello()
        await ws.send(encode(hello))
        try:
            welcome = await within(self.welcome_timeout, self._await_welcome(ws))
        except TimeoutError:
            await ws.close(1002, "no welcome")
            return _Outcome(f"server sent no welcome within {self.welcome_timeout:.0f} s")
        if welcome.protocol != PROTOCOL_VERSION:
            await ws.close(CLOSE_PROTOCOL_UNSUPPORTED, "protocol mismatch")
            return _Outcome(f"server speaks protocol {welcome.protocol}, this runner {PROTOCOL_VERSION}; "
                            "upgrade gh-runner or the server", slow=True)
        self.welcome = welcome
        self._welcomed = True
        self.last_rx = time.monotonic()
        self.log.info("connected", runner_id=welcome.runner_id, server=self.url)
        await self.handler.on_welcome(welcome)
        tasks = [
            asyncio.create_task(self._reader(ws), name="session-reader"),
            asyncio.create_task(self._heartbeats(ws, welcome.heartbeat_interval), name="session-heartbeats"),
            asyncio.create_task(self._watchdog(ws, welcome.dead_after), name="session-watchdog"),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for t in done:
            exc = t.exception()
            if isinstance(exc, ConnectionClosed):
                return self._closed_outcome(exc)
            if exc is not None:
                raise exc
            result = t.result()
            if isinstance(result, _Outcome):
                return result
        return _Outcome("connection ended")

    async def _await_welcome(self, ws: ClientConnection) -> Welcome:
        while True:
            raw = await ws.recv()
            try:
                msg = parse_server_message(raw)
            except ProtocolError as e:
                await self._reply_error(ws, e.code, e.message, None)
                continue
            if isinstance(msg, Welcome):
                return msg
            if isinstance(msg, ErrorMsg):
                self.log.warning("server rejected a message", code=msg.code, message=msg.message,
                                 ref_type=msg.ref_type)
                continue
            await self._reply_error(ws, "bad_message", f"expected welcome before {msg.type}", msg.type)

    async def _reader(self, ws: ClientConnection) -> _Outcome:
        async for raw in ws:
            self.last_rx = time.monotonic()
            try:
                msg = parse_server_message(raw)
            except ProtocolError as e:
                await self._reply_error(ws, e.code, e.message, _peek_type(raw))
                continue
            if isinstance(msg, Heartbeat):
                continue
            if isinstance(msg, ErrorMsg):
                self.log.warning("server rejected a message", code=msg.code, message=msg.message,
                                 ref_type=msg.ref_type)
                continue
            if isinstance(msg, Welcome):
                await self._reply_error(ws, "bad_message", "welcome is only valid once per session", "welcome")
                continue
            try:
                await self.handler.on_message(msg)
            except ConnectionClosed:
                raise
            except Exception as e:
                self.log.exception("handling a server message failed", type=msg.type)
                await self._reply_error(ws, "internal", f"runner failed to handle {msg.type}: {type(e).__name__}",
                                        msg.type)
        return _Outcome("server closed the connection")

    async def _reply_error(self, ws: ClientConnection, code: str, message: str, ref_type: str | None) -> None:
        await ws.send(encode(ErrorMsg(code=code, message=redactor.scrub(message), ref_type=ref_type)))

    async def _heartbeats(self, ws: ClientConnection, interval: float) -> None:
        while True:
            await ws.send(encode(self.handler.heartbeat()))
            await asyncio.sleep(interval)

    async def _watchdog(self, ws: ClientConnection, dead_after: float) -> _Outcome:
        step = min(1.0, dead_after / 4)
        while True:
            await asyncio.sleep(step)
            silent = time.monotonic() - self.last_rx
            if silent > dead_after:
                # The peer may be gone without a FIN: do not wait long for its closing handshake.
                ws.close_timeout = 0.5
                await ws.close(CLOSE_HEARTBEAT_TIMEOUT, "heartbeat timeout")
                return _Outcome(f"server silent for {silent:.1f} s (dead-peer bound {dead_after:.1f} s)")


def _peek_type(raw: str | bytes) -> str | None:
    """The `type` of a frame that failed to parse, if it is cheap to find, for the error's ref_type."""
    if isinstance(raw, bytes) or len(raw) > 65536:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    t = data.get("type") if isinstance(data, dict) else None
    return t[:64] if isinstance(t, str) else None
