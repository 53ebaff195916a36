"""How big the hot pool is (providers/qemu/pool.py), and what it keeps: its sizes as the config says,
or, with none in it, sized from the slots and the host's free memory; the images the
config keeps hot (`pool.keep`), and how long a source leased here stays hot (`pool.keep_leased_s`).

The pool pays wherever machines are restored from warm snapshots: a lease is then a resume (~20 ms)
instead of a restore (~0.5-0.9 s). What it costs is memory held by paused machines, so the rule
keeps one paused machine per slot and source (a burst of `slots` leases all find one), at most
AUTO_MAX_PER_SOURCE, within a share of the memory free when the runner starts. Without warm
snapshots there is nothing to restore, and on a host short of memory the pool would crowd out the
attempts' own machines: off then, and the start line says why.
"""

from __future__ import annotations

import dataclasses
import functools
from enum import StrEnum
from pathlib import Path
from typing import Any

from providers.qemu.pool import KEEP_LEASED_S

AUTO_MAX_PER_SOURCE = 4
AUTO_MEMORY_SHARE = 4  # the pool may hold a quarter of the memory free at start
AUTO_MAX_MIB = 16384
AUTO_MIN_MIB = 512  # below this the pool is off: it would hold a machine or two at best
MEMINFO = Path("/proc/meminfo")


class PoolSizing(StrEnum):
    CONFIG = "config"  # per_source and total_mib from the config
    AUTO = "auto"  # no sizes in the config (`pool:` unset, or only what it keeps): sized here
    OFF = "off"


@dataclasses.dataclass(frozen=True)
class PoolPlan:
    per_source: int
    total_mib: int
    sizing: PoolSizing
    why: str  # for the start line: where the numbers come from, or why there is no pool
    keep: tuple[str, ...] = ()  # images kept hot from the start; others while leased lately
    keep_leased_s: float = KEEP_LEASED_S

    @property
    def enabled(self) -> bool:
        return self.sizing is not PoolSizing.OFF

    def describe(self) -> str:
        if not self.enabled:
            return f"hot pool off ({self.why})"
        kept = f"keeps {', '.join(self.keep)} and" if self.keep else "keeps"
        return (f"hot pool {self.per_source} per source within {self.total_mib} MiB ({self.why}); {kept} what was "
                f"leased in the last {self.keep_leased_s:g} s")


def free_mib(meminfo: Path = MEMINFO) -> int | None:
    """MemAvailable in MiB, or None where /proc/meminfo does not say."""
    try:
        for line in meminfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "MemAvailable":
                return int(value.split()[0]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@functools.cache
def free_mib_at_start() -> int | None:
    """Read once per process: the provider and the start line that describes it see one number."""
    return free_mib()


def plan_pool(config: Any, free: int | None = None) -> PoolPlan:
    """The pool for a runner config (`pool`, `slots`, `warm_snapshots`); `free` MiB defaults to the
    memory free when the process started."""
    pool = config.pool
    if pool is None:
        return _sized(config, free)
    if pool.per_source is None or pool.total_mib is None:
        plan = _sized(config, free)
    elif pool.per_source > 0 and pool.total_mib > 0:
        plan = PoolPlan(pool.per_source, pool.total_mib, PoolSizing.CONFIG, "from the config")
    else:
        return PoolPlan(0, 0, PoolSizing.OFF, "pool: off in the config")
    if not plan.enabled:
        return plan
    return dataclasses.replace(plan, keep=tuple(pool.keep), keep_leased_s=pool.keep_leased_s)


def _sized(config: Any, free: int | None) -> PoolPlan:
    """The pool's sizes with none in the config: from the slots and the free memory."""
    if not config.warm_snapshots:
        return PoolPlan(0, 0, PoolSizing.OFF, "warm snapshots are off: nothing to restore ahead of time")
    free = free_mib_at_start() if free is None else free
    if free is None:
        return PoolPlan(0, 0, PoolSizing.OFF, "the host's free memory is unknown; set pool: to size it")
    budget = min(free // AUTO_MEMORY_SHARE, AUTO_MAX_MIB)
    if budget < AUTO_MIN_MIB:
        return PoolPlan(0, 0, PoolSizing.OFF, f"only {free} MiB free; set pool: to size it")
    per_source = min(config.slots, AUTO_MAX_PER_SOURCE)
    return PoolPlan(per_source, budget, PoolSizing.AUTO,
                    f"sized from {config.slots} slot(s) and {free} MiB free; pool: off turns it off")
