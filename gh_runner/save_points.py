"""Save points: a running attempt's machine saved (disk and memory) without ending its task.

Each save point is a start-state version like any other (`Machine.save`, providers/base.py): stored as
`<save_point_id>` version 1, so a start state of that id can later be made from it without moving a
file (docs/start-states.md), and the provider interface needs no new method. Saves take turns (one at
a time per machine); past `keep` the oldest are deleted, so a long try holds a bounded number on disk.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import structlog

from gh_wire.protocol import SavePoint
from providers.base import Machine, Provider

log = structlog.get_logger(__name__)

SAVE_TIMEOUT = 900.0  # a memory image and a disk copy of a desktop on a loaded host


def save_point_id(attempt_id: str, n: int) -> str:
    """The n-th save point of an attempt, named as the start state made from it will be (an `ss_` id:
    a case names a start state by it; gh_server/start_states.py `from_save_point`), with the attempt's
    own id in it: never one of the server's 12-character `ss_` ids."""
    return f"ss_{attempt_id.removeprefix('at_')}p{n}"


def _number(sp_id: str) -> int:
    """n of `save_point_id(attempt, n)`; 0 for an id not made so."""
    _, _, n = sp_id.rpartition("p")
    return int(n) if n.isdigit() else 0


class SavePoints:
    """The save points of one attempt's machine, oldest first.

    `kept`: those made before, on an attempt that goes on from one of them (`Lease.restore`): they stay
    listed, count against `keep`, and new ones are numbered after them. `told` hears of each new save
    point (the daemon tells the server, so that the attempt can go on from it if this runner is lost);
    `task_seconds` is the task's own time, recorded on each."""

    def __init__(self, machine: Machine, provider: Provider, attempt_id: str, keep: int, *,
                 kept: list[SavePoint] | None = None, task_seconds: Callable[[], float] | None = None,
                 told: Callable[[SavePoint], Awaitable[None]] | None = None) -> None:
        self._machine = machine
        self._provider = provider
        self._attempt_id = attempt_id
        self._keep = max(1, keep)
        self._lock = asyncio.Lock()
        self.kept: list[SavePoint] = list(kept or [])
        self._made = max((_number(p.save_point_id) for p in self.kept), default=0)
        self._task_seconds = task_seconds
        self._told = told
        self._current: asyncio.Future[SavePoint] | None = None

    async def save(self, step: int) -> SavePoint:
        """Save the machine now; it runs on afterwards. Shielded: a caller cancelled mid-save (the task
        ended) leaves the save to finish, since a machine stopped half-way through a memory save is
        restored only by the save's own end (`settle` waits for it).

        Raises:
            ProviderError: the save failed (nothing of it is kept; the machine runs on).
            TimeoutError: it took longer than SAVE_TIMEOUT.
        """
        self._current = asyncio.ensure_future(self._save(step))
        return await asyncio.shield(self._current)

    async def settle(self) -> None:
        """Wait for a save in progress to end (its outcome is the saver's to report). Never raises but
        CancelledError."""
        if self._current is not None:
            await asyncio.wait({self._current}, timeout=SAVE_TIMEOUT)

    async def _save(self, step: int) -> SavePoint:
        async with self._lock:
            self._made += 1
            sp_id = save_point_id(self._attempt_id, self._made)
            task_s = self._task_seconds() if self._task_seconds is not None else None
            async with asyncio.timeout(SAVE_TIMEOUT):
                saved = await self._machine.save(sp_id, 1, with_memory=True)
            # The task's time as the save began: the guest stood still from then on.
            point = SavePoint(save_point_id=sp_id, step=step, created_at=datetime.now(UTC), bytes=saved.size_bytes,
                              task_seconds=None if task_s is None else round(task_s, 3))
            self.kept.append(point)
            log.info("save point made", attempt_id=self._attempt_id, save_point_id=sp_id, step=step,
                     bytes=saved.size_bytes)
            if self._told is not None:
                try:
                    await self._told(point)
                except Exception as e:  # best effort: the result lists it anyway
                    log.warning("the server was not told of a save point", save_point_id=sp_id,
                                error=f"{type(e).__name__}: {str(e)[:200]}")
            while len(self.kept) > self._keep:
                old = self.kept.pop(0)
                try:
                    await self._provider.delete_version(old.save_point_id, 1)
                except Exception as e:  # kept on disk (held_versions lists it); the log says which
                    log.warning("old save point not deleted", save_point_id=old.save_point_id,
                                error=f"{type(e).__name__}: {str(e)[:200]}")
            return point

    async def every(self, seconds: float, step: Callable[[], int]) -> None:
        """Save every `seconds` until cancelled; a failed save is logged and the next one tried (the
        task goes on: a save point is a safety net, not part of the task)."""
        while True:
            await asyncio.sleep(seconds)
            try:
                await self.save(step())
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("periodic save point failed", attempt_id=self._attempt_id,
                            error=f"{type(e).__name__}: {str(e)[:300]}")
