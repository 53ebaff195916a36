"""Bounded worker pools for the slow calls a gh-server process makes: agents, the rubric judge and the
simulated customer.

Why a pool and not a bare `await`: these calls take seconds to minutes (a model endpoint's timeout is
120 s by default), and what awaits them must not be a loop that other work waits behind (the
gateway's read loop answers every slot's machine requests). A pool gives each kind of call its own
concurrency bound (a burst of rubric results does not open a hundred connections to the judge) and its
own deadline (the whole call, waiting for a free worker included, so nothing waits forever).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from gh_common import timeouts

log = logging.getLogger(__name__)

T = TypeVar("T")

# Called after each job: (pool name, seconds taken, "ok" | "timeout" | "error"). The metrics plug in here.
Observer = Callable[[str, float, str], None]


class PoolTimeout(TimeoutError):
    """A job did not finish within its pool's deadline (it was cancelled)."""

    def __init__(self, pool: str, timeout: float) -> None:
        super().__init__(f"{pool} did not finish within {timeout:g} s")
        self.pool = pool
        self.timeout = timeout


class WorkPool:
    """At most `size` jobs at once; each job (queueing included) bounded by `timeout` seconds."""

    def __init__(self, name: str, size: int, timeout: float, observer: Observer | None = None) -> None:
        if size < 1:
            raise ValueError(f"pool {name}: size must be at least 1")
        self.name = name
        self.size = size
        self.timeout = timeout
        self.observer = observer
        self._sem = asyncio.Semaphore(size)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.running = 0
        self.waiting = 0

    async def run(self, job: Callable[[], Awaitable[T]], timeout: float | None = None) -> T:
        """`await job()` in a free worker, within `timeout` (the pool's when None).

        Raises:
            PoolTimeout: the deadline passed (waiting for a worker counts); the job was cancelled.
            Whatever the job raised.
        Cancelling the caller cancels the job.
        """
        bound = self.timeout if timeout is None else timeout
        start = time.monotonic()
        outcome = "error"
        try:
            async with timeouts.timeout(bound):
                self.waiting += 1
                try:
                    await self._sem.acquire()
                finally:
                    self.waiting -= 1
                self.running += 1
                try:
                    value = await job()
                finally:
                    self.running -= 1
                    self._sem.release()
            outcome = "ok"
            return value
        except TimeoutError:
            outcome = "timeout"
            raise PoolTimeout(self.name, bound) from None
        finally:
            if self.observer is not None:
                with contextlib.suppress(Exception):
                    self.observer(self.name, time.monotonic() - start, outcome)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run a coroutine (that uses `run` itself) in the background, held until done; `stop` cancels it."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s job %s failed", self.name, task.get_name(), exc_info=task.exception())

    async def stop(self) -> None:
        """Cancel the background jobs and wait for them (idempotent)."""
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
