"""The leases this runner holds: each attempt's way from the server's offer to its result.

    admission -> [pull] -> journal the in-flight record -> lease_accept -> the attempt's task
    -> its result into the outbox (journaled) -> the slot frees -> attempt_result (at least once)

- admission (`gh_runner.admission`) decides from the runner's state whether the lease is taken;
  a refusal has a typed code the server acts on.
- a start-state version this runner does not hold is pulled from the registry (`gh_runner.library`)
  in its own task, holding a slot, before the accept: a registry fault is a refusal (the attempt
  goes to a holder, or waits), never an error verdict. Its seconds are the result's `fetch` phase.
- the in-flight record is written before `lease_accept`, so a runner that crashes afterwards turns
  the attempt into an error at its next start (`Journal.recover`).
- `Attempt.run()` runs in its own task with the attempt id bound in the log context; the agent's
  requests, its task_end and the server's cancel reach it here while it runs.
- the result is journaled (fsync) by the outbox before it is first sent; the slot frees then, with
  the machine's destroy still running (a crash before it ends leaves a domain the reaper removes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import structlog

from gh_runner import admission, diskguard
from gh_runner.admission import RunnerState, SlotHolder, Slots
from gh_runner.attempt import FETCH
from gh_runner.attempt_link import DaemonLink
from gh_runner.config import RunnerConfig, Timeouts
from gh_runner.inventory import Inventory
from gh_runner.journal import DiskFull, InflightRecord, Journal
from gh_runner.library import FetchRefused, Library
from gh_runner.log import bind_attempt, get_logger, redactor
from gh_runner.outbox import ResultOutbox
from gh_runner.save_points import SAVE_TIMEOUT
from gh_wire.protocol import (
    ATTEMPT_STATUSES,
    AttemptHandoff,
    AttemptResult,
    Cancel,
    InFlightPhase,
    Lease,
    LeaseAccept,
    LeaseRefusal,
    LeaseRefuse,
    MachineRefusal,
    MachineRequest,
    MachineResponse,
    StatusAck,
    TaskEnd,
    TaskHold,
)
from gh_wire.vocab import CancelReason
from providers.base import Machine, Provider, ProviderError

T = TypeVar("T")


class AttemptLike(Protocol):
    """What the runner needs of `gh_runner.attempt.Attempt` (tests give it doubles)."""

    machine_id: str
    machine: Machine | None  # once made (a live view of it: gh_runner/live_views.py)

    @property
    def masked(self) -> asyncio.Event: ...  # set once a secret is typed: watchers' views end

    async def run(self) -> AttemptResult: ...
    async def handle_request(self, req: MachineRequest) -> MachineResponse: ...
    def task_end(self, msg: TaskEnd) -> None: ...
    def agent_started(self, late_seconds: float | None = None) -> None: ...
    def task_hold(self, held: bool) -> bool: ...
    def cancel(self, reason: str) -> None: ...
    async def wait_torn_down(self) -> None: ...


AttemptFactory = Callable[[Lease, Provider, Any, Timeouts], AttemptLike]


def default_attempt_factory(lease: Lease, provider: Provider, link: Any, timeouts: Timeouts) -> AttemptLike:
    from gh_runner.attempt import Attempt

    return Attempt(lease, provider, link, timeouts, background_teardown=True)


@dataclass
class Running:
    lease: Lease
    attempt: AttemptLike
    record: InflightRecord
    task: asyncio.Task[None] | None = None
    redact: set[str] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # orders this attempt's journal writes
    fetch_seconds: float | None = None  # the `fetch` phase: the pull of its version before the accept
    uses_version: tuple[str, int] | None = None  # marked in use in the library until the attempt ends
    link: DaemonLink | None = None  # its link to the server (its save points' pushes: `drain --migrate`)
    migrated: bool = False  # it went on on another runner (`drain --migrate`): its save points here are moot


class Leases:
    def __init__(
        self,
        config: RunnerConfig,
        provider: Provider,
        *,
        attempt_factory: AttemptFactory,
        journal: Journal,
        run_io: Callable[..., Awaitable[Any]],
        outbox: ResultOutbox,
        slots: Slots,
        inventory: Inventory,
        library: Library | None,
        state: Callable[[], RunnerState],
        send: Callable[[Any], Awaitable[bool]],
        status_acks: Callable[[], bool],
        save_points_told: Callable[[], bool],
        emit: Callable[..., None],
        changed: Callable[[], None],
        errored: Callable[[], None],
    ) -> None:
        """`state()` is the runner's state for admission; `emit(event, *args)` reaches the daemon's
        observers; `changed()` says that what holds a slot changed; `errored()` that an attempt ended in
        error (the likeliest moment to find the hypervisor gone)."""
        self.config = config
        self.provider = provider
        self.attempt_factory = attempt_factory
        self.journal = journal
        self._run_io = run_io
        self.outbox = outbox
        self.slots = slots
        self.inventory = inventory
        self.library = library
        self._state = state
        self._send = send
        self._status_acks = status_acks
        self._save_points_told = save_points_told
        self._emit = emit
        self._changed = changed
        self._errored = errored
        self.log = get_logger("gh_runner.leases", runner=config.name)
        self.running: dict[str, Running] = {}  # attempt id -> its attempt, from the accept to its result
        self.tearing_down: dict[str, str] = {}  # attempt id -> machine id, destroy still running
        self._pulls: set[asyncio.Task[None]] = set()

    # -- what the daemon asks ----------------------------------------------------------------

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return [r.task for r in self.running.values() if r.task is not None]

    @property
    def idle(self) -> bool:
        """No attempt runs and no machine of one is still being destroyed."""
        return not self.running and not self.tearing_down

    def machine_ids(self) -> set[str]:
        """Every machine the attempts hold (the reaper keeps them)."""
        return ({r.attempt.machine_id for r in self.running.values()} | set(self.running)
                | set(self.tearing_down.values()))

    def in_flight_phases(self) -> list[InFlightPhase]:
        """Each in-flight attempt's last status: the resend of any status the link lost."""
        out = []
        for aid, running in sorted(self.running.items()):
            rec = running.record
            if rec.phase_at is None or rec.status not in ATTEMPT_STATUSES:
                continue  # accepted, no status yet: the server has it as leased
            out.append(InFlightPhase(attempt_id=aid, status=rec.status, phase=rec.phase,  # type: ignore[arg-type]
                                     at=datetime.fromisoformat(rec.phase_at)))
        return out

    def cancel_all(self, reason: str, wanted: set[str] | None = None) -> None:
        """Cancel every running attempt (or those not in `wanted`): each still destroys its machine
        and reports `error` "cancelled: <reason>"."""
        for aid, running in list(self.running.items()):
            if wanted is None or aid not in wanted:
                running.attempt.cancel(reason)

    async def hand_off_all(self) -> int:
        """`drain --migrate`: each attempt in its task is saved now (a save point, pushed to the registry)
        and handed to the server to go on elsewhere (`attempt_handoff`; the server cancels it here, reason
        `migrated`, once another runner has it). Those not in their task, or whose save point could not be
        made or pushed, run on here as in any drain. Returns how many were handed off."""
        handed = await asyncio.gather(*(self._hand_off(aid, r) for aid, r in list(self.running.items())))
        return sum(handed)

    async def _hand_off(self, aid: str, running: Running) -> bool:
        if running.link is None or self.library is None:
            return False
        try:
            async with asyncio.timeout(SAVE_TIMEOUT + 30):
                saved = await running.attempt.handle_request(
                    MachineRequest(request_id=f"migrate-{aid}", attempt_id=aid, op="save_point"))
            if not saved.ok or saved.save_point is None:
                self.log.info("not handed off: no save point now; it runs on here", attempt_id=aid,
                              reason=saved.error)
                return False
            async with asyncio.timeout(self.library.push_bound(saved.save_point.bytes) + 30):
                pushed = await running.link.pushed(saved.save_point.save_point_id)
        except TimeoutError:
            self.log.warning("not handed off: its save point took too long; it runs on here", attempt_id=aid)
            return False
        if pushed is None or pushed.registry_ref is None:
            self.log.warning("not handed off: its save point was not pushed; it runs on here", attempt_id=aid)
            return False
        await self._send(AttemptHandoff(attempt_id=aid, save_point=pushed))
        self.log.info("attempt handed off to go on elsewhere", attempt_id=aid, save_point_id=pushed.save_point_id,
                      step=pushed.step)
        return True

    async def stop_pulls(self) -> None:
        """Stop the pulls still running (their leases were never accepted)."""
        for task in list(self._pulls):
            task.cancel()
        await asyncio.gather(*self._pulls, return_exceptions=True)

    # -- the server's messages -----------------------------------------------------------------

    async def on_lease(self, lease: Lease) -> None:
        aid = lease.attempt_id
        if aid in self.running:  # our accept was lost on the way: say it again
            await self._send(LeaseAccept(attempt_id=aid))
            return
        if aid in self.outbox and lease.restore is not None and self.outbox.interrupted(aid):
            # The server heard our hello and resumes the attempt this process's predecessor left: the
            # report of its interruption is moot (the server applies none to an attempt it resumed).
            try:
                await self.outbox.ack(aid)
            except OSError as e:
                await self._refuse(aid, LeaseRefusal.JOURNAL_FAILED,
                                   f"runner cannot write its journal: {e.strerror or e}")
                return
        if aid in self.outbox:
            await self._refuse(aid, LeaseRefusal.DUPLICATE,
                               "already finished on this runner; its result is being re-sent")
            await self.outbox.send(aid)
            return
        refusal = admission.lease_refusal(lease, self._state())
        if refusal is not None and refusal.code is LeaseRefusal.IMAGE_MISSING:
            await self.inventory.refresh()  # an image may have been installed since the hello
            refusal = admission.lease_refusal(lease, self._state())
        if refusal is None:
            refusal = diskguard.lease_refusal(self.config.state_dir, self.config.disk_reserve_mib * diskguard.MIB)
        if refusal is not None:
            await self._refuse(aid, refusal.code, refusal.message)
            return
        if admission.needs_pull(lease, can_pull=self.library is not None):
            # The pull (when the version is not held) runs in its own task, holding a slot, so other
            # messages go on; the lease is accepted or refused when it ends.
            self.slots.take(aid, SlotHolder.PULL)
            self._changed()
            task = asyncio.create_task(self._pull_then_start(lease), name=f"fetch-{aid}")
            self._pulls.add(task)
            task.add_done_callback(self._pulls.discard)
            return
        await self._start(lease)

    def task_end(self, msg: TaskEnd) -> bool:
        """False when the attempt is not running here."""
        running = self.running.get(msg.attempt_id)
        if running is not None:
            running.attempt.task_end(msg)
        return running is not None

    def task_hold(self, msg: TaskHold) -> bool:
        """False when the attempt is not in its task here (the hold is ignored)."""
        running = self.running.get(msg.attempt_id)
        return running is not None and running.attempt.task_hold(msg.held)

    def release_holds(self) -> None:
        """The link to the server is gone, and with it every takeover's holder: the tasks' clocks run on."""
        for running in self.running.values():
            running.attempt.task_hold(False)

    def status_ack(self, msg: StatusAck) -> None:
        running = self.running.get(msg.attempt_id)
        if running is not None and msg.status == "running":  # acks are idempotent, may cross the result
            running.attempt.agent_started(msg.late_seconds)

    async def cancel(self, msg: Cancel) -> bool:
        """False when the attempt is neither running here nor over with its result unacknowledged."""
        running = self.running.get(msg.attempt_id)
        if running is not None:
            self.log.info("cancel from the server", attempt_id=msg.attempt_id, reason=msg.reason)
            running.migrated = msg.reason == CancelReason.MIGRATED
            running.attempt.cancel(msg.reason)
            return True
        if msg.attempt_id in self.outbox:
            await self.outbox.send(msg.attempt_id)  # already over: the result says how
            return True
        return False

    def machine_of(self, attempt_id: str) -> Machine | None:
        """The machine of a running attempt, once made; None when it is not running here."""
        running = self.running.get(attempt_id)
        return running.attempt.machine if running is not None else None

    def masked_of(self, attempt_id: str) -> asyncio.Event | None:
        """Set once a secret is typed in this running attempt (its replay masks from then); None when it
        is not running here."""
        running = self.running.get(attempt_id)
        return running.attempt.masked if running is not None else None

    async def request(self, req: MachineRequest) -> MachineResponse | None:
        """The agent's request on its attempt's machine; None when that attempt is not running here.

        An attempt whose lease is still pulling its version here (one going on from a save point pushed by
        a lost runner: the server moved it to this runner with the lease) is away, as it is while its
        machine is made: nothing is done, and the server asks again (not a machine failure)."""
        running = self.running.get(req.attempt_id or "")
        if running is None:
            if req.attempt_id and self.slots.holds(req.attempt_id, SlotHolder.PULL):
                return MachineResponse(request_id=req.request_id, ok=False, refusal=MachineRefusal.AWAY,
                                       error=f"attempt {req.attempt_id[:128]} is pulling its start state here; "
                                             "its machine is not made yet")
            return None
        bind_attempt(running.lease.attempt_id)
        values = [v for v in req.redact if v]
        running.redact.update(values)
        redactor.add(*values)
        return await running.attempt.handle_request(req)

    # -- a lease's way -------------------------------------------------------------------------

    async def _refuse(self, attempt_id: str, code: LeaseRefusal, reason: str) -> None:
        self.log.info("lease refused", attempt_id=attempt_id[:128], reason=reason, code=code)
        self._emit("lease_refused", attempt_id, reason)
        await self._send(LeaseRefuse(attempt_id=attempt_id, reason=reason, code=code))

    async def _pull_then_start(self, lease: Lease) -> None:
        assert self.library is not None and lease.start_state.kind == "state"
        aid = lease.attempt_id
        ref = lease.start_state
        key = (str(ref.start_state_id), int(ref.version or 0))
        image = self.inventory.image(ref.image)
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
            await self.inventory.now_held(key, pulled=seconds > 0)
            try:
                started = await self._start(lease, fetch_seconds=seconds, uses_version=key)
            except BaseException:
                self.library.release(*key)
                raise
            if not started:
                self.library.release(*key)
        finally:
            if self.slots.holds(aid, SlotHolder.PULL):  # refused: the pull's slot is free again
                self.slots.release(aid)
            self._changed()

    async def _start(self, lease: Lease, *, fetch_seconds: float | None = None,
                     uses_version: tuple[str, int] | None = None) -> bool:
        """Journal, make and accept the attempt; False when it was refused instead."""
        aid = lease.attempt_id
        try:
            record = await self._run_io(self.journal.record_inflight, aid, aid, lease.test_run_id)
        except OSError as e:
            await self._refuse(aid, LeaseRefusal.JOURNAL_FAILED, f"runner cannot write its journal: {e.strerror or e}")
            return False
        link = DaemonLink(aid, send=self._send, note_phase=lambda *a: self._note_phase(aid, *a),
                          status_acks=self._status_acks, save_points_told=self._save_points_told,
                          first_seq=lease.restore.replay_seq if lease.restore is not None else 0,
                          library=self.library)
        try:
            attempt = self.attempt_factory(lease, self.provider, link, self.config.timeouts)
        except Exception as e:
            self.log.exception("could not create the attempt", attempt_id=aid)
            await self._run_io(self.journal.drop_inflight, aid)
            await self._refuse(aid, LeaseRefusal.START_FAILED,
                               f"runner could not start the attempt: {type(e).__name__}: {e}")
            return False
        running = Running(lease=lease, attempt=attempt, record=record, fetch_seconds=fetch_seconds,
                          uses_version=uses_version, link=link)
        self.running[aid] = running
        self.slots.take(aid, SlotHolder.ATTEMPT)  # a pull's slot becomes the attempt's: counted once
        await self._send(LeaseAccept(attempt_id=aid))
        running.task = asyncio.create_task(self._run(running), name=f"attempt-{aid}")
        self.log.info("lease accepted", attempt_id=aid, case=lease.case.name, busy=self.slots.busy)
        self._emit("attempt_started", aid)
        self._changed()
        return True

    async def _note_phase(self, attempt_id: str, status: str, phase: str, at: datetime) -> None:
        """Note an attempt's phase in its in-flight record (not fsync'd: for crash reports and the hello)."""
        running = self.running.get(attempt_id)
        if running is None:
            return
        async with running.lock:  # never after the result that ends the attempt
            try:
                await self._run_io(self.journal.update_phase, running.record, status, phase, at)
            except OSError as e:
                self.log.warning("could not note the phase in the journal", attempt_id=attempt_id, error=str(e))

    async def _run(self, running: Running) -> None:
        aid = running.lease.attempt_id
        bind_attempt(aid)
        log = structlog.get_logger("gh_runner.leases")
        result = await self._result_of(running)
        async with running.lock:
            not_journaled = await self.outbox.put(result)
        if not_journaled is not None:
            # Sent all the same: the server may well ack before anything else goes wrong. The in-flight
            # record is gone either way (`Journal.finish`): the attempt is over.
            what = "the disk is full" if isinstance(not_journaled, DiskFull) else "the journal could not be written"
            log.error(f"result NOT journaled ({what}); sending it anyway, it is lost if the runner stops "
                      "before the server acknowledges it", error=str(not_journaled), outcome=result.outcome)
        else:
            log.info("result journaled, sending", outcome=result.outcome, error=result.error)
        # The slot frees here, with the machine's destroy still running: the result is safe on disk,
        # and a crash before the destroy ends leaves a domain the reaper at the next start removes.
        self.tearing_down[aid] = running.attempt.machine_id
        self.running.pop(aid, None)
        self.slots.release(aid)
        if running.uses_version is not None and self.library is not None:
            self.library.release(*running.uses_version)
        redactor.discard(running.redact)
        if result.outcome == "error":
            self._errored()
        self._emit("attempt_finished", result)
        self._emit("journal_backlog", self.outbox.pending)
        self._changed()
        try:
            await self.outbox.send(aid)
            await running.attempt.wait_torn_down()
            if running.migrated:
                await self._drop_save_points(result)
        finally:
            self.tearing_down.pop(aid, None)
            self._changed()

    async def _drop_save_points(self, result: AttemptResult) -> None:
        """A migrated attempt's save points here: the attempt goes on elsewhere from the one pushed to the
        registry, and lists only that runner's from then on, so nothing would ever collect these."""
        for point in result.save_points or []:
            try:
                await self.provider.delete_version(point.save_point_id, 1)
            except Exception as e:  # held_versions lists it: a leftover an operator can see
                self.log.warning("a migrated attempt's save point not deleted", save_point_id=point.save_point_id,
                                 error=f"{type(e).__name__}: {str(e)[:200]}")

    async def _result_of(self, running: Running) -> AttemptResult:
        """The attempt's result; a crash of ours or a forced stop is an `error` result, never lost."""
        aid = running.lease.attempt_id
        started = datetime.now(UTC)
        try:
            result = await running.attempt.run()
        except asyncio.CancelledError:
            return AttemptResult(attempt_id=aid, outcome="error", error_phase="shutdown", started_at=started,
                                 finished_at=datetime.now(UTC),
                                 error="the runner was forced to stop before the attempt could clean up")
        except Exception as e:
            self.log.exception("attempt crashed", attempt_id=aid)
            return AttemptResult(attempt_id=aid, outcome="error", error_phase="runner", started_at=started,
                                 finished_at=datetime.now(UTC),
                                 error=f"internal runner error: {type(e).__name__}: {redactor.scrub(str(e))[:300]}")
        if running.fetch_seconds is not None:  # the `fetch` phase ran before the accept: it comes first
            phases = {FETCH: running.fetch_seconds, **result.metrics.phase_seconds}
            result = result.model_copy(update={"metrics": result.metrics.model_copy(
                update={"phase_seconds": phases})})
        if result.attempt_id != aid:
            self.log.error("attempt returned a result for another id; fixing it", attempt_id=aid,
                           got=result.attempt_id)
            result = result.model_copy(update={"attempt_id": aid})
        return result
