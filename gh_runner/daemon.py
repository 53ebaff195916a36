"""The runner daemon: slots, leases, routing to attempts, the journal, the reaper, drain.

One `Daemon` owns one `Session` (the websocket), one `Journal` (state dir) and one provider. It
takes at most `slots` attempts (and slot-holding start-state jobs) at once; a lease beyond that,
for an image or start-state version it does not have, or while draining, is refused with a reason.

Journal writes run on a small dedicated thread pool, so a slow or contended disk never stalls the
event loop (heartbeats, other attempts) and attempts finishing together fsync in parallel. Within
one attempt they are ordered by its lock: a phase note can never land after the result that ends
the attempt.

Life of a lease: check a slot -> [a version not held here: pull it from the registry, holding the
slot; a registry fault refuses the lease with a typed reason] -> journal the in-flight record
(fsync) -> `lease_accept` -> run `Attempt.run()` in its own task (attempt id bound in the log
context) -> journal the result (fsync) and drop the in-flight record -> `attempt_result`, re-sent
after every reconnect and every `result_resend` seconds until `result_ack`.

Shutdown: the first SIGTERM/SIGINT drains (no new leases; running attempts get `drain_grace`
seconds, then are cancelled with a reason and report `error`; results get a short while to be
acknowledged), then the process exits 0. A second signal forces: everything is cancelled at once
and the exit code is 1. Results not yet acknowledged stay in the journal for the next start.

Hooks (`observers`): any object with some of the methods of `DaemonObserver`; each is called on
the event loop, must return quickly and never raise (exceptions are logged and ignored). This is
where sd_notify and Prometheus plug in without the daemon knowing about them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

import structlog

from gh_common.timeouts import within
from gh_runner import __version__, diskguard
from gh_runner.attempt import FETCH
from gh_runner.config import RunnerConfig, Timeouts
from gh_runner.hypervisor import HypervisorWatch
from gh_runner.journal import DiskFull, InflightRecord, Journal, is_safe_id
from gh_runner.library import FetchRefused, Library, open_registry
from gh_runner.log import bind_attempt, get_logger, redactor
from gh_runner.poolsize import plan_pool
from gh_runner.registry import RegistryError
from gh_runner.session import Backoff, Session
from gh_wire.protocol import (
    ATTEMPT_STATUSES,
    AttemptFinished,
    AttemptResult,
    AttemptStatus,
    Cancel,
    ErrorMsg,
    Heartbeat,
    HeldVersion,
    Hello,
    ImageAd,
    InFlightPhase,
    Job,
    JobResult,
    Lease,
    LeaseAccept,
    LeaseRefusal,
    LeaseRefuse,
    MachineRequest,
    MachineResponse,
    ReplayFrame,
    ResultAck,
    StatusAck,
    TaskEnd,
    Welcome,
)
from providers.base import ImageInfo, Provider, ProviderError

T = TypeVar("T")
PROVIDER_CALL_TIMEOUT = 300.0  # list_images/reap/held_versions on a loaded host
FORCED_TEARDOWN = 10.0  # after a second stop signal, how long cancelled attempts get to destroy machines
TEST_PROVIDER_ENV = "GH_RUNNER_TEST_PROVIDER"  # test-only: module:factory(config) -> Provider


class DaemonObserver:
    """The daemon's hook points. Subclass and override what you need, or pass any object with some
    of these methods (missing ones are skipped). Called on the event loop; keep them quick.

    - `connected(runner_id)` / `disconnected(reason)`: the session got a welcome / lost it.
    - `welcome(welcome)`: the full welcome (heartbeat interval, dead-peer bound).
    - `reconnect_scheduled(failures, delay)`: the next dial is in `delay` seconds.
    - `revoked()`: not emitted separately; a revoked token shows as `disconnected` with the reason.
    - `busy_changed(busy, slots)`: slots in use changed (attempts plus slot-holding jobs).
    - `attempt_started(attempt_id)`, `attempt_finished(result)`: outcome, error and
      `result.metrics.phase_seconds` (phase durations) are in the result.
    - `lease_refused(attempt_id, reason)`.
    - `journal_backlog(pending)`: results journaled but not yet acknowledged.
    - `reaped(machine_ids)`: leftovers the reaper destroyed (start-up and timer).
    - `hypervisor(up, reason)`: the hypervisor stopped answering (the runner pauses) or answers again.
    - `destroy_leftovers(n)`: machines whose destroy failed and is being retried in the background.
    - `draining(in_flight)`: the first stop signal arrived; `stopped(exit_code)`: about to exit.
    - `tick()`: every `tick_interval` seconds while the event loop is healthy (watchdog ping).
    """

    def connected(self, runner_id: str) -> None: ...
    def disconnected(self, reason: str) -> None: ...
    def welcome(self, welcome: Welcome) -> None: ...
    def reconnect_scheduled(self, failures: int, delay: float) -> None: ...
    def busy_changed(self, busy: int, slots: int) -> None: ...
    def attempt_started(self, attempt_id: str) -> None: ...
    def attempt_finished(self, result: AttemptResult) -> None: ...
    def lease_refused(self, attempt_id: str, reason: str) -> None: ...
    def journal_backlog(self, pending: int) -> None: ...
    def reaped(self, machine_ids: list[str]) -> None: ...
    def hypervisor(self, up: bool, reason: str | None) -> None: ...
    def destroy_leftovers(self, n: int) -> None: ...
    def draining(self, in_flight: int) -> None: ...
    def stopped(self, exit_code: int) -> None: ...
    def tick(self) -> None: ...


class AttemptLike(Protocol):
    """What the daemon needs of `gh_runner.attempt.Attempt` (see prompts' attempt interface)."""

    machine_id: str

    async def run(self) -> AttemptResult: ...
    async def handle_request(self, req: MachineRequest) -> MachineResponse: ...
    def task_end(self, msg: TaskEnd) -> None: ...
    def agent_started(self, late_seconds: float | None = None) -> None: ...
    def cancel(self, reason: str) -> None: ...
    async def wait_torn_down(self) -> None: ...


class JobsLike(Protocol):
    """What the daemon needs of `gh_runner.jobs.StartStateJobs`."""

    @property
    def open_machine_ids(self) -> set[str]: ...
    def holds_slot(self, job: Job) -> bool: ...
    def is_open(self, start_state_id: str) -> bool: ...
    def expect(self, job: Job) -> None: ...
    async def run(self, job: Job) -> JobResult: ...
    async def handle_request(self, req: MachineRequest) -> MachineResponse: ...
    async def close_all(self) -> None: ...


AttemptFactory = Callable[[Lease, Provider, Any, Timeouts], AttemptLike]


def default_attempt_factory(lease: Lease, provider: Provider, link: Any, timeouts: Timeouts) -> AttemptLike:
    from gh_runner.attempt import Attempt

    return Attempt(lease, provider, link, timeouts, background_teardown=True)


def registered_name_file(state_dir: Path) -> Path:
    """Where a runner not given --name remembers the name it was registered with."""
    return state_dir / "registered-name"


def remembered_name(state_dir: Path) -> str | None:
    try:
        name = registered_name_file(state_dir).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return name or None


def make_provider(config: RunnerConfig) -> Provider:
    """The QEMU provider, or (tests only) the factory named by GH_RUNNER_TEST_PROVIDER."""
    hook = os.environ.get(TEST_PROVIDER_ENV)
    if hook:
        module, _, attr = hook.partition(":")
        factory = getattr(importlib.import_module(module), attr or "make_provider")
        get_logger().warning("using a test provider: not for production", hook=hook)
        provider: Provider = factory(config)
        return provider
    from providers.base import MachineSource
    from providers.qemu import QemuProvider  # type: ignore[attr-defined]
    from providers.qemu.pool import PoolConfig

    plan = plan_pool(config)
    pool = PoolConfig(per_source=plan.per_source, total_mib=plan.total_mib, keep_leased_s=plan.keep_leased_s,
                      keep=frozenset(MachineSource(image=name) for name in plan.keep))
    qemu: Provider = QemuProvider(config.images_dir, config.state_dir, config.name, config.libvirt_uri,
                                  write_cap_bytes=config.machine_disk_cap_mib * diskguard.MIB,
                                  warm_snapshots=config.warm_snapshots, pool=pool)
    return qemu


@dataclass
class _Running:
    lease: Lease
    attempt: AttemptLike
    record: InflightRecord
    task: asyncio.Task[None] | None = None
    redact: set[str] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # orders this attempt's journal writes
    fetch_seconds: float | None = None  # the `fetch` phase: the pull of its version before the accept
    uses_version: tuple[str, int] | None = None  # marked in use in the library until the attempt ends


class _Link:
    """The AttemptLink the daemon gives each attempt: statuses (at least once: noted in the in-flight
    record, which the next hello reports) and replay frames (best effort)."""

    def __init__(self, daemon: Daemon, attempt_id: str) -> None:
        self._d = daemon
        self.attempt_id = attempt_id
        self._seq = 0

    @property
    def status_acks(self) -> bool:
        return self._d.status_acks

    async def status(self, status: str, phase: str) -> None:
        d = self._d
        running = d._attempts.get(self.attempt_id)
        at = datetime.now(UTC)
        if running is not None and status != "done":  # "done" is followed at once by the result itself
            # Noted before it is sent: a crash report never names an earlier phase than the server saw,
            # and a status lost with the link reaches the server in the next hello.
            await d._note_phase(running, status, phase, at)
        try:
            msg = AttemptStatus(attempt_id=self.attempt_id, status=status,  # type: ignore[arg-type]
                                phase=phase, at=at)
        except ValueError:
            d.log.warning("attempt reported an unknown status", attempt_id=self.attempt_id, status=status)
            return
        await d.send_message(msg)

    async def frame(self, label: str, png: bytes, event: dict[str, Any] | None) -> None:
        seq = self._seq
        self._seq += 1
        await self._d.send_message(ReplayFrame(
            attempt_id=self.attempt_id, seq=seq, at=datetime.now(UTC), label=label,
            png_b64=base64.b64encode(png).decode(), event=event))


class Daemon:
    def __init__(
        self,
        config: RunnerConfig,
        provider: Provider,
        *,
        attempt_factory: AttemptFactory | None = None,
        jobs: JobsLike | None = None,
        observers: Sequence[Any] = (),
        journal: Journal | None = None,
        backoff: Backoff | None = None,
        session_sleep: Callable[[float], Any] | None = None,
        tick_interval: float = 1.0,
        adopt_registered_name: bool = False,
        library: Library | None = None,
        probe_interval: float = 10.0,
    ) -> None:
        """`adopt_registered_name`: this runner was not given a name (it has its hostname), so it takes
        the one it was registered with: the first welcome that says another name stops it cleanly with
        `restart_as` set, and the CLI starts it again under that name (see `registered_name_file`)."""
        self.config = config
        self.adopt_registered_name = adopt_registered_name
        self.restart_as: str | None = None
        self.provider = provider
        self.attempt_factory = attempt_factory or default_attempt_factory
        self.log = get_logger("gh_runner.daemon", runner=config.name)
        self.library_problem: str | None = None  # why the configured registry cannot be used (said at start)
        self.library = library if library is not None else self._default_library(config, provider)
        self.jobs = jobs if jobs is not None else self._default_jobs(provider, self.library)
        self.observers = list(observers)
        self.journal = journal or Journal(config.state_dir)
        self.tick_interval = tick_interval
        self._attempts: dict[str, _Running] = {}
        self._fetching: set[str] = set()  # attempt ids whose version is being pulled: each holds a slot
        self._fetch_tasks: set[asyncio.Task[None]] = set()
        self._job_slots: set[str] = set()  # job ids holding a slot (build running, start state open)
        self._job_tasks: set[asyncio.Task[None]] = set()
        self._job_machines: set[str] = set()  # a running job's machine is named by its job id
        self._request_tasks: set[asyncio.Task[None]] = set()
        self._tearing_down: dict[str, str] = {}  # attempt id -> machine id, destroy still running
        self._unacked: dict[str, AttemptResult] = {}
        self._last_sent: dict[str, float] = {}
        self._images: list[ImageInfo] = []
        self._held: list[tuple[str, int]] = []
        self.draining = False
        self._stop = asyncio.Event()
        self._force = asyncio.Event()
        self._changed = asyncio.Event()  # set on any change a drain waits for
        self._journal_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gh-journal")
        self._signals = 0
        self.exit_code = 0
        self.status_acks = False  # the server acknowledges statuses (its last welcome said so)
        self._destroy_leftovers = 0
        self.hypervisor = HypervisorWatch(provider.probe, self._hypervisor_changed, interval_up=probe_interval,
                                          interval_down=min(1.0, probe_interval))
        self._session_task: asyncio.Task[None] | None = None
        self._timers: list[asyncio.Task[None]] = []
        self.session = Session(
            config.connect_urls(), config.token_value(), self,
            backoff=backoff or Backoff(base=config.reconnect_min, cap=config.reconnect_max),
            revoked_retry=config.revoked_retry, connect_timeout=config.connect_timeout,
            sleep=session_sleep,
            on_refused=self._token_refused if config.exits_on_refused_token(sys.stderr.isatty(), os.environ)
            else None,
        )

    @staticmethod
    def _default_jobs(provider: Provider, library: Library | None = None) -> JobsLike | None:
        try:
            from gh_runner.jobs import StartStateJobs
        except ImportError:
            return None
        jobs: JobsLike = StartStateJobs(provider, library=library)
        return jobs

    def _default_library(self, config: RunnerConfig, provider: Provider) -> Library | None:
        if config.registry is None:
            return None
        try:
            registry = open_registry(config.registry)
        except RegistryError as e:
            self.library_problem = f"registry {config.registry.url}: {e}; start states are not shared"
            return None
        return Library(provider, registry, config.registry, config.state_dir)

    # -- observers -----------------------------------------------------------------------------

    def _emit(self, event: str, *args: Any) -> None:
        for obs in self.observers:
            fn = getattr(obs, event, None)
            if fn is None:
                continue
            try:
                fn(*args)
            except Exception:
                self.log.exception("observer failed", observer=type(obs).__name__, hook=event)

    @property
    def busy(self) -> int:
        return len(self._attempts) + len(self._job_slots) + len(self._fetching)

    def _busy_changed(self) -> None:
        self._changed.set()
        self._emit("busy_changed", self.busy, self.config.slots)

    async def _journal(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._journal_pool, fn, *args)

    async def _note_phase(self, running: _Running, status: str, phase: str, at: datetime) -> None:
        """Note an attempt's phase in its in-flight record (not fsync'd: for crash reports and the hello)."""
        async with running.lock:
            try:
                await self._journal(self.journal.update_phase, running.record, status, phase, at)
            except OSError as e:
                self.log.warning("could not note the phase in the journal", attempt_id=running.lease.attempt_id,
                                 error=str(e))

    async def send_message(self, msg: Any) -> bool:
        return await self.session.send_message(msg)

    # -- life cycle ----------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: int) -> None:
        self._signals += 1
        if self._signals == 1:
            self.log.info("stop requested: draining", signal=signal.Signals(sig).name,
                          in_flight=len(self._attempts), grace_s=self.config.drain_grace)
            self.request_stop()
        else:
            self.log.warning("second stop signal: forcing shutdown", signal=signal.Signals(sig).name,
                             in_flight=len(self._attempts))
            self.force_stop()

    def request_stop(self) -> None:
        self._stop.set()

    def _token_refused(self, reason: str) -> None:
        # A configuration error found at the first connect: exit 2, as for a bad flag.
        self.exit_code = 2
        self.request_stop()

    def force_stop(self) -> None:
        self._stop.set()
        self._force.set()
        self._changed.set()

    async def run(self) -> int:
        """Run until stopped and drained; returns the process exit code."""
        if not await self.startup():
            self._emit("stopped", self.exit_code)
            return self.exit_code
        try:
            await self.main_loop()
        finally:
            await self.shutdown()
        return self.exit_code

    async def startup(self) -> bool:
        """Start the provider, recover the journal, reap leftovers, then connect and start the
        timers. False (exit code 1) when the provider cannot start: nothing else has run."""
        try:
            await within(PROVIDER_CALL_TIMEOUT, self.provider.start())
        except Exception as e:
            self.log.error("the machine provider could not start; run `gh-runner doctor`",
                           error=f"{type(e).__name__}: {e}")
            self.exit_code = 1
            return False
        await self._journal(self.journal.open)
        recovered = await self._journal(self.journal.recover)
        for problem in self.journal.problems:
            self.log.error(problem)
        for r in recovered:
            self.log.error("attempt was interrupted by a runner restart; reporting it as an error",
                           attempt_id=r.attempt_id, reason=r.error)
        for r in await self._journal(self.journal.pending_results):
            self._unacked[r.attempt_id] = r
        self._emit("journal_backlog", len(self._unacked))
        # Nothing runs yet, so everything this runner's provider still has is a leftover.
        await self._reap(keep=set())
        await self._refresh_inventory()
        await self._check_library()
        self.log.info("runner starting", version=__version__, server=self.session.url, slots=self.config.slots,
                      labels=self.config.labels, images=[i.name for i in self._images],
                      unacked_results=len(self._unacked), pool=plan_pool(self.config).describe())
        self._session_task = asyncio.create_task(self.session.keep_connected(), name="session")
        self._timers = [
            asyncio.create_task(self._every(self.config.reap_interval, self._reap_live), name="reaper"),
            asyncio.create_task(self._every(min(self.config.result_resend, 5.0), self._resend_due), name="resend"),
            asyncio.create_task(self._every(self.tick_interval, self._tick), name="tick"),
            asyncio.create_task(self.hypervisor.run(), name="hypervisor-watch"),
        ]
        return True

    async def main_loop(self) -> None:
        """Leases arrive through the session (`on_message`); this waits for the first stop signal,
        then drains: no new leases, running attempts get their grace."""
        await self._stop.wait()
        self._emit("draining", len(self._attempts))
        await self._drain()

    async def shutdown(self) -> None:
        """Close everything startup opened, in order; runs after the drain, or when `run` is cancelled."""
        # 1. No more reconnects: the session closes its socket and its task ends.
        self.session.stop()
        # 2. The timers (reaper, result re-send, watchdog tick) have nothing left to do.
        for t in self._timers:
            t.cancel()
        # 3. The session gets a moment to close cleanly (within cancels it past that).
        if self._session_task is not None:
            try:
                await within(10, self._session_task)
            except (TimeoutError, asyncio.CancelledError):
                self._session_task.cancel()
        await asyncio.gather(*self._timers, return_exceptions=True)
        # 4. Pulls still running stop (their leases were never accepted), and the registry's
        #    connections close.
        for task in list(self._fetch_tasks):
            task.cancel()
        await asyncio.gather(*self._fetch_tasks, return_exceptions=True)
        if self.library is not None:
            await self.library.close()
        # 5. The provider releases its connections and its own machines (the hot pool).
        try:
            await within(30, self.provider.close())
        except Exception as e:
            self.log.warning("closing the provider failed", error=str(e))
        # 6. The journal's writers finish what they hold: every result is on disk before exit.
        await asyncio.get_running_loop().run_in_executor(None, self._journal_pool.shutdown)
        self.log.info("runner stopped", exit_code=self.exit_code, unacked_results=len(self._unacked))
        self._emit("stopped", self.exit_code)

    async def _check_library(self) -> None:
        """Say at start when the registry cannot be used (bad credentials above all): the runner runs
        on, serving what it holds, and pulls are refused with a typed reason until it can."""
        if self.library is not None:
            try:
                self.library_problem = await self.library.check()
            except Exception as e:  # a start-up check must not stop the runner
                self.library_problem = f"registry check failed: {type(e).__name__}: {e}"
        if self.library_problem is not None:
            self.log.error("the registry cannot be used; run `gh-runner doctor`", problem=self.library_problem)
        elif self.library is not None:
            self.log.info("registry reachable", registry=self.library.registry.url, repository=self.library.prefix)

    async def _drain(self) -> None:
        self.draining = True
        await self.session.send_message(self.heartbeat())  # tell the server at once: no more leases here
        grace = self.config.drain_grace
        if self._attempts:
            self.log.info("draining: waiting for attempts to finish", in_flight=sorted(self._attempts), grace_s=grace)
        await self._wait_idle(grace, stop_on_force=True)
        if self._attempts or self._job_tasks:
            forced = self._force.is_set()
            reason = ("the runner was forced to stop (second stop signal)" if forced else
                      f"the runner shut down and the drain grace period ({grace:.0f} s) ran out")
            for running in list(self._attempts.values()):
                running.attempt.cancel(reason)
            # Cancelled attempts still destroy their machines; give them the teardown time to do it,
            # or a short while once forced (the reaper of the next start gets whatever is left).
            await self._wait_idle(FORCED_TEARDOWN if forced else self.config.timeouts.teardown + 15,
                                  stop_on_force=not forced)
            if self._force.is_set():
                await self._wait_idle(FORCED_TEARDOWN, stop_on_force=False)
            for running in list(self._attempts.values()):
                if running.task is not None:
                    running.task.cancel()
            for t in list(self._job_tasks):
                t.cancel()
            await asyncio.gather(*[r.task for r in self._attempts.values() if r.task], *self._job_tasks,
                                 return_exceptions=True)
            if self._force.is_set():
                self.exit_code = 1
        if self.jobs is not None:
            try:
                await within(self.config.timeouts.teardown, self.jobs.close_all())
            except Exception as e:
                self.log.warning("closing open start states failed", error=str(e))
        # Give the server a moment to acknowledge what just finished; the journal keeps the rest.
        await self._wait_until(lambda: not self._unacked or not self.session.connected,
                               2.0 if self._force.is_set() else 10.0, stop_on_force=False)

    async def _wait_idle(self, timeout: float, stop_on_force: bool) -> None:
        await self._wait_until(lambda: not self._attempts and not self._job_tasks and not self._tearing_down,
                               timeout, stop_on_force)

    async def _wait_until(self, done: Callable[[], bool], timeout: float, stop_on_force: bool) -> None:
        """Wait for `done()` (re-checked on every state change, and at least once a second), the
        timeout, or a forced stop."""
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0 or (stop_on_force and self._force.is_set()):
                return
            self._changed.clear()
            try:
                await within(min(left, 1.0), self._changed.wait())
            except TimeoutError:
                pass

    async def _every(self, interval: float, fn: Callable[[], Any]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await fn()
            except Exception:
                self.log.exception("periodic task failed", task=getattr(fn, "__name__", "?"))

    async def _tick(self) -> None:
        self._emit("tick")
        leftovers = self.provider.destroy_leftovers()
        if leftovers != self._destroy_leftovers:
            self._destroy_leftovers = leftovers
            self._emit("destroy_leftovers", leftovers)

    # -- provider ------------------------------------------------------------------------------

    async def _refresh_inventory(self) -> None:
        try:
            self._images = await within(PROVIDER_CALL_TIMEOUT, self.provider.list_images())
        except Exception as e:
            self.log.error("listing images failed; advertising none", error=str(e))
            self._images = []
        try:
            self._held = await within(PROVIDER_CALL_TIMEOUT, self.provider.held_versions())
        except Exception as e:
            self.log.error("listing start-state versions failed; advertising none", error=str(e))
            self._held = []

    def _live_machine_ids(self) -> set[str]:
        keep = ({running.attempt.machine_id for running in self._attempts.values()} | set(self._attempts)
                | set(self._tearing_down.values()))
        if self.jobs is not None:
            keep |= self.jobs.open_machine_ids
        return keep | self._job_machines

    async def _reap_live(self) -> None:
        await self._reap(self._live_machine_ids())

    async def _reap(self, keep: set[str]) -> None:
        try:
            reaped = await within(PROVIDER_CALL_TIMEOUT, self.provider.reap(keep=keep))
        except Exception as e:
            self.log.error("reaping leftover machines failed", error=str(e))
            return
        if reaped:
            self.log.warning("reaped leftover machines", machines=reaped)
        self._emit("reaped", list(reaped))

    # -- session handler -----------------------------------------------------------------------

    async def make_hello(self) -> Hello:
        await self._refresh_inventory()
        try:
            pooled = await within(PROVIDER_CALL_TIMEOUT, self.provider.pooled_sources())
        except Exception as e:
            self.log.warning("listing pooled sources failed; advertising none", error=str(e))
            pooled = []
        hot_images = {s.image for s in pooled if s.start_state_id is None}
        hot_states = {(s.start_state_id, s.version) for s in pooled if s.start_state_id is not None}
        return Hello(
            version=__version__, name=self.config.name, labels=self.config.labels, slots=self.config.slots,
            images=[ImageAd(name=i.name, os=i.os, version=i.version, checksum=i.checksum, pooled=i.name in hot_images)
                    for i in self._images],
            start_states=[HeldVersion(start_state_id=s, version=v, pooled=(s, v) in hot_states) for s, v in self._held],
            in_flight=sorted(self._attempts),
            registry=(f"{self.library.registry.host}/{self.library.prefix}"
                      if self.library is not None and not self.library.auth_failed else None),
            in_flight_phases=self._in_flight_phases(),
            status_acks=True,
        )

    def _in_flight_phases(self) -> list[InFlightPhase]:
        """Each in-flight attempt's last status: the resend of any status the link lost."""
        out = []
        for aid, running in sorted(self._attempts.items()):
            rec = running.record
            if rec.phase_at is None or rec.status not in ATTEMPT_STATUSES:
                continue  # accepted, no status yet: the server has it as leased
            out.append(InFlightPhase(attempt_id=aid, status=rec.status, phase=rec.phase,  # type: ignore[arg-type]
                                     at=datetime.fromisoformat(rec.phase_at)))
        return out

    async def on_welcome(self, welcome: Welcome) -> None:
        self.status_acks = welcome.status_acks
        if welcome.name and welcome.name != self.config.name and self._take_registered_name(welcome.name):
            return
        self._emit("welcome", welcome)
        self._emit("connected", welcome.runner_id)
        # Attempts that ran on through a disconnect are only worth finishing if the server still
        # wants them; the others it has already turned into errors (and maybe retried elsewhere).
        wanted = set(welcome.resume)
        for aid, running in list(self._attempts.items()):
            if aid not in wanted:
                self.log.warning("server gave this attempt up while disconnected; cancelling it", attempt_id=aid)
                running.attempt.cancel("the server gave this attempt up while the runner was disconnected")
        for result in list(self._unacked.values()):
            await self._send_result(result)

    def _take_registered_name(self, name: str) -> bool:
        """True when this runner restarts under its registered name (remembered in the state dir, so
        the next start reaps and names machines under it from the first moment)."""
        if not self.adopt_registered_name:
            if self.restart_as is None:
                self.log.warning("this runner's --name differs from the name it was registered with; its logs and "
                                 "machines use --name", registered_name=name)
                self.restart_as = ""  # said once
            return False
        try:
            registered_name_file(self.config.state_dir).write_text(name + "\n", encoding="utf-8")
        except OSError as e:
            self.log.warning("could not remember the registered name", error=str(e))
        self.log.info("this runner is registered under another name; restarting under it", registered_name=name)
        self.restart_as = name
        self.request_stop()
        return True

    def heartbeat(self) -> Heartbeat:
        return Heartbeat(at=datetime.now(UTC), busy=self.busy, slots=self.config.slots,
                         draining=True if self.draining else None,
                         paused=None if self.hypervisor.up else LeaseRefusal.HYPERVISOR_DOWN)

    async def _heartbeat_now(self) -> None:
        await self.session.send_message(self.heartbeat())

    def _hypervisor_changed(self, up: bool, reason: str | None) -> None:
        """Said at once (a heartbeat now, not in up to 10 s): the server stops offering leases."""
        self._emit("hypervisor", up, reason)
        if self.session.connected:
            task = asyncio.create_task(self._heartbeat_now(), name="heartbeat-now")
            self._request_tasks.add(task)
            task.add_done_callback(self._request_tasks.discard)

    def on_disconnected(self, reason: str) -> None:
        self._changed.set()
        self._emit("disconnected", reason)

    def on_reconnect_scheduled(self, failures: int, delay: float) -> None:
        self._emit("reconnect_scheduled", failures, delay)

    async def on_message(self, msg: Any) -> None:
        if isinstance(msg, Lease):
            await self._on_lease(msg)
        elif isinstance(msg, MachineRequest):
            self._spawn_request(msg)
        elif isinstance(msg, TaskEnd):
            await self._on_task_end(msg)
        elif isinstance(msg, Cancel):
            await self._on_cancel(msg)
        elif isinstance(msg, ResultAck):
            await self._on_ack(msg)
        elif isinstance(msg, StatusAck):
            self._on_status_ack(msg)
        elif isinstance(msg, Job):
            await self._on_job(msg)
        else:
            await self.session.send_message(ErrorMsg(code="unsupported", message=f"runner does not handle {msg.type}",
                                             ref_type=msg.type))

    # -- leases --------------------------------------------------------------------------------

    def _refusal(self, lease: Lease) -> tuple[LeaseRefusal, str] | None:
        """Why this runner cannot take `lease` now (the code the server acts on, the text for people)."""
        if self.draining:
            return LeaseRefusal.DRAINING, "draining: the runner is shutting down and takes no new leases"
        if not is_safe_id(lease.attempt_id):
            return (LeaseRefusal.INVALID_LEASE,
                    "attempt id must be 1-128 letters, digits, '_', '.', '-' (it names files and machines)")
        if not self.hypervisor.up:
            return (LeaseRefusal.HYPERVISOR_DOWN, f"the hypervisor does not answer ({self.hypervisor.reason}); "
                    "the runner is paused until it does")
        if self.busy >= self.config.slots:
            return LeaseRefusal.NO_SLOT, f"no free slot: {self.busy} of {self.config.slots} busy"
        # `vm` asks for any virtual machine; any other value must be one of our labels.
        if lease.case.runs_on != "vm" and lease.case.runs_on not in self.config.labels:
            labels = ", ".join(self.config.labels) or "none"
            return (LeaseRefusal.LABEL_MISMATCH, f"runs_on {lease.case.runs_on!r} is not a label of this runner "
                    f"(labels: {labels}; 'vm' always fits)")
        ref = lease.start_state
        if ref.kind == "image":
            if ref.image not in {i.name for i in self._images}:
                have = ", ".join(sorted(i.name for i in self._images)) or "none"
                return LeaseRefusal.IMAGE_MISSING, f"image {ref.image!r} is not on this runner (it has: {have})"
        elif (ref.start_state_id, ref.version) not in set(self._held):
            if self.library is None:
                return (LeaseRefusal.VERSION_MISSING,
                        f"start state {ref.start_state_id} version {ref.version} is not held by this runner")
            if ref.image not in {i.name for i in self._images}:  # a pulled version runs over its image
                have = ", ".join(sorted(i.name for i in self._images)) or "none"
                return (LeaseRefusal.IMAGE_MISSING, f"image {ref.image!r} (under start state {ref.start_state_id}) "
                        f"is not on this runner (it has: {have})")
        return None

    async def _refuse(self, attempt_id: str, code: LeaseRefusal, reason: str) -> None:
        self.log.info("lease refused", attempt_id=attempt_id[:128], reason=reason, code=code)
        self._emit("lease_refused", attempt_id, reason)
        await self.session.send_message(LeaseRefuse(attempt_id=attempt_id, reason=reason, code=code))

    async def _on_lease(self, lease: Lease) -> None:
        aid = lease.attempt_id
        if aid in self._attempts:  # our accept was lost on the way: say it again
            await self.session.send_message(LeaseAccept(attempt_id=aid))
            return
        if aid in self._unacked:
            await self._refuse(aid, LeaseRefusal.DUPLICATE,
                               "already finished on this runner; its result is being re-sent")
            await self._send_result(self._unacked[aid])
            return
        refusal = self._refusal(lease)
        if refusal is not None and refusal[0] is LeaseRefusal.IMAGE_MISSING:
            await self._refresh_inventory()  # an image may have been installed since the hello
            refusal = self._refusal(lease)
        if refusal is not None:
            await self._refuse(aid, *refusal)
            return
        if (low := diskguard.lease_refusal(self.config.state_dir, self.config.disk_reserve_mib * diskguard.MIB)):
            await self._refuse(aid, low.code, low.message)
            return
        if self.library is not None and lease.start_state.kind == "state":
            # The pull (when the version is not held) runs in its own task, holding a slot, so other
            # messages go on; the lease is accepted or refused when it ends.
            self._fetching.add(aid)
            self._busy_changed()
            task = asyncio.create_task(self._fetch_then_start(lease), name=f"fetch-{aid}")
            self._fetch_tasks.add(task)
            task.add_done_callback(self._fetch_tasks.discard)
            return
        await self._start(lease)

    async def _fetch_then_start(self, lease: Lease) -> None:
        assert self.library is not None and lease.start_state.kind == "state"
        aid = lease.attempt_id
        ref = lease.start_state
        key = (str(ref.start_state_id), int(ref.version or 0))
        image = next((i for i in self._images if i.name == ref.image), None)
        try:
            try:
                # Held or not is asked of the provider: a pulled version may have been evicted since
                # the last hello.
                seconds = await self.library.acquire(key[0], key[1], ref.image, image.checksum if image else None)
            except FetchRefused as e:
                await self._refuse(aid, e.code, e.reason)
                return
            except ProviderError as e:
                await self._refuse(aid, LeaseRefusal.START_FAILED, f"cannot list the versions held here: {e}")
                return
            if seconds > 0:  # pulled: what is held changed (and the cache may have evicted others)
                with contextlib.suppress(Exception):
                    self._held = await within(PROVIDER_CALL_TIMEOUT, self.provider.held_versions())
            if key not in set(self._held):
                self._held.append(key)
            try:
                started = await self._start(lease, fetch_seconds=seconds, uses_version=key)
            except BaseException:
                self.library.release(*key)
                raise
            if not started:
                self.library.release(*key)
        finally:
            self._fetching.discard(aid)
            self._busy_changed()

    async def _start(self, lease: Lease, *, fetch_seconds: float | None = None,
                     uses_version: tuple[str, int] | None = None) -> bool:
        """Journal, make and accept the attempt; False when it was refused instead."""
        aid = lease.attempt_id
        try:
            record = await self._journal(self.journal.record_inflight, aid, aid, lease.test_run_id)
        except OSError as e:
            await self._refuse(aid, LeaseRefusal.JOURNAL_FAILED, f"runner cannot write its journal: {e.strerror or e}")
            return False
        try:
            attempt = self.attempt_factory(lease, self.provider, _Link(self, aid), self.config.timeouts)
        except Exception as e:
            self.log.exception("could not create the attempt", attempt_id=aid)
            await self._journal(self._drop_inflight, aid)
            await self._refuse(aid, LeaseRefusal.START_FAILED,
                               f"runner could not start the attempt: {type(e).__name__}: {e}")
            return False
        running = _Running(lease=lease, attempt=attempt, record=record, fetch_seconds=fetch_seconds,
                           uses_version=uses_version)
        self._attempts[aid] = running
        self._fetching.discard(aid)  # its slot moves from the pull to the attempt: counted once
        await self.session.send_message(LeaseAccept(attempt_id=aid))
        running.task = asyncio.create_task(self._run_attempt(running), name=f"attempt-{aid}")
        self.log.info("lease accepted", attempt_id=aid, case=lease.case.name, busy=self.busy)
        self._emit("attempt_started", aid)
        self._busy_changed()
        return True

    def _drop_inflight(self, attempt_id: str) -> None:
        (self.journal.inflight_dir / f"{attempt_id}.json").unlink(missing_ok=True)

    async def _run_attempt(self, running: _Running) -> None:
        aid = running.lease.attempt_id
        bind_attempt(aid)
        log = structlog.get_logger("gh_runner.daemon")
        started = datetime.now(UTC)
        try:
            result = await running.attempt.run()
            if running.fetch_seconds is not None:  # the `fetch` phase ran before the accept: it comes first
                phases = {FETCH: running.fetch_seconds, **result.metrics.phase_seconds}
                result = result.model_copy(update={"metrics": result.metrics.model_copy(
                    update={"phase_seconds": phases})})
            if result.attempt_id != aid:
                log.error("attempt returned a result for another id; fixing it", got=result.attempt_id)
                result = result.model_copy(update={"attempt_id": aid})
        except asyncio.CancelledError:
            result = AttemptResult(attempt_id=aid, outcome="error", error_phase="shutdown", started_at=started,
                                   finished_at=datetime.now(UTC),
                                   error="the runner was forced to stop before the attempt could clean up")
        except Exception as e:
            log.exception("attempt crashed")
            result = AttemptResult(attempt_id=aid, outcome="error", error_phase="runner", started_at=started,
                                   finished_at=datetime.now(UTC),
                                   error=f"internal runner error: {type(e).__name__}: {redactor.scrub(str(e))[:300]}")
        journaled = True
        try:
            async with running.lock:
                await self._journal(self.journal.finish, result)
        except OSError as e:
            # Still send it: the server may well ack before anything else goes wrong. The in-flight
            # record is gone either way (`Journal.finish`): the attempt is over.
            journaled = False
            what = "the disk is full" if isinstance(e, DiskFull) else "the journal could not be written"
            log.error(f"result NOT journaled ({what}); sending it anyway, it is lost if the runner stops "
                      "before the server acknowledges it", error=str(e), outcome=result.outcome)
        # The slot frees here, with the machine's destroy still running: the result is safe on disk,
        # and a crash before the destroy ends leaves a domain the reaper at the next start removes.
        self._tearing_down[aid] = running.attempt.machine_id
        self._attempts.pop(aid, None)
        if running.uses_version is not None and self.library is not None:
            self.library.release(*running.uses_version)
        redactor.discard(running.redact)
        self._unacked[aid] = result
        if journaled:
            log.info("result journaled, sending", outcome=result.outcome, error=result.error)
        if result.outcome == "error":
            self.hypervisor.poke()  # an error is the likeliest moment to find the hypervisor gone
        self._emit("attempt_finished", result)
        self._emit("journal_backlog", len(self._unacked))
        self._busy_changed()
        try:
            await self._send_result(result)
            await running.attempt.wait_torn_down()
        finally:
            self._tearing_down.pop(aid, None)
            self._changed.set()

    def _on_status_ack(self, msg: StatusAck) -> None:
        running = self._attempts.get(msg.attempt_id)
        if running is None:
            return  # over already (acks are idempotent and may cross the result)
        if msg.status == "running":
            running.attempt.agent_started(msg.late_seconds)

    async def _send_result(self, result: AttemptResult) -> None:
        self._last_sent[result.attempt_id] = time.monotonic()
        await self.session.send_message(AttemptFinished(result=result))

    async def _resend_due(self) -> None:
        if not self.session.connected:
            return
        now = time.monotonic()
        for aid, result in list(self._unacked.items()):
            if now - self._last_sent.get(aid, 0.0) >= self.config.result_resend:
                await self._send_result(result)

    async def _on_ack(self, msg: ResultAck) -> None:
        aid = msg.attempt_id
        if self._unacked.pop(aid, None) is None and not self.journal.has_result(aid):
            return  # a repeated ack: nothing to do (acks are idempotent)
        self._last_sent.pop(aid, None)
        try:
            await self._journal(self.journal.ack, aid)
        except OSError as e:
            self.log.error("could not drop an acknowledged result from the journal", attempt_id=aid, error=str(e))
        self._changed.set()
        self._emit("journal_backlog", len(self._unacked))

    # -- during an attempt ---------------------------------------------------------------------

    def _spawn_request(self, req: MachineRequest) -> None:
        task = asyncio.create_task(self._on_request(req), name=f"request-{req.request_id[:64]}")
        self._request_tasks.add(task)
        task.add_done_callback(self._request_tasks.discard)

    async def _on_request(self, req: MachineRequest) -> None:
        running = self._attempts.get(req.attempt_id or "") if req.attempt_id else None
        try:
            if running is not None:
                bind_attempt(running.lease.attempt_id)
                values = [v for v in req.redact if v]
                running.redact.update(values)
                redactor.add(*values)
                resp = await running.attempt.handle_request(req)
            elif req.start_state_id and self.jobs is not None and not req.attempt_id:
                resp = await self.jobs.handle_request(req)
            else:
                target = (f"attempt {req.attempt_id}" if req.attempt_id else
                          f"start state {req.start_state_id}" if req.start_state_id else "no attempt or start state")
                resp = MachineResponse(request_id=req.request_id, ok=False,
                                       error=f"{target} is not running on this runner"[:300])
        except Exception as e:
            self.log.exception("machine request failed", attempt_id=req.attempt_id, op=req.op)
            resp = MachineResponse(request_id=req.request_id, ok=False,
                                   error=f"{req.op} failed in the runner: {type(e).__name__}")
        await self.session.send_message(resp)

    async def _on_task_end(self, msg: TaskEnd) -> None:
        running = self._attempts.get(msg.attempt_id)
        if running is None:
            await self.session.send_message(ErrorMsg(code="refused", ref_type="task_end",
                                             message=f"attempt {msg.attempt_id[:128]} is not running on this runner"))
            return
        running.attempt.task_end(msg)

    async def _on_cancel(self, msg: Cancel) -> None:
        running = self._attempts.get(msg.attempt_id)
        if running is not None:
            self.log.info("cancel from the server", attempt_id=msg.attempt_id, reason=msg.reason)
            running.attempt.cancel(msg.reason)
        elif msg.attempt_id in self._unacked:
            await self._send_result(self._unacked[msg.attempt_id])  # already over: the result says how
        else:
            await self.session.send_message(ErrorMsg(code="refused", ref_type="cancel",
                                             message=f"attempt {msg.attempt_id[:128]} is not running on this runner"))

    # -- start-state jobs ----------------------------------------------------------------------

    async def _on_job(self, job: Job) -> None:
        if self.jobs is None:
            await self.session.send_message(JobResult(job_id=job.job_id, ok=False, start_state_id=job.start_state_id,
                                              error="start-state jobs are not available on this runner"))
            return
        holds = self.jobs.holds_slot(job)
        refusal = None
        if self.draining:
            refusal = "draining: the runner is shutting down"
        elif holds and self.busy >= self.config.slots:
            refusal = f"no free slot: {self.busy} of {self.config.slots} busy"
        if refusal is not None:
            await self.session.send_message(JobResult(job_id=job.job_id, ok=False, error=refusal,
                                              start_state_id=job.start_state_id))
            return
        slot_key = f"job:{job.start_state_id}" if job.op == "open" else f"job:{job.job_id}"
        if holds:
            self._job_slots.add(slot_key)
            self._busy_changed()
        self._job_machines.add(job.job_id)
        self.jobs.expect(job)
        task = asyncio.create_task(self._run_job(job, slot_key if holds else None), name=f"job-{job.job_id[:64]}")
        self._job_tasks.add(task)
        task.add_done_callback(self._job_done)

    def _job_done(self, task: asyncio.Task[None]) -> None:
        self._job_tasks.discard(task)
        self._changed.set()

    async def _run_job(self, job: Job, slot_key: str | None) -> None:
        assert self.jobs is not None
        try:
            result = await self.jobs.run(job)
        except Exception as e:
            self.log.exception("start-state job crashed", job_id=job.job_id)
            result = JobResult(job_id=job.job_id, ok=False, start_state_id=job.start_state_id,
                               error=f"internal runner error: {type(e).__name__}")
        finally:
            self._job_machines.discard(job.job_id)
            # An open start state keeps its slot until a save/close job releases it.
            if slot_key is not None and not (job.op == "open" and self.jobs.is_open(job.start_state_id)):
                self._job_slots.discard(slot_key)
            if job.op in ("save", "close") and not self.jobs.is_open(job.start_state_id):
                self._job_slots.discard(f"job:{job.start_state_id}")
            self._busy_changed()
        if result.ok and job.op in ("build", "save", "delete"):
            await self._refresh_inventory()
        await self.session.send_message(result)
