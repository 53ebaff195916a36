"""A task's time limit that stops while a person holds the machine.

Both halves keep one per running task: the runner bounds the task phase with it, the server bounds
the agent with it. A takeover (`task_hold`) pauses both; the hand-back resumes both. What the agent
had left when the hold began is what it has when the hold ends: held time is never the agent's.

    clock = TaskClock(limit_s)
    await clock.expired()      # returns once limit_s of unheld time has passed
    clock.hold(); clock.release()
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class TaskClock:
    def __init__(self, limit_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s = limit_s
        self._now = clock
        self._started = clock()
        self._held_since: float | None = None
        self._held_total = 0.0
        self._changed = asyncio.Event()

    @property
    def held(self) -> bool:
        return self._held_since is not None

    def held_seconds(self) -> float:
        """Time held so far (a hold in progress counts up to now)."""
        extra = self._now() - self._held_since if self._held_since is not None else 0.0
        return self._held_total + extra

    def used(self) -> float:
        """The task's own time so far: elapsed time minus the time held."""
        return max(0.0, self._now() - self._started - self.held_seconds())

    def remaining(self) -> float:
        return max(0.0, self.limit_s - self.used())

    def rewind(self, used_s: float) -> None:
        """Set the task's own time so far to `used_s` (it went back to a save point made then); a hold
        in progress stays one."""
        self._started = self._now() - self.held_seconds() - max(0.0, used_s)
        self._wake()

    def hold(self) -> bool:
        """Stop the clock; False when it was held already."""
        if self._held_since is not None:
            return False
        self._held_since = self._now()
        self._wake()
        return True

    def release(self) -> bool:
        """Start the clock again; False when it was not held."""
        if self._held_since is None:
            return False
        self._held_total += self._now() - self._held_since
        self._held_since = None
        self._wake()
        return True

    async def expired(self) -> None:
        """Return once the limit's worth of unheld time has passed. Woken by hold and release, so a
        hold that begins 1 s before the limit keeps the task going until after the hand-back."""
        while True:
            self._changed.clear()
            wait = None if self._held_since is not None else self.remaining()
            if wait is not None and wait <= 0:
                return
            try:
                async with asyncio.timeout(wait):
                    await self._changed.wait()
            except TimeoutError:
                if self._held_since is None and self.remaining() <= 0:
                    return

    def _wake(self) -> None:
        self._changed.set()


__all__ = ["TaskClock"]
