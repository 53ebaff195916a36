"""The hot pool: machines restored and paused ahead of time, so a lease is a resume.

By demand: the pool keeps hot the sources (an image's current warm snapshot, or a start-state
version with memory) this runner was leased within `keep_leased_s`, and those its config keeps
(`keep`); not every image of the images dir, so an image nobody asks for (a 2 GiB desktop beside
linux-tiny) costs nothing while the runner waits. A lease of a source not hot gets a machine made
as usual, and the pool starts filling for that source then: its next leases find pooled machines.
A source not leased for `keep_leased_s` (and not kept) loses its pooled machines.

Per source kept hot up to `per_source` machines wait paused, all of them within `total_mib` of
guest memory (counted at the manifest's size: an upper bound, since lazy copies share what they do
not write). A machine taken for an attempt gets the attempt's id (domain metadata and owner file,
so the daemon's reaper keeps it), is resumed, and sets its clock like any restored machine. One
machine, one attempt: a taken machine never returns to the pool, and the pool refills in the
background.

Leaks: pooled machines are the provider's own (held until `PoolHost.release`), never reaped while this
process runs;
`close` destroys them; after a crash the runner's start-up reaper removes them like any leftover,
and the new process fills a new pool.

A source that goes away (a start-state version deleted by the server, or evicted from the registry
cache) takes its machines with it: `dropping(gone)` destroys them, waits out one being made of it,
and makes none of it while the caller removes its files, so a paused machine never holds a deleted
version's memory and disk space until the runner closes. A source no longer listed (its files
removed some other way) loses its machines on the next fill pass.

Primed, then paused: a restored machine's first moments are slow, and they are the same for every
machine from a snapshot: under TCG the guest's code is translated again on first run (the first
guest-agent answer after a restore took ~60 ms here, the second ~3 ms), and a lazy copy faults its
RAM pages in on first touch. So the pool resumes each new machine, waits for its guest agent to
answer, runs one empty script through it (the first fork of qemu-ga and busybox after a restore
took ~0.5 s; through gh-execd, where the image has it, that script also connects its port and
sets the clock, whose kernel paths are translated on first run too: see `QemuMachine.prime`), and
pauses it again before counting it. The lease then pays only a resume and an answer,
and the pool hands out only machines whose guest has answered. The guest ran for that moment with
nothing of any attempt in it, and its clock is set by the lease's first script like any restored
machine's.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, Protocol, TypeVar

import structlog

from gh_common.timeouts import within
from providers.base import MachineSource
from providers.errors import ProviderError

log = structlog.get_logger("providers.qemu.pool")

REFILL_RETRY_S = 30.0  # after a failed fill, before trying that source again
# After a take, the refill waits this long: a restore is a CPU-heavy QEMU start (libvirt's CPU
# checks), and the lease's first steps (ready, clock, setup) should not compete with it.
REFILL_DELAY_S = 3.0
FILL_TIMEOUT_S = 300.0
PRIME_TIMEOUT_S = 60.0  # a restored guest answers within a second; a loaded host gets time
# How long a source leased here stays hot after its last lease. The leases of one run of evals come
# seconds to minutes apart (each try is a lease; a slot takes the next try when its last one ends,
# and an attempt's phase bounds besides its task's, `Timeouts` in gh_runner/config.py, add up to
# 22 minutes), and a person reads a run's report before starting the next one: half an hour keeps
# a source hot through all of that. A source idle for longer was last asked for by a run that is
# over, and its paused machines hold their guest memory (2 GiB each for a desktop) for nothing.
# Forgetting it early costs little: its next lease is restored from the warm snapshot as without a
# pool (~0.5 s on linux-tiny), and refills the pool.
KEEP_LEASED_S = 1800.0


@dataclass(frozen=True)
class PoolConfig:
    per_source: int = 0  # K paused machines per source; 0 turns the pool off
    total_mib: int = 0  # guest memory all pooled machines may hold together
    refill_delay_s: float = REFILL_DELAY_S  # after a take, before the refill starts (bench/ compares)
    keep: frozenset[MachineSource] = frozenset()  # hot from the start, leased or not (the config's pool.keep)
    keep_leased_s: float = KEEP_LEASED_S  # a source leased here stays hot this long after its last lease

    @property
    def enabled(self) -> bool:
        return self.per_source > 0 and self.total_mib > 0


class Demand:
    """Which sources the pool keeps hot: those kept by the config, and those leased within
    `keep_leased_s` (pure: the time comes from `clock`)."""

    def __init__(self, keep: frozenset[MachineSource], keep_leased_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.keep = keep
        self.keep_leased_s = keep_leased_s
        self._clock = clock
        self._leased_at: dict[MachineSource, float] = {}

    def leased(self, source: MachineSource) -> bool:
        """`source` was leased now; True when it was not kept hot until now (the pool starts filling)."""
        was = self.wanted(source)
        self._leased_at[source] = self._clock()
        return not was

    def wanted(self, source: MachineSource) -> bool:
        if source in self.keep:
            return True
        at = self._leased_at.get(source)
        return at is not None and self._clock() - at < self.keep_leased_s

    def next_idle_in(self) -> float | None:
        """Seconds until the next leased source (not kept) goes idle; None when none will."""
        now = self._clock()
        left = [at + self.keep_leased_s - now for s, at in self._leased_at.items() if s not in self.keep]
        left = [x for x in left if x > 0]
        return min(left) if left else None

    def forget_idle(self) -> list[MachineSource]:
        """Forget the sources (not kept) whose last lease is `keep_leased_s` old; those forgotten."""
        idle = [s for s in self._leased_at if not self.wanted(s)]
        for s in idle:
            del self._leased_at[s]
        return idle


class DropReason(StrEnum):
    """Why the pool destroys a source's paused machines (the caller's own drops use `dropping`)."""

    GONE = "gone"  # no longer listed: its files were removed
    IDLE = "idle"  # not leased for keep_leased_s, and not kept by the config


class PooledMachine(Protocol):
    """What the pool needs of a machine."""

    @property
    def machine_id(self) -> str: ...
    @property
    def restored(self) -> bool: ...  # made from a memory image (a cold boot is no use paused)

    async def destroy(self) -> None:
        """Raises ProviderError (the reaper removes what is left)."""


M = TypeVar("M", bound=PooledMachine)


class PoolHost(Protocol[M]):
    """What the pool needs of whoever makes its machines (the QEMU provider), and nothing more."""

    async def make_paused(self, machine_id: str, source: MachineSource, *, timeout: float) -> M:
        """A machine of `source`, restored if it can be, left paused; the host keeps it out of the
        reaper's way until `release`. Raises ProviderError (nothing of it is left)."""

    async def prime(self, machine: M, timeout: float) -> float:
        """Run the paused machine until its guest answers, pause it again; the seconds the answer
        took. Raises ProviderError (MachineNotReady: no answer)."""

    async def adopt(self, machine: M, machine_id: str) -> None:
        """Make the paused machine `machine_id`'s (the reaper keeps it from now on) and resume it.
        Raises ProviderError."""

    def release(self, machine_id: str) -> None:
        """The pool no longer holds `machine_id` (the reaper may take what is left of it)."""


@dataclass
class _Pooled(Generic[M]):
    machine: M
    key: str  # the source's version (snapshot key or start-state version): stale when it changes
    mib: int
    made_at: float
    primed_s: float  # how long the guest took to answer after its restore (logged; see the docstring)


class HotPool(Generic[M]):
    def __init__(self, host: PoolHost[M], config: PoolConfig,
                 sources: Callable[[], Awaitable[list[tuple[MachineSource, str, int]]]]) -> None:
        """`sources()` lists what could be kept hot now: (source, its version key, guest MiB); the pool
        keeps those `config` and the leases ask for (`Demand`)."""
        self.host = host
        self.config = config
        self._sources = sources
        self.demand = Demand(config.keep, config.keep_leased_s)
        self._idle_timer: asyncio.TimerHandle | None = None
        self._missing_kept: set[MachineSource] = set()  # kept by the config, not listed: said once
        self._ready: dict[MachineSource, list[_Pooled[M]]] = {}
        self._discarding: set[asyncio.Future[None]] = set()  # destroys of pooled machines still running
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failed_at: dict[MachineSource, float] = {}
        self.taken = 0
        # Sources going away (`dropping`): none of them is made until the caller has removed its files.
        self._going: list[Callable[[MachineSource], bool]] = []
        self._drops = 0  # bumped by each `dropping`: a fill pass listed before one lists again
        self._making: MachineSource | None = None  # the source a machine is being made of now
        self._made = asyncio.Event()  # set whenever no machine is being made
        self._made.set()

    def start(self) -> None:
        if self._task is None and self.config.enabled:
            self._task = asyncio.create_task(self._refill_loop(), name="hot-pool")
            self._wake.set()

    def wake(self) -> None:
        """Fill now (a source was added: a version saved or pulled here)."""
        self._wake.set()

    def counts(self) -> dict[MachineSource, int]:
        return {s: len(ms) for s, ms in self._ready.items() if ms}

    async def hot_sources(self) -> list[MachineSource]:
        """The sources kept hot now (listed, and kept or leased recently): what the runner advertises."""
        return [s for s, _, _ in await self._sources() if self.demand.wanted(s)]

    def _used_mib(self) -> int:
        return sum(p.mib for ms in self._ready.values() for p in ms)

    async def take(self, machine_id: str, source: MachineSource, key: str) -> M | None:
        """A paused machine for `source`, made the attempt's and resumed; None when there is none
        (or it could not be resumed: it is destroyed, and the caller makes a machine as usual). A
        source not hot until now is kept hot from now on: the pool starts filling for it."""
        if self.demand.leased(source):
            log.info("hot pool keeps a source leased here", source=str(source),
                     keep_leased_s=self.config.keep_leased_s)
            # After the delay, as after a take: the lease's own machine is being made meanwhile.
            asyncio.get_running_loop().call_later(self.config.refill_delay_s, self._wake.set)
        ready = self._ready.get(source) or []
        while ready:
            entry = ready.pop(0)
            asyncio.get_running_loop().call_later(self.config.refill_delay_s, self._wake.set)
            if entry.key != key:  # the image or version changed since it was made
                await self._discard(entry.machine)
                continue
            try:
                await self.host.adopt(entry.machine, machine_id)
            except ProviderError as e:
                log.warning("pooled machine could not be resumed; making one", reason=str(e))
                await self._discard(entry.machine)
                return None
            self.taken += 1
            return entry.machine
        return None

    async def _discard(self, machine: M) -> None:
        """Destroy a pooled machine to the end: shielded, so a refill task cancelled by `close` cannot
        stop it between the domain's destroy and the removal of its files (`close` waits for it)."""
        task = asyncio.ensure_future(self._destroy(machine))
        self._discarding.add(task)
        task.add_done_callback(self._discarding.discard)
        await asyncio.shield(task)

    async def _destroy(self, machine: M) -> None:
        try:
            await machine.destroy()
        except ProviderError as e:
            log.warning("pooled machine not destroyed; the reaper will", reason=str(e))
        finally:
            self.host.release(machine.machine_id)

    async def _refill_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._fill_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("hot pool refill failed")
                self._wake.set()
                await asyncio.sleep(REFILL_RETRY_S)

    async def _fill_once(self) -> None:
        drops = self._drops
        candidates = await self._sources()
        names = {source for source, _, _ in candidates}
        self._say_missing_kept(names)
        for source in self.demand.forget_idle():
            log.info("hot pool no longer keeps a source: not leased here lately", source=str(source),
                     keep_leased_s=self.config.keep_leased_s)
        self._wake_when_idle()
        listed = [c for c in candidates if self.demand.wanted(c[0])]
        await self._drop_unlisted({source for source, _, _ in listed}, names)
        for source, key, mib in listed:
            ready = self._ready.setdefault(source, [])
            for stale in [p for p in ready if p.key != key]:
                ready.remove(stale)
                await self._discard(stale.machine)
            failed = self._failed_at.get(source)
            if failed is not None and time.monotonic() - failed < REFILL_RETRY_S:
                continue
            while len(ready) < self.config.per_source and self._used_mib() + mib <= self.config.total_mib:
                if self._drops != drops:  # a source went away since the listing: list again
                    self._wake.set()
                    return
                if self._is_going(source):
                    break
                self._making = source
                self._made.clear()
                try:
                    made = await self._make_one(source)
                    if made is not None and self._is_going(source):
                        # NOTE: destroyed before `_made` is set: a `dropping` of this source waits for
                        # it, so no machine of it is left when the caller removes its files.
                        await self._discard(made[0])
                        made = None
                finally:
                    self._making = None
                    self._made.set()
                if made is None:
                    break
                m, primed_s = made
                ready.append(_Pooled(m, key, mib, time.time(), primed_s))
                log.info("hot pool filled", source=str(source), ready=len(ready), used_mib=self._used_mib(),
                         primed_s=round(primed_s, 3))

    def _is_going(self, source: MachineSource) -> bool:
        return any(gone(source) for gone in self._going)

    async def _drop_unlisted(self, listed: set[MachineSource], present: set[MachineSource]) -> None:
        """Destroy the machines of sources no longer kept hot: not `present` (their files went some
        other way), or present but no longer wanted (idle)."""
        for source in [s for s in self._ready if s not in listed]:
            entries = self._ready.pop(source)
            self._failed_at.pop(source, None)
            reason = DropReason.IDLE if source in present else DropReason.GONE
            for entry in entries:
                log.info("hot pool destroys a machine of a source it no longer keeps", source=str(source),
                         reason=reason, machine_id=entry.machine.machine_id)
                await self._discard(entry.machine)

    def _wake_when_idle(self) -> None:
        """A fill pass when the next leased source goes idle, so its machines go then."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        left = self.demand.next_idle_in()
        if left is not None:
            self._idle_timer = asyncio.get_running_loop().call_later(left, self._wake.set)

    def _say_missing_kept(self, listed: set[MachineSource]) -> None:
        """Warn once per source the config keeps that is not here to keep (no such image, or none
        with a warm snapshot); said again if it goes after being found."""
        missing = set(self.demand.keep) - listed
        for source in missing - self._missing_kept:
            log.warning("hot pool cannot keep a source the config names: not in the images dir, or it "
                        "has no warm snapshot", source=str(source))
        self._missing_kept = missing

    @contextlib.asynccontextmanager
    async def dropping(self, gone: Callable[[MachineSource], bool]) -> AsyncIterator[int]:
        """Destroy every pooled machine of the sources `gone` names (waiting out one being made of
        one of them), and make none of them until the block ends: the caller removes their files in
        it. Yields how many machines were destroyed.

        Raises:
            TimeoutError: a machine of one of them was still being made after the fill's bound (it is
                destroyed when it is done; the block does not run).
        """
        self._going.append(gone)
        self._drops += 1
        try:
            while self._making is not None and gone(self._making):
                await within(FILL_TIMEOUT_S + PRIME_TIMEOUT_S, self._made.wait())
            destroyed = 0
            for source in [s for s in self._ready if gone(s)]:
                entries = self._ready.pop(source)
                self._failed_at.pop(source, None)
                for entry in entries:
                    await self._discard(entry.machine)
                    destroyed += 1
            if destroyed:
                log.info("hot pool machines destroyed: their source goes away", machines=destroyed)
            yield destroyed
        finally:
            self._going.remove(gone)

    async def _make_one(self, source: MachineSource) -> tuple[M, float] | None:
        """A restored, primed, paused machine of `source` and its priming time; None (the source
        marked failed, so it waits REFILL_RETRY_S, and nothing left behind) when there is none."""
        mid = f"pool-{secrets.token_hex(4)}"
        try:
            m = await self.host.make_paused(mid, source, timeout=FILL_TIMEOUT_S)
        except ProviderError as e:
            self._failed(source, "hot pool could not make a machine", str(e))
            return None
        if not m.restored:  # no snapshot to start from: a paused cold machine saves nothing
            await self._discard(m)
            self._failed(source, "hot pool found no snapshot to restore", "the machine booted cold")
            return None
        try:
            return m, await self.host.prime(m, PRIME_TIMEOUT_S)
        except asyncio.CancelledError:  # the pool is closing: this machine is in no list close() empties
            await self._discard(m)  # shielded: it ends even though we are cancelled
            raise
        except ProviderError as e:  # never handed out: a guest that does not answer here will not later
            await self._discard(m)
            self._failed(source, "hot pool machine did not answer after its restore", str(e))
            return None

    def _failed(self, source: MachineSource, what: str, reason: str) -> None:
        self._failed_at[source] = time.monotonic()
        log.warning(what, source=str(source), reason=reason)

    async def close(self) -> None:
        """Stop refilling and destroy every pooled machine."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await asyncio.gather(*self._discarding, return_exceptions=True)  # those the refill task began
        for ms in self._ready.values():
            while ms:
                await self._discard(ms.pop().machine)
