"""A simulated gh-runner for load and chaos (the topology test, bench/scale_out.py): the real protocol,
no machines. Like gh-runner it reconnects with a capped backoff, says in its hello what it still has
(running attempts and finished results not yet acknowledged, as its journal would), resends those
results until acked, heartbeats, and drops attempts the server no longer wants. `kill()` is a crashed
runner: its running attempts are gone, its journal (unacked results) survives into `restart()`."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection

from gh_wire import protocol

HEARTBEAT_S = 0.5


def now() -> datetime:
    return datetime.now(UTC)


class LoadRunner:
    def __init__(self, url: str, token: str, name: str, slots: int, work_s: float = 0.0,
                 backoff_max: float = 2.0) -> None:
        self.url = url
        self.token = token
        self.name = name
        self.slots = slots
        self.work_s = work_s
        self.backoff_max = backoff_max
        self.running: dict[str, asyncio.Task[None]] = {}
        self.unacked: dict[str, protocol.AttemptResult] = {}  # the journal
        self.leases: Counter[str] = Counter()
        self.acked: Counter[str] = Counter()
        self.connections = 0
        self.connected = asyncio.Event()
        self._ws: ClientConnection | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"load-{self.name}")

    async def kill(self) -> None:
        """Crash: the connection drops, running attempts (their machines) are lost, the journal stays."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for t in self.running.values():
            t.cancel()
        self.running.clear()
        self.connected.clear()

    async def restart(self) -> None:
        await self.kill()
        self.start()

    async def _loop(self) -> None:
        failures = 0
        while True:
            try:
                async with websockets.connect(self.url, additional_headers={"Authorization": f"Bearer {self.token}"},
                                              open_timeout=15, ping_interval=None, close_timeout=2,
                                              max_size=protocol.MAX_FRAME_BYTES) as ws:
                    self._ws = ws
                    self.connections += 1
                    await self._session(ws)
                    failures = 0
            except (OSError, websockets.WebSocketException, TimeoutError):
                failures += 1
            finally:
                self._ws = None
                self.connected.clear()
            # Equal jitter, as gh_runner.session.Backoff.
            ceiling = min(self.backoff_max, 0.1 * 2 ** min(failures, 8))
            await asyncio.sleep(random.uniform(ceiling / 2, ceiling))

    async def _send(self, msg: Any) -> None:
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(websockets.ConnectionClosed):
                await ws.send(protocol.encode(msg))

    async def _session(self, ws: ClientConnection) -> None:
        hello = protocol.Hello(
            version="load-1", name=self.name, slots=self.slots, labels=[],
            images=[protocol.ImageAd(name="linux-tiny", os="linux", version="1", checksum="sha256:0")],
            in_flight=[*self.running, *self.unacked],
        )
        await ws.send(protocol.encode(hello))
        beat = asyncio.create_task(self._beats())
        try:
            async for raw in ws:
                msg = protocol.parse_server_message(raw)
                if isinstance(msg, protocol.Welcome):
                    self.connected.set()
                    keep = set(msg.resume)
                    for aid in [a for a in self.running if a not in keep]:
                        self.running.pop(aid).cancel()
                    for aid, res in list(self.unacked.items()):
                        if aid in keep:
                            await self._send(protocol.AttemptFinished(result=res))
                        else:
                            self.unacked.pop(aid)
                elif isinstance(msg, protocol.Lease):
                    self.leases[msg.attempt_id] += 1
                    if len(self.running) >= self.slots:
                        await self._send(protocol.LeaseRefuse(attempt_id=msg.attempt_id, reason="full"))
                        continue
                    await self._send(protocol.LeaseAccept(attempt_id=msg.attempt_id))
                    self.running[msg.attempt_id] = asyncio.create_task(self._attempt(msg.attempt_id))
                elif isinstance(msg, protocol.ResultAck):
                    if self.unacked.pop(msg.attempt_id, None) is not None:
                        self.acked[msg.attempt_id] += 1
                elif isinstance(msg, protocol.Cancel):
                    t = self.running.pop(msg.attempt_id, None)
                    if t is not None:
                        t.cancel()
        finally:
            beat.cancel()
            # asyncio.wait, not `suppress(CancelledError): await beat`: that would also swallow a
            # cancel of this task (kill()) that lands while it waits here, and it would run on forever.
            await asyncio.wait([beat])

    async def _beats(self) -> None:
        while True:
            await self._send(protocol.Heartbeat(at=now(), busy=len(self.running), slots=self.slots))
            await asyncio.sleep(HEARTBEAT_S)

    async def _attempt(self, aid: str) -> None:
        started = now()
        await self._send(protocol.AttemptStatus(attempt_id=aid, status="preparing", phase="preparing", at=now()))
        await self._send(protocol.AttemptStatus(attempt_id=aid, status="running", phase="task", at=now()))
        if self.work_s:
            await asyncio.sleep(self.work_s)
        res = protocol.AttemptResult(
            attempt_id=aid, outcome="passed", answer="",
            check_before=protocol.CheckOutput(exit_code=0, stdout_tail="False", verdict="False"),
            check_after=protocol.CheckOutput(exit_code=0, stdout_tail="True", verdict="True"),
            metrics=protocol.AttemptMetrics(active_seconds=self.work_s, steps=0), started_at=started,
            finished_at=now(),
        )
        self.unacked[aid] = res  # journaled before it is sent
        self.running.pop(aid, None)
        await self._send(protocol.AttemptFinished(result=res))
