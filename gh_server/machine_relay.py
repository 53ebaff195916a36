"""Machine requests between gh-server processes, through PostgreSQL itself (no broker).

Only the process that holds a runner's websocket can talk to that runner, but an agent's machine-API
request may land on any process behind the load balancer (and an agent keeps running in its process
when its runner reconnects to another). Such a request becomes a row in `machine_relay` and a
`NOTIFY gh_relay_req`; the holder (every process LISTENs) claims it with a guarded UPDATE, relays it
over its socket, writes the answer and `NOTIFY gh_relay_done`; the asker reads it and deletes the row.
A notification can be missed (the listening connection broke and came back): both sides also poll
every `POLL_S`, so a request waits at most that much longer, never forever. On SQLite there is one
process and no relay: the gateway answers from its own sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, cast

import psycopg
from sqlalchemy import CursorResult, delete, select, text, update
from sqlalchemy.orm import Session

from gh_common import timeouts
from gh_server.dbqueue import DbQueue
from gh_server.metrics import ServerMetrics
from gh_server.models import MachineRelay, Runner, utcnow
from gh_wire import protocol

log = logging.getLogger(__name__)

REQ_CHANNEL = "gh_relay_req"
DONE_CHANNEL = "gh_relay_done"
POLL_S = 1.0
RECONNECT_S = 2.0
CONNECT_TIMEOUT_S = 10.0
RUNNER_SLACK_S = 15.0  # on top of a request's own timeout: the runner's round trip (as agents.base.SLACK_S)

Answer = Callable[[str, protocol.MachineRequest, float], Awaitable[protocol.MachineResponse]]


def _notify(session: Session, channel: str, payload: str) -> None:
    session.execute(text("SELECT pg_notify(:c, :p)"), {"c": channel, "p": payload})


def _ask(session: Session, runner_id: str, req: protocol.MachineRequest) -> bool:
    """Queue the request for the runner's process; False when no process holds the runner."""
    held = session.scalar(select(Runner.session_id).where(Runner.id == runner_id))
    if held is None:
        return False
    session.add(MachineRelay(request_id=req.request_id, runner_id=runner_id, request=req.model_dump(mode="json"),
                             created_at=utcnow()))
    _notify(session, REQ_CHANNEL, f"{runner_id} {req.request_id}")
    return True


def _claim(session: Session, request_id: str, me: str) -> dict[str, Any] | None:
    res = session.execute(
        update(MachineRelay)
        .where(MachineRelay.request_id == request_id, MachineRelay.claimed_by.is_(None))
        .values(claimed_by=me)
        .execution_options(synchronize_session=False)
    )
    if cast(CursorResult[Any], res).rowcount != 1:
        return None
    return session.scalar(select(MachineRelay.request).where(MachineRelay.request_id == request_id))


def _unclaimed(session: Session, runner_ids: list[str]) -> list[tuple[str, str]]:
    rows = session.execute(
        select(MachineRelay.runner_id, MachineRelay.request_id).where(
            MachineRelay.runner_id.in_(runner_ids), MachineRelay.claimed_by.is_(None)
        )
    ).all()
    return [(r, q) for r, q in rows]


def _answer(session: Session, request_id: str, resp: protocol.MachineResponse) -> None:
    session.execute(
        update(MachineRelay)
        .where(MachineRelay.request_id == request_id)
        .values(response=resp.model_dump(mode="json"))
        .execution_options(synchronize_session=False)
    )
    _notify(session, DONE_CHANNEL, request_id)


def _answers(session: Session, request_ids: list[str]) -> dict[str, dict[str, Any]]:
    rows = session.execute(
        select(MachineRelay.request_id, MachineRelay.response).where(
            MachineRelay.request_id.in_(request_ids), MachineRelay.response.is_not(None)
        )
    ).all()
    return {q: dict(r) for q, r in rows if r is not None}


def _forget(session: Session, request_id: str) -> None:
    session.execute(delete(MachineRelay).where(MachineRelay.request_id == request_id)
                    .execution_options(synchronize_session=False))


class PgRelay:
    """One LISTEN connection per process; `forward` asks another process, the listener answers for ours."""

    def __init__(self, conninfo: str, dbq: DbQueue, held: Callable[[], list[str]], answer: Answer,
                 metrics: ServerMetrics | None = None) -> None:
        self._metrics = metrics
        self._conninfo = conninfo
        self._dbq = dbq
        self._held = held  # the runners whose sockets this process holds
        self._answer = answer  # relays over our own socket; never raises
        self.me = uuid.uuid4().hex
        self._waiting: dict[str, asyncio.Future[protocol.MachineResponse]] = {}
        self._jobs: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()
        self.relayed = 0  # requests this process answered for another one

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._listen(), name="gh-relay")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._jobs) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._task = None

    async def forward(self, runner_id: str, req: protocol.MachineRequest, timeout: float) -> protocol.MachineResponse:
        """Ask the process holding `runner_id` to relay `req`; never raises (a failure is `ok=False`)."""
        fut: asyncio.Future[protocol.MachineResponse] = asyncio.get_running_loop().create_future()
        self._waiting[req.request_id] = fut
        try:
            if self._metrics is not None:
                self._metrics.relayed.labels(direction="sent").inc()
            if not await self._dbq.run(lambda s: _ask(s, runner_id, req)):
                return protocol.MachineResponse(
                    request_id=req.request_id, ok=False, refusal=protocol.MachineRefusal.AWAY,
                    error="the runner holding this machine is not connected",
                )
            try:
                async with timeouts.timeout(timeout):
                    return await fut
            except TimeoutError:
                return protocol.MachineResponse(
                    request_id=req.request_id, ok=False, timed_out=True,
                    error=f"the runner did not answer within {timeout:g} s",
                )
        finally:
            self._waiting.pop(req.request_id, None)
            with contextlib.suppress(Exception):
                await self._dbq.run(lambda s: _forget(s, req.request_id))

    # -- the listener -----------------------------------------------------------------------------

    async def _listen(self) -> None:
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True,
                                                             connect_timeout=int(CONNECT_TIMEOUT_S))
            except Exception as e:
                log.warning("relay: cannot connect to PostgreSQL to LISTEN (%s); polling meanwhile", type(e).__name__)
                await self._poll()
                await asyncio.sleep(RECONNECT_S)
                continue
            try:
                async with conn:
                    await conn.execute(f"LISTEN {REQ_CHANNEL}")
                    await conn.execute(f"LISTEN {DONE_CHANNEL}")
                    self.listening.set()
                    while True:
                        await self._poll()  # what a missed notification left behind
                        async for n in conn.notifies(timeout=POLL_S):
                            self._on(n.channel, n.payload)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("relay: LISTEN connection lost (%s); reconnecting", type(e).__name__)
                self.listening.clear()
                await asyncio.sleep(RECONNECT_S)

    def _on(self, channel: str, payload: str) -> None:
        if channel == REQ_CHANNEL:
            runner_id, _, request_id = payload.partition(" ")
            if runner_id in self._held():
                self._spawn(self._serve(runner_id, request_id))
        elif channel == DONE_CHANNEL and payload in self._waiting:
            self._spawn(self._collect([payload]))

    def _spawn(self, coro: Any) -> None:
        t = asyncio.create_task(coro)
        self._jobs.add(t)
        t.add_done_callback(self._jobs.discard)

    async def _poll(self) -> None:
        held = self._held()
        if held:
            for runner_id, request_id in await self._dbq.run(lambda s: _unclaimed(s, held)):
                self._spawn(self._serve(runner_id, request_id))
        if self._waiting:
            await self._collect(list(self._waiting))

    async def _serve(self, runner_id: str, request_id: str) -> None:
        raw = await self._dbq.run(lambda s: _claim(s, request_id, self.me))
        if raw is None:
            return  # another listener of ours, or the asker gave up
        try:
            req = protocol.MachineRequest.model_validate(raw)
        except Exception:
            resp = protocol.MachineResponse(request_id=request_id, ok=False, error="the relayed request is invalid")
        else:
            resp = await self._answer(runner_id, req, req.timeout + RUNNER_SLACK_S)
        self.relayed += 1
        if self._metrics is not None:
            self._metrics.relayed.labels(direction="served").inc()
        await self._dbq.run(lambda s: _answer(s, request_id, resp))

    async def _collect(self, request_ids: list[str]) -> None:
        for request_id, raw in (await self._dbq.run(lambda s: _answers(s, request_ids))).items():
            fut = self._waiting.get(request_id)
            if fut is not None and not fut.done():
                try:
                    fut.set_result(protocol.MachineResponse.model_validate(raw))
                except Exception:
                    fut.set_result(protocol.MachineResponse(request_id=request_id, ok=False,
                                                            error="the relayed answer is invalid"))
