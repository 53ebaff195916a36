"""The scheduler loop of one gh-server process: leases, housekeeping, run completion, at a steady beat.

The decisions are the other modules' (`lease`, `states`, `completion`); this runs them through the
`DbQueue` and does the talking afterwards (leases and cancels go out through the `LeaseSink`, the
gateway, gh_server/ports.py). What lives in memory here is only a cache of frozen run cases and a short "this runner
refused that attempt" list, both safe to lose.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from gh_common.timeouts import timeout
from gh_server.attempts.completion import complete_runs
from gh_server.attempts.lease import RunCaseCache, SavePointPolicy, lease_pass
from gh_server.attempts.matching import RETRY_BACKOFF_S, RefusalList
from gh_server.attempts.resume import resume_elsewhere
from gh_server.attempts.states import cancel_attempts_of_cancelled_runs, expire_disconnected, release_lease
from gh_server.dbqueue import DbQueue
from gh_server.ports import LeaseSink
from gh_wire import protocol
from gh_wire.vocab import CancelReason

log = logging.getLogger(__name__)

HOUSEKEEPING_EVERY_S = 1.0
COMPLETION_CHECK_EVERY_S = 0.2


class Scheduler:
    def __init__(
        self,
        dbq: DbQueue,
        sink: LeaseSink,
        wakeup: asyncio.Event,
        *,
        grace_s: float,
        dead_after_s: float,
        judge_configured: bool = False,
        script_timeout: float = 600.0,
        save_points: SavePointPolicy = SavePointPolicy(),
        poll_s: float = 1.0,
        retry_backoff_s: tuple[float, ...] = RETRY_BACKOFF_S,
    ) -> None:
        self.dbq = dbq
        self.sink = sink
        self.wakeup = wakeup
        self.grace_s = grace_s
        self.dead_after_s = dead_after_s
        self.judge_configured = judge_configured
        self.script_timeout = script_timeout
        self.save_points = save_points
        self.poll_s = poll_s
        self.refusals = RefusalList(retry_backoff=retry_backoff_s)
        self.cache = RunCaseCache()
        self._dirty_runs: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._last_housekeeping = 0.0
        self._last_completion_check = 0.0
        self.passes = 0
        self.on_leased: Callable[[list[float]], None] | None = None  # seconds queued, per lease sent (metrics)
        # DB jobs housekeeping runs every so many seconds, as (interval, job): app.py sets them (the queue's
        # log and its timeouts, gh_server.queue_wait); their last runs, by index.
        self.periodic: list[tuple[float, Callable[[Session], Any]]] = []
        self._last_periodic: dict[int, float] = {}

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="gh-scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def run_changed(self, run_id: str | None) -> None:
        """An attempt of this run finished: check (soon, coalesced) whether the run is complete."""
        if run_id:
            self._dirty_runs.add(run_id)
            self.wakeup.set()

    def poke(self) -> None:
        self.wakeup.set()

    def space_retry(self, retry_id: str, after_runner_id: str, attempts_so_far: int) -> None:
        """A retry after an error of ours waits a little (a hypervisor restarting, a disk filling: the
        cause often passes within seconds) and goes to another runner when there is one."""
        self.refusals.hold_retry(retry_id, after_runner_id, attempts_so_far)

    async def refused(self, attempt_id: str, runner_id: str, code: protocol.LeaseRefusal | None = None) -> None:
        """A runner refused a lease: back to the queue, and that runner left alone for as long as `code` says."""
        self.refusals.add(attempt_id, runner_id, code)
        await self.dbq.run(lambda s: release_lease(s, attempt_id, runner_id))
        self.wakeup.set()

    async def _loop(self) -> None:
        while True:
            wait = COMPLETION_CHECK_EVERY_S if self._dirty_runs else self.poll_s
            with contextlib.suppress(TimeoutError):
                async with timeout(wait):
                    await self.wakeup.wait()
            self.wakeup.clear()
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("scheduler pass failed; retrying on the next tick")
                await asyncio.sleep(self.poll_s)  # back off: a broken DB would otherwise spin

    async def tick(self) -> None:
        now = time.monotonic()
        if now - self._last_housekeeping >= HOUSEKEEPING_EVERY_S:
            self._last_housekeeping = now
            await self.housekeeping()
        # Whether a run is complete costs a look at its attempts: done at most a few times a second, so
        # that cost does not grow with the rate at which results arrive.
        if self._dirty_runs and now - self._last_completion_check >= COMPLETION_CHECK_EVERY_S:
            self._last_completion_check = now
            runs, self._dirty_runs = self._dirty_runs, set()
            await self.dbq.run(lambda s: complete_runs(s, runs))
        await self.lease_once()

    async def housekeeping(self) -> None:
        grace, dead = self.grace_s, self.dead_after_s
        elsewhere, skip = self.sink.restoring_runner_ids(), self.refusals
        script_timeout, policy = self.script_timeout, self.save_points

        def restore(s: Session, aid: str) -> tuple[str, protocol.Lease] | None:
            return resume_elsewhere(s, aid, elsewhere, skip, script_timeout=script_timeout, policy=policy)

        expired = await self.dbq.run(lambda s: expire_disconnected(s, grace, dead, restore if elsewhere else None))
        if expired.failed:
            log.info("errored %d attempts of runners gone past the grace period", len(expired.failed))
        for rid, lease in expired.moved:
            await self.sink.resumed_elsewhere(rid, lease)
        self._dirty_runs |= expired.runs
        for aid, rid in await self.dbq.run(cancel_attempts_of_cancelled_runs):
            await self.sink.send(rid, protocol.Cancel(attempt_id=aid, reason=CancelReason.RUN_CANCELLED))
        await self.dbq.run(lambda s: complete_runs(s, None))
        self.refusals.prune()
        now = time.monotonic()
        for i, (every, job) in enumerate(self.periodic):
            if now - self._last_periodic.get(i, 0.0) >= every:
                self._last_periodic[i] = now
                await self.dbq.run(job)

    async def lease_once(self) -> int:
        runner_ids = self.sink.local_runner_ids()
        if not runner_ids:
            return 0
        skip, cache, judge = self.refusals, self.cache, self.judge_configured
        script_timeout, save_points = self.script_timeout, self.save_points
        result = await self.dbq.run(
            lambda s: lease_pass(s, runner_ids, skip, cache, judge, script_timeout=script_timeout,
                                 save_points=save_points))
        self.passes += 1
        for run in result.failed_runs:
            self._dirty_runs.add(run)
        if result.failed_runs:
            self.wakeup.set()
        # Concurrently: one slow socket must not hold up every other runner's leases.
        oks = await asyncio.gather(*(self.sink.send(g.runner_id, result.messages[g.attempt_id]) for g in result.grants))
        undelivered = [g for g, ok in zip(result.grants, oks, strict=True) if not ok]
        if undelivered:
            await self.dbq.run(lambda s: [release_lease(s, g.attempt_id, g.runner_id) for g in undelivered])
        sent = len(result.grants) - len(undelivered)
        if self.on_leased is not None and sent:
            gone = {g.attempt_id for g in undelivered}
            self.on_leased([w for g, w in zip(result.grants, result.waited, strict=True) if g.attempt_id not in gone])
        if result.grants:
            self.wakeup.set()  # there may be more to lease (pages, other runners)
        return sent
