"""What the API, the gateway and the scheduler share inside one gh-server process (on app.state.gh).

Scheduling state lives in the database; this holds only handles and the in-process wake-up. The
gateway's port is gh_server/ports.py's `GatewayPort`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from gh_server.metrics import ServerMetrics
from gh_server.ports import GatewayPort
from gh_server.settings import Settings


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
    # key ends (the live relay's views, gh_server/live/screen_relay.py).
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
