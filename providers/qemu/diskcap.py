"""A cap on what one machine may write to the runner's disk.

A guest can write as fast as its disk allows, and every byte it writes grows its qcow2 overlay on
the runner's disk (its console log grows beside it). The cap is watched by polling what the
machine's directory really allocates (`st_blocks`, so sparse regions do not count), not with
libvirt's block-threshold event: that needs a libvirt event loop thread, which nothing else here
uses, and the event watches only one disk, not the console log. A poll every `interval` seconds
overshoots by at most the guest's write rate times the interval; the lease-time free-space reserve
(`gh_runner.diskguard`) covers that overshoot.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from providers.errors import MachineLimit, MachineLimitExceeded, ProviderError

log = structlog.get_logger("providers.qemu")

MIB = 1024 * 1024
POLL_INTERVAL_S = 0.5


def allocated_bytes(directory: Path) -> int:
    """Bytes the files directly in `directory` take on disk."""
    total = 0
    with contextlib.suppress(FileNotFoundError):
        with os.scandir(directory) as it:
            for entry in it:
                with contextlib.suppress(FileNotFoundError):
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
    return total


class WriteCap:
    """Watches a machine directory; the first time it holds more than `cap` bytes, `stop` is
    awaited once and `exceeded` is set. `close()` ends the watch (idempotent)."""

    def __init__(self, directory: Path, cap: int, stop: Callable[[MachineLimitExceeded], Awaitable[None]],
                 *, interval: float = POLL_INTERVAL_S) -> None:
        self.directory = directory
        self.cap = cap
        self._stop = stop
        self.interval = interval
        self.exceeded: MachineLimitExceeded | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._watch(), name=f"write-cap-{self.directory.name}")

    async def _watch(self) -> None:
        while True:
            used = await asyncio.to_thread(allocated_bytes, self.directory)
            if used > self.cap:
                self.exceeded = MachineLimitExceeded(
                    MachineLimit.DISK_WRITE_CAP,
                    f"the machine wrote {used // MIB} MiB to the runner's disk, over its cap of {self.cap // MIB} MiB "
                    "(machine_disk_cap_mib); it was stopped")
                log.warning("machine over its disk write cap: stopping it", dir=str(self.directory), bytes=used,
                            cap=self.cap)
                try:
                    await self._stop(self.exceeded)
                except ProviderError as e:
                    log.error("could not stop a machine over its disk write cap", reason=str(e))
                return
            await asyncio.sleep(self.interval)

    async def stopped(self) -> None:
        """Once over the cap: wait for the stop to end, so that whoever raises `exceeded` ("it was
        stopped") says what is already true (a script through gh-execd fails the moment QEMU dies,
        before libvirt is done with the domain)."""
        task = self._task
        if self.exceeded is not None and task is not None and task is not asyncio.current_task():
            await asyncio.shield(task)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
