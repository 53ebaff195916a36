"""One writer thread for the gateway and the scheduler: small DB jobs, committed in batches.

A busy gateway turns thousands of frames a second into tiny writes (a result, a status, a lease).
One commit per frame is what makes SQLite slow, and several threads writing at once is what makes
it lock; so every job goes through one queue, and whatever queued up while the last batch was being
written is written next, in one transaction. A job that fails does not take its batch-mates down:
the batch is rolled back and each job is retried in its own transaction, so jobs must be pure DB
work (no side effects outside the session) and return plain data, never ORM objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)

T = TypeVar("T")
Job = Callable[[Session], Any]


class DbQueue:
    def __init__(self, db: sessionmaker[Session], max_batch: int = 500) -> None:
        self._db = db
        self._max_batch = max_batch
        self._queue: asyncio.Queue[tuple[Job, asyncio.Future[Any]]] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is not None:
            return
        self._queue = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gh-db")
        self._task = asyncio.create_task(self._loop(), name="gh-dbqueue")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._queue is not None:
            while not self._queue.empty():
                _, fut = self._queue.get_nowait()
                if not fut.done():
                    fut.set_exception(RuntimeError("server shutting down"))
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    async def run(self, job: Callable[[Session], T]) -> T:
        """Run `job(session)` in the next batch and return what it returned (or raise what it raised)."""
        if self._queue is None:
            raise RuntimeError("DbQueue not started")
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((job, fut))
        return await fut

    async def _loop(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self._max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                outcomes = await loop.run_in_executor(self._executor, self._apply, [j for j, _ in batch])
            except asyncio.CancelledError:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(RuntimeError("server shutting down"))
                raise
            for (_, fut), (ok, value) in zip(batch, outcomes, strict=True):
                if fut.done():  # the caller gave up (cancelled)
                    continue
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(value)

    def _apply(self, jobs: list[Job]) -> list[tuple[bool, Any]]:
        if len(jobs) > 1:
            with self._db() as session:
                try:
                    values = [job(session) for job in jobs]
                    session.commit()
                    return [(True, v) for v in values]
                except Exception:
                    session.rollback()
        out: list[tuple[bool, Any]] = []
        for job in jobs:
            with self._db() as session:
                try:
                    value = job(session)
                    session.commit()
                    out.append((True, value))
                except Exception as e:
                    session.rollback()
                    log.debug("db job failed", exc_info=True)
                    out.append((False, e))
        return out
