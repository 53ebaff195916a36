"""What the API, the gateway and the scheduler share inside one gh-server process (on app.state.gh).

Scheduling state lives in the database; this holds only handles and the in-process wake-up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

import pydantic
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from gh_server.metrics import ServerMetrics
from gh_server.ports import AgentHost
from gh_server.settings import Settings
from gh_wire import protocol


class GatewayPort(Protocol):
    async def kick(self, runner_id: str, code: int, reason: str) -> None:
        """Close that runner's socket now (revoked)."""

    async def machine_request(
        self, runner_id: str, req: protocol.MachineRequest, timeout: float
    ) -> protocol.MachineResponse: ...

    async def send(self, runner_id: str, msg: pydantic.BaseModel) -> bool:
        """False if the runner is not connected to this process."""

    def connected(self, runner_id: str) -> bool: ...

    def takes_views(self, runner_id: str) -> bool:
        """Connected to this process and takes `view_open` (gh_server/live/relay.py)."""

    def task_time_left(self, attempt_id: str) -> float | None:
        """Seconds of limits.minutes the attempt's agent has left, held time not counted; None when its
        agent does not run in this process."""

    @property
    def agents(self) -> AgentHost:
        """The agents of this process and their machine API (instruction start states use it too)."""


@dataclass
class ServerState:
    settings: Settings
    engine: Engine
    db: sessionmaker[Session]
    # Set when attempts are queued/cancelled or a runner frees slots; the scheduler waits on it.
    wakeup: asyncio.Event | None = None
    gateway: GatewayPort | None = None
    # Set when a webhook delivery is enqueued, so the worker does not wait for its next poll.
    webhook_wakeup: asyncio.Event | None = None
    # Long-running coroutines started in the app's lifespan and cancelled at shutdown
    # (app.py appends the gateway with its scheduler; webhooks its delivery worker).
    background: list[Callable[[ServerState], Coroutine[Any, Any, None]]] = field(default_factory=list)
    extras: dict[str, object] = field(default_factory=dict)
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    # Called on the server's loop with the id of a key just revoked: what this process holds for that
    # key ends (the live relay's views, gh_server/live/relay.py).
    on_key_revoked: list[Callable[[str], object]] = field(default_factory=list)

    def key_revoked(self, key_id: str) -> None:
        """A key was revoked (safe from any thread): run the `on_key_revoked` hooks on the server's loop."""
        loop = self.extras.get("loop")
        for hook in self.on_key_revoked:
            if isinstance(loop, asyncio.AbstractEventLoop) and loop.is_running():
                loop.call_soon_threadsafe(hook, key_id)
            else:
                hook(key_id)

    def wake(self) -> None:
        """Nudge the scheduler (safe from any thread: the event belongs to the server's loop)."""
        ev = self.wakeup
        if ev is None:
            return
        loop = self.extras.get("loop")
        if isinstance(loop, asyncio.AbstractEventLoop) and loop.is_running():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                ev.set()
            else:
                loop.call_soon_threadsafe(ev.set)
        else:
            ev.set()

    def wake_webhooks(self) -> None:
        ev = self.webhook_wakeup
        loop = self.extras.get("loop")
        if ev is None:
            return
        if isinstance(loop, asyncio.AbstractEventLoop) and loop.is_running():
            loop.call_soon_threadsafe(ev.set)
        else:
            ev.set()
