"""The runner daemon: it starts, routes the server's messages to the parts that do the work, and stops.

One `Daemon` owns one `Session` (the websocket), one `Journal` (state dir) and one provider, and
wires the parts of the runner together:

- `gh_runner.leases`: each lease's way from the offer to its result (admission, the pull of a
  version, the journal's in-flight record, the attempt's task);
- `gh_runner.admission`: whether a lease or a start-state job is taken now, a pure function of the
  runner's state, and the one count of what holds the slots (`Slots`);
- `gh_runner.attempt`: one attempt's life; `gh_runner.machine_requests`: screen, input and exec,
  for an attempt or an open start state;
- `gh_runner.outbox`: every result journaled, sent and re-sent until acknowledged;
- `gh_runner.jobs`: start-state jobs, and which of them hold a slot;
- `gh_runner.inventory`: the images and versions advertised; `gh_runner.hypervisor`: the pause
  while libvirt is down; `gh_runner.library`: pulls from and pushes to the registry.

What is left here: start-up, the main loop and shutdown (with the drain), the session's handler
(hello, welcome, heartbeats, the message router) and the reaper's timer.

Shutdown: the first SIGTERM/SIGINT drains (no new leases; running attempts get `drain_grace`
seconds, then are cancelled with a reason and report `error`; results get a short while to be
acknowledged), then the process exits 0. A second signal forces: everything is cancelled at once
and the exit code is 1. Results not yet acknowledged stay in the journal for the next start.
SIGUSR1 (`gh-runner drain --migrate`) drains the same way, but first hands each attempt in its task
to another runner: a save point now, pushed to the registry, and `attempt_handoff` (Leases.hand_off_all).

Hooks (`observers`): any object with some of the methods of `DaemonObserver`; each is called on
the event loop, must return quickly and never raise (exceptions are logged and ignored). This is
where sd_notify and Prometheus plug in without the daemon knowing about them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from gh_common.backoff import Backoff
from gh_common.timeouts import within
from gh_runner import __version__, admission
from gh_runner.admission import RunnerState, SlotHolder, Slots
from gh_runner.config import RunnerConfig
from gh_runner.hypervisor import HypervisorWatch
from gh_runner.inventory import PROVIDER_CALL_TIMEOUT, Inventory
from gh_runner.jobs import StartStateJobs
from gh_runner.journal import Journal
from gh_runner.leases import AttemptFactory, Leases, default_attempt_factory
from gh_runner.library import Library, open_registry
from gh_runner.live_views import LiveViews
from gh_runner.log import get_logger
from gh_runner.names import remember_name
from gh_runner.outbox import ResultOutbox
from gh_runner.poolsize import plan_pool
from gh_runner.registry import RegistryError
from gh_runner.session import Session
from gh_wire.protocol import (
    AttemptResult,
    Cancel,
    ErrorMsg,
    Heartbeat,
    HeldVersion,
    Hello,
    ImageAd,
    Job,
    JobResult,
    Lease,
    LeaseRefusal,
    MachineRefusal,
    MachineRequest,
    MachineResponse,
    ResultAck,
    StatusAck,
    TaskEnd,
    TaskHold,
    ViewClose,
    ViewOpen,
    Welcome,
)
from providers.base import Machine, Provider

T = TypeVar("T")
PID_FILE = "gh-runner.pid"  # in the state dir while the daemon runs: `gh-runner drain` signals it
FORCED_TEARDOWN = 10.0  # after a second stop signal, how long cancelled attempts get to destroy machines


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


class JobsLike(Protocol):
    """What the daemon needs of `gh_runner.jobs.StartStateJobs`."""

    @property
    def machine_ids(self) -> set[str]: ...
    @property
    def tasks(self) -> list[asyncio.Task[None]]: ...
    def slot_key(self, job: Job) -> str | None: ...
    def slots_freed_by(self, job: Job) -> list[str]: ...
    def start(self, job: Job, done: Callable[[Job, JobResult], Any]) -> None: ...
    async def handle_request(self, req: MachineRequest) -> MachineResponse: ...
    async def open_machine(self, start_state_id: str, timeout: float) -> Machine | None: ...
    async def close_all(self) -> None: ...


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
        `restart_as` set, and the CLI starts it again under that name (`gh_runner.names`)."""
        self.config = config
        self.adopt_registered_name = adopt_registered_name
        self.restart_as: str | None = None
        self.provider = provider
        self.log = get_logger("gh_runner.daemon", runner=config.name)
        self.library_problem: str | None = None  # why the configured registry cannot be used (said at start)
        self.library = library if library is not None else self._default_library(config, provider)
        self.jobs: JobsLike = jobs if jobs is not None else StartStateJobs(provider, library=self.library)
        self.observers = list(observers)
        self.journal = journal or Journal(config.state_dir)
        self.tick_interval = tick_interval
        self.slots = Slots(config.slots)  # who holds the slots: attempts, pulls, jobs
        self._request_tasks: set[asyncio.Task[None]] = set()
        self._journal_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gh-journal")
        self.outbox = ResultOutbox(self.journal, self._journal, self.send_message, time.monotonic,
                                   resend_after=config.result_resend)
        self.inventory = Inventory(provider)
        self.draining = False
        self._stop = asyncio.Event()
        self._force = asyncio.Event()
        self._changed = asyncio.Event()  # set on any change a drain waits for
        self._signals = 0
        self.exit_code = 0
        self.status_acks = False  # the server acknowledges statuses (its last welcome said so)
        self.save_points_told = False  # the server takes `save_point_made` (its last welcome said so)
        self.not_here_refusals = False  # the server reads the refusal `attempt_not_here` (its last welcome said so)
        self.migrate = False  # the drain hands attempts off first (`drain --migrate`, SIGUSR1)
        self._destroy_leftovers = 0
        self.hypervisor = HypervisorWatch(provider.probe, self._hypervisor_changed, interval_up=probe_interval,
                                          interval_down=min(1.0, probe_interval))
        self.leases = Leases(
            config, provider, attempt_factory=attempt_factory or default_attempt_factory, journal=self.journal,
            run_io=self._journal, outbox=self.outbox, slots=self.slots, inventory=self.inventory,
            library=self.library, state=self._state, send=self.send_message, status_acks=lambda: self.status_acks,
            save_points_told=lambda: self.save_points_told,
            emit=self._emit, changed=self._busy_changed, errored=self.hypervisor.poke)
        self._session_task: asyncio.Task[None] | None = None
        self._timers: list[asyncio.Task[None]] = []
        self.session = Session(
            config.connect_urls(), config.token_value(), self,
            backoff=backoff or Backoff(base=config.reconnect_min, cap=config.reconnect_max, jitter=True),
            revoked_retry=config.revoked_retry, connect_timeout=config.connect_timeout,
            sleep=session_sleep,
            on_refused=self._token_refused if config.exits_on_refused_token(sys.stderr.isatty(), os.environ)
            else None,
        )
        # Screen bytes on sockets of their own, never on the session's (gh_runner/live_views.py).
        self.live_views = LiveViews(self._view_machine, lambda: self.session.url, config.token_value(),
                                    self.send_message, masked_of=self.leases.masked_of)

    def _default_library(self, config: RunnerConfig, provider: Provider) -> Library | None:
        if config.registry is None:
            return None
        try:
            registry = open_registry(config.registry)
        except RegistryError as e:
            self.library_problem = f"registry {config.registry.url}: {e}; start states are not shared"
            return None
        return Library(provider, registry, config.registry, config.state_dir)

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
        return self.slots.busy

    def _busy_changed(self) -> None:
        self._changed.set()
        self._emit("busy_changed", self.busy, self.config.slots)

    async def _journal(self, fn: Callable[..., T], *args: Any) -> T:
        """Journal calls run on their own small pool, so a slow or contended disk never stalls the
        event loop (heartbeats, other attempts), and attempts finishing together fsync in parallel."""
        return await asyncio.get_running_loop().run_in_executor(self._journal_pool, fn, *args)

    async def send_message(self, msg: Any) -> bool:
        return await self.session.send_message(msg)

    # -- life cycle ----------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        # `gh-runner drain --migrate`: drain, handing each attempt in its task to another runner first.
        loop.add_signal_handler(signal.SIGUSR1, self._on_migrate)

    def _on_migrate(self) -> None:
        if self._signals == 0:
            self.migrate = True
        self._on_signal(signal.SIGUSR1)

    def _on_signal(self, sig: int) -> None:
        self._signals += 1
        if self._signals == 1:
            self.log.info("stop requested: draining", signal=signal.Signals(sig).name,
                          in_flight=len(self.leases.running), grace_s=self.config.drain_grace)
            self.request_stop()
        else:
            self.log.warning("second stop signal: forcing shutdown", signal=signal.Signals(sig).name,
                             in_flight=len(self.leases.running))
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
        pid_file = self.config.state_dir / PID_FILE
        try:
            # Where `gh-runner drain` finds the process to signal (the systemd unit has its own MainPID).
            pid_file.write_text(f"{os.getpid()}\n")
        except OSError as e:
            self.log.warning("could not write the pid file; `gh-runner drain` will not find this runner",
                             path=str(pid_file), error=str(e))
        try:
            await self.main_loop()
        finally:
            try:
                await self.shutdown()
            finally:
                with contextlib.suppress(OSError):
                    if pid_file.read_text().strip() == str(os.getpid()):
                        pid_file.unlink()
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
        await self.outbox.load()
        self._emit("journal_backlog", self.outbox.pending)
        # Nothing runs yet, so everything this runner's provider still has is a leftover.
        await self._reap(keep=set())
        await self.inventory.refresh()
        await self._check_library()
        self.log.info("runner starting", version=__version__, server=self.session.url, slots=self.config.slots,
                      labels=self.config.labels, images=[i.name for i in self.inventory.images],
                      unacked_results=self.outbox.pending, pool=plan_pool(self.config).describe())
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
        self._emit("draining", len(self.leases.running))
        await self._drain()

    async def shutdown(self) -> None:
        """Close everything startup opened, in order; runs after the drain, or when `run` is cancelled."""
        # 1. No more reconnects: the session closes its socket and its task ends; live views end too.
        self.session.stop()
        await self.live_views.close_all()
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
        await self.leases.stop_pulls()
        if self.library is not None:
            await self.library.close()
        # 5. The provider releases its connections and its own machines (the hot pool).
        try:
            await within(30, self.provider.close())
        except Exception as e:
            self.log.warning("closing the provider failed", error=str(e))
        # 6. The journal's writers finish what they hold: every result is on disk before exit.
        await asyncio.get_running_loop().run_in_executor(None, self._journal_pool.shutdown)
        self.log.info("runner stopped", exit_code=self.exit_code, unacked_results=self.outbox.pending)
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
        if self.migrate and self.leases.running:
            if self.library is None or not self.save_points_told:
                self.log.warning("drain --migrate: nothing can be handed off (no registry, or a server that takes "
                                 "no save points); the attempts get the drain's grace as in any drain")
            else:
                handed = await self.leases.hand_off_all()
                self.log.info("drain --migrate: attempts handed off", handed_off=handed,
                              in_flight=len(self.leases.running))
        grace = self.config.drain_grace
        if self.leases.running:
            self.log.info("draining: waiting for attempts to finish", in_flight=sorted(self.leases.running),
                          grace_s=grace)
        await self._wait_idle(grace, stop_on_force=True)
        if self.leases.running or self.jobs.tasks:
            forced = self._force.is_set()
            reason = ("the runner was forced to stop (second stop signal)" if forced else
                      f"the runner shut down and the drain grace period ({grace:.0f} s) ran out")
            self.leases.cancel_all(reason)
            # Cancelled attempts still destroy their machines; give them the teardown time to do it,
            # or a short while once forced (the reaper of the next start gets whatever is left).
            await self._wait_idle(FORCED_TEARDOWN if forced else self.config.timeouts.teardown + 15,
                                  stop_on_force=not forced)
            if self._force.is_set():
                await self._wait_idle(FORCED_TEARDOWN, stop_on_force=False)
            left = self.leases.tasks + self.jobs.tasks
            for t in left:
                t.cancel()
            await asyncio.gather(*left, return_exceptions=True)
            if self._force.is_set():
                self.exit_code = 1
        try:
            await within(self.config.timeouts.teardown, self.jobs.close_all())
        except Exception as e:
            self.log.warning("closing open start states failed", error=str(e))
        # Give the server a moment to acknowledge what just finished; the journal keeps the rest.
        await self._wait_until(lambda: not self.outbox.pending or not self.session.connected,
                               2.0 if self._force.is_set() else 10.0, stop_on_force=False)

    async def _wait_idle(self, timeout: float, stop_on_force: bool) -> None:
        await self._wait_until(lambda: self.leases.idle and not self.jobs.tasks, timeout, stop_on_force)

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

    async def _resend_due(self) -> None:
        if self.session.connected:
            await self.outbox.resend_due()

    # -- provider ------------------------------------------------------------------------------

    async def _reap_live(self) -> None:
        """The reaper's timer: every machine of this runner that no attempt or job holds goes."""
        await self._reap(self.leases.machine_ids() | self.jobs.machine_ids)

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
        await self.inventory.refresh()
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
                    for i in self.inventory.images],
            start_states=[HeldVersion(start_state_id=s, version=v, pooled=(s, v) in hot_states)
                          for s, v in self.inventory.held],
            in_flight=sorted(self.leases.running),
            registry=(f"{self.library.registry.host}/{self.library.prefix}"
                      if self.library is not None and not self.library.auth_failed else None),
            in_flight_phases=self.leases.in_flight_phases(),
            status_acks=True,
            live_views=True,
            task_holds=True,
            scores=True,
            restores=True,
        )

    async def on_welcome(self, welcome: Welcome) -> None:
        self.status_acks = welcome.status_acks
        self.save_points_told = welcome.save_points_told
        self.not_here_refusals = welcome.not_here_refusals
        if welcome.name and welcome.name != self.config.name and self._take_registered_name(welcome.name):
            return
        self._emit("welcome", welcome)
        self._emit("connected", welcome.runner_id)
        # Attempts that ran on through a disconnect are only worth finishing if the server still
        # wants them; the others it has already turned into errors (and maybe retried elsewhere).
        given_up = set(self.leases.running) - set(welcome.resume)
        if given_up:
            self.log.warning("server gave these attempts up while disconnected; cancelling them",
                             attempt_ids=sorted(given_up))
            self.leases.cancel_all("the server gave this attempt up while the runner was disconnected",
                                   wanted=set(welcome.resume))
        await self.outbox.send_all()

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
            remember_name(self.config.state_dir, name)
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

    def _hypervisor_changed(self, up: bool, reason: str | None) -> None:
        """Said at once (a heartbeat now, not in up to 10 s): the server stops offering leases."""
        self._emit("hypervisor", up, reason)
        if self.session.connected:
            self._spawn(self.session.send_message(self.heartbeat()), "heartbeat-now")

    def on_disconnected(self, reason: str) -> None:
        # A takeover's holder reaches the machine only through the server: with the link gone, so is the
        # hold (the server ends it too), and the tasks' clocks run on.
        self.leases.release_holds()
        self._changed.set()
        self._emit("disconnected", reason)

    def on_reconnect_scheduled(self, failures: int, delay: float) -> None:
        self._emit("reconnect_scheduled", failures, delay)

    async def on_message(self, msg: Any) -> None:
        """The router: each server message to the part that handles it."""
        if isinstance(msg, Lease):
            await self.leases.on_lease(msg)
        elif isinstance(msg, MachineRequest):
            self._spawn(self._on_request(msg), f"request-{msg.request_id[:64]}")
        elif isinstance(msg, TaskEnd):
            if not self.leases.task_end(msg):
                await self._not_running("task_end", msg.attempt_id)
        elif isinstance(msg, TaskHold):
            if not self.leases.task_hold(msg):
                self.log.info("task_hold ignored: the attempt is not in its task here", attempt_id=msg.attempt_id,
                              held=msg.held)
        elif isinstance(msg, Cancel):
            if not await self.leases.cancel(msg):
                await self._not_running("cancel", msg.attempt_id)
        elif isinstance(msg, ResultAck):
            await self._on_ack(msg)
        elif isinstance(msg, StatusAck):
            self.leases.status_ack(msg)
        elif isinstance(msg, Job):
            await self._on_job(msg)
        elif isinstance(msg, ViewOpen):
            self.live_views.open(msg)
        elif isinstance(msg, ViewClose):
            self.live_views.close(msg)
        else:
            await self.session.send_message(ErrorMsg(code="unsupported", message=f"runner does not handle {msg.type}",
                                             ref_type=msg.type))

    def _spawn(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        """Run `work` beside the session's reader (a request must not hold up the next message)."""
        task = asyncio.create_task(work, name=name)
        self._request_tasks.add(task)
        task.add_done_callback(self._request_tasks.discard)

    async def _not_running(self, ref_type: str, attempt_id: str) -> None:
        await self.session.send_message(ErrorMsg(code="refused", ref_type=ref_type,
                                                 message=f"attempt {attempt_id[:128]} is not running on this runner"))

    # -- leases --------------------------------------------------------------------------------

    def _state(self) -> RunnerState:
        """What admission looks at, now."""
        return RunnerState(
            draining=self.draining, hypervisor_up=self.hypervisor.up, hypervisor_reason=self.hypervisor.reason,
            busy=self.busy, slots=self.config.slots, labels=self.config.labels,
            images={i.name for i in self.inventory.images}, held=set(self.inventory.held),
            can_pull=self.library is not None)

    async def _on_ack(self, msg: ResultAck) -> None:
        try:
            acked = await self.outbox.ack(msg.attempt_id)
        except OSError as e:
            self.log.error("could not drop an acknowledged result from the journal", attempt_id=msg.attempt_id,
                           error=str(e))
            acked = True
        if acked:
            self._changed.set()
            self._emit("journal_backlog", self.outbox.pending)

    # -- during an attempt ---------------------------------------------------------------------

    async def _on_request(self, req: MachineRequest) -> None:
        try:
            resp = await self.leases.request(req) if req.attempt_id else None
            if resp is None and req.start_state_id and not req.attempt_id:
                resp = await self.jobs.handle_request(req)
            if resp is None:
                target = (f"attempt {req.attempt_id}" if req.attempt_id else
                          f"start state {req.start_state_id}" if req.start_state_id else "no attempt or start state")
                # Typed for an attempt (a moved attempt's lease may still be on its way here): the server asks
                # again while the attempt is still running on this runner.
                not_here = MachineRefusal.NOT_HERE if req.attempt_id and self.not_here_refusals else None
                resp = MachineResponse(request_id=req.request_id, ok=False, refusal=not_here,
                                       error=f"{target} is not running on this runner"[:300])
        except Exception as e:
            self.log.exception("machine request failed", attempt_id=req.attempt_id, op=req.op)
            resp = MachineResponse(request_id=req.request_id, ok=False,
                                   error=f"{req.op} failed in the runner: {type(e).__name__}")
        await self.session.send_message(resp)

    async def _view_machine(self, msg: ViewOpen, timeout: float) -> Machine | None:
        if msg.attempt_id:
            return self.leases.machine_of(msg.attempt_id)
        return await self.jobs.open_machine(msg.start_state_id, timeout) if msg.start_state_id else None

    # -- start-state jobs ----------------------------------------------------------------------

    async def _on_job(self, job: Job) -> None:
        slot = self.jobs.slot_key(job)
        refusal = admission.job_refusal(job, slot is not None, self._state())
        if refusal is not None:
            await self.session.send_message(JobResult(job_id=job.job_id, ok=False, error=refusal,
                                                      start_state_id=job.start_state_id))
            return
        if slot is not None:
            self.slots.take(slot, SlotHolder.JOB)
            self._busy_changed()
        self.jobs.start(job, self._job_done)

    async def _job_done(self, job: Job, result: JobResult) -> None:
        for key in self.jobs.slots_freed_by(job):
            self.slots.release(key)
        self._busy_changed()
        if result.ok and job.op in ("build", "save", "delete"):
            await self.inventory.refresh()
        await self.session.send_message(result)
