"""One attempt on this runner, from a lease to a result.

The phases run in the order `_lifecycle` reads, each bounded by its own timeout:

    [fetch] -> machine -> ready -> setup -> check_before -> first_screen -> task -> check_after -> last_screen
    (teardown, always, in `run`'s finally)

An attempt that goes on from a save point (`lease.restore`: its runner was lost mid-task) makes its
machine from that save point and, instead of setup, the check before and the first screen, runs
`resume`: the guest's clock set by a first script, and the replay marked. Its task then picks up at
the save point's step and task time, and the agent's first action is refused `machine_restored`
(gh_runner/machine_requests.py), so that it looks again:

    [fetch] -> machine -> ready -> resume -> task -> check_after -> last_screen

Each check phase runs the case's checkpoints one after another (its check_script alone when it has
none); their scores' weighted mean is the try's score (`gh_runner.outcome.weighted_mean`).

`fetch` is the pull of a start-state version this runner did not hold, from the registry
(gh_runner.library). The daemon runs it before it accepts the lease, so that a registry fault is a
refusal (the attempt goes to a holder or waits) and never an error verdict; its seconds are the
first entry of the result's `phase_seconds`.

A phase that goes wrong raises `AttemptError(phase, reason)` with a reason an operator can act on;
`run` turns it into an `error` result. The verdict rules themselves live in `gh_runner.outcome`,
replay capture and redaction in `gh_runner.replay`.

The daemon drives an `Attempt` from outside: `run()` in a task, `handle_request` for the agent's
machine requests (answered only during the task, by `gh_runner.machine_requests`), `task_end` when
the agent is done, and `cancel` to stop at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import structlog

from gh_common.task_clock import TaskClock
from gh_common.task_hold import TaskHold
from gh_runner import answer_file
from gh_runner import outcome as rules
from gh_runner.config import Timeouts
from gh_runner.inventory import source_of
from gh_runner.machine_requests import SCRIPT_SLACK, MachineRequests, refuse
from gh_runner.replay import ReplayRecorder
from gh_runner.save_points import SavePoints
from gh_wire.protocol import (
    AttemptMetrics,
    AttemptResult,
    CheckOutput,
    Checkpoint,
    CheckpointScore,
    Lease,
    MachineRefusal,
    MachineRequest,
    MachineResponse,
    Outcome,
    Restore,
    SavePoint,
    TaskEnd,
    TaskEndReason,
)
from gh_wire.vocab import ErrorCause, FailReason
from providers.base import Machine, Provider, ScriptResult
from providers.errors import MachineNotReady, ProviderError

log = structlog.get_logger(__name__)

T = TypeVar("T")

# Phase names: the keys of metrics.phase_seconds and the `phase` of status reports and errors.
FETCH = "fetch"  # before the accept, in the daemon (see above)
MACHINE = "machine"
READY = "ready"
SETUP = "setup"
CHECK_BEFORE = "check_before"
FIRST_SCREEN = "first_screen"
RESUME = "resume"
TASK = "task"
CHECK_AFTER = "check_after"
LAST_SCREEN = "last_screen"
TEARDOWN = "teardown"

CHECK_OUTPUT_CAP = 1024 * 1024
LINK_TIMEOUT = 10.0  # a status report that takes longer than this is dropped (best effort)
WATCH_INTERVAL = 1.0  # at most one "change" frame per second

_background: set[asyncio.Task[Any]] = set()  # shielded destroys outliving a cancelled teardown


class AttemptLink(Protocol):
    """Implemented by the daemon, one per attempt. Both calls are best effort from our side.

    `status_acks`: the server acknowledges each status it applies (`status_ack`), so a task whose
    start was never acknowledged, and that saw no request or task_end, never had an agent."""

    status_acks: bool

    async def status(self, status: str, phase: str) -> None: ...

    async def frame(self, label: str, png: bytes, event: dict[str, Any] | None) -> None: ...

    async def save_point_made(self, point: SavePoint) -> None: ...


class AttemptError(Exception):
    """A phase went wrong; `reason` is for an operator (what failed, what the guest said)."""

    def __init__(self, phase: str, reason: str, cause: ErrorCause = ErrorCause.INFRASTRUCTURE) -> None:
        super().__init__(f"{phase}: {reason}")
        self.phase = phase
        self.reason = reason
        self.cause = cause  # ours unless a judgement of the case's own scripts says otherwise


def _now() -> datetime:
    return datetime.now(UTC)


# How a phase's failure reads, by phase: the timeout and a provider error.
_TIMEOUT_WHAT = {
    MACHINE: "the machine was not made (disk, domain, boot or restore) within {t:g} s",
    READY: "the guest channel did not answer within {t:g} s: the machine did not boot, or its guest agent "
    "(or WinRM) is not running",
    SETUP: "the guest stopped answering while the setup script ran (no result {t:g} s after it started)",
    CHECK_BEFORE: "the guest stopped answering while the check script ran (no result {t:g} s after it started)",
    CHECK_AFTER: "the guest stopped answering while the check script ran (no result {t:g} s after it started)",
}
_PROVIDER_WHAT = {
    MACHINE: "could not make the machine",
    READY: "the guest channel never came up",
    SETUP: "could not run the setup script",
    CHECK_BEFORE: "could not run the check script",
    CHECK_AFTER: "could not run the check script",
}


class Attempt:
    def __init__(
        self,
        lease: Lease,
        provider: Provider,
        link: AttemptLink,
        timeouts: Timeouts = Timeouts(),
        *,
        seconds_per_minute: float = 60.0,  # test hook: scales limits.minutes
        background_teardown: bool = False,
    ) -> None:
        self.lease = lease
        self.provider = provider
        self.link = link
        self.timeouts = timeouts
        self.machine_id: str = lease.attempt_id
        self.machine: Machine | None = None
        self._requests: MachineRequests | None = None  # serves the agent's requests once the machine is made
        self.phase = "pending"
        self._seconds_per_minute = seconds_per_minute
        self._log = log.bind(attempt_id=lease.attempt_id)
        self._replay = ReplayRecorder(link, attempt_id=lease.attempt_id)
        self._metrics = AttemptMetrics()
        self._check_before: CheckOutput | None = None
        self._check_after: CheckOutput | None = None
        self._before_scores: dict[str, float] = {}  # checkpoint name -> its score before the task
        self._checkpoints: list[CheckpointScore] | None = None  # after the task, when the case has them
        self._outcome: Outcome | None = None
        self._error: AttemptError | None = None
        self._check_absent = False
        self._limit_reached = False
        self._ending: rules.TaskEnding | None = None
        self._task_end: TaskEnd | None = None
        self._task_end_seen = asyncio.Event()
        self._hold: TaskHold | None = None  # the task's clock and a person's hold on it (gh_common/task_hold.py)
        self._agent_seen = False  # the server acknowledged the task's start, or the agent acted
        self._agent_acted = False  # the agent sent an exec or input during the task
        self._failed_reason: FailReason | None = None
        self._task_over = False
        self._accepting = False  # machine requests are served only while this is set (task phase)
        self._closed_reason: str | None = None
        self._inflight: set[asyncio.Task[MachineResponse]] = set()
        self._create: asyncio.Future[Machine] | None = None
        self._body: asyncio.Task[None] | None = None
        self._cancel_reason: str | None = None
        self._cancel_phase: str | None = None
        self._returned = False
        # The daemon's mode: `run` returns as soon as the result is known and the machine's destroy
        # runs on in `_torn_down` (awaited by `wait_torn_down`), so a slot frees after the journal,
        # not after libvirt reaps a domain (1-2 s). The reaper at start covers a crash in between.
        self._background_teardown = background_teardown
        self._torn_down: asyncio.Task[None] | None = None

    # -----------------------------------------------------------------------------------------
    # The lifecycle, top to bottom
    # -----------------------------------------------------------------------------------------

    async def _lifecycle(self) -> None:
        t = self.timeouts
        script_t = min(self.lease.script_timeout, t.setup)
        check_t = self._check_timeout()

        await self._status("preparing", MACHINE)
        self.machine = await self._phase(MACHINE, t.machine, self._make_machine)

        await self._status("preparing", READY)
        await self._phase(READY, t.ready, lambda: self._machine().wait_ready(t.ready))

        checks = self._checks()
        if self.lease.restore is not None:
            restore = self.lease.restore
            await self._phase(RESUME, script_t, lambda: self._resume(restore, script_t))
        else:
            await self._prepare_task(checks, script_t, check_t)

        await self._status("running", TASK)
        end = await self._phase(TASK, None, self._task)
        if end is None and self._limit_reached and not self._agent_seen and self.link.status_acks:
            # Not the agent's failure: it never came (the task began while the link to the server was
            # down, and the server heard of it too late or not at all). Ours: an error, retried.
            raise AttemptError(TASK, "the agent never started: the server did not acknowledge the start of the "
                               "task before its time limit (the link to the server was down)")
        self._ending = rules.task_ending(end, self._limit_reached)
        if self._ending.error:
            raise AttemptError(TASK, self._ending.error)
        answer = self._ending.answer

        if checks:
            await self._status("checking", CHECK_AFTER)
            if not await self._check_after_scored(checks, answer, check_t):
                # The agent left the check no channel to run on: its failure (see _check_after_run).
                self._outcome = "failed"
                self._failed_reason = FailReason.CHECK_CHANNEL_LOST_IN_TASK
                await self._phase(LAST_SCREEN, None, lambda: self._capture("last"))
                return
        else:
            # Rubric only: nothing for the runner to judge. `check_absent` tells the server that
            # "passed" here is provisional and the rubric decides.
            self._check_absent = True
            self._outcome = "passed"

        await self._phase(LAST_SCREEN, None, lambda: self._capture("last"))

    async def _prepare_task(self, checks: list[Checkpoint], script_t: float, check_t: float) -> None:
        """setup -> check_before -> first_screen: the broken machine, checked broken, and its first frame."""
        case = self.lease.case
        if case.setup_script:
            await self._status("preparing", SETUP)
            res = await self._phase(SETUP, script_t,
                                    lambda: self._script(case.setup_script or "", {}, script_t))
            setup = rules.judge_setup(res, script_t)
            if setup is not None:
                raise AttemptError(SETUP, setup.reason or "the setup failed", setup.cause or ErrorCause.INFRASTRUCTURE)

        if checks:
            await self._status("checking", CHECK_BEFORE)
            await self._check_before_run(checks, check_t)

        await self._phase(FIRST_SCREEN, None, lambda: self._capture("first"))

    async def _resume(self, restore: Restore, script_t: float) -> None:
        """The machine is the save point's, as it was then: a first script sets its clock (the provider
        sets a restored guest's clock in it, or beside it), and the replay marks where the task picks up."""
        point = restore.save_point
        self._metrics.resumed = restore.resumed
        self._log.info("the attempt goes on from a save point", save_point_id=point.save_point_id, step=point.step,
                       task_seconds=point.task_seconds, resumed=restore.resumed)
        res = await self._script("exit 0", {}, script_t)
        if res.exit_code != 0:
            raise AttemptError(RESUME, f"the restored guest did not run a script (exit {res.exit_code}): "
                               f"{rules.last_line(res.stderr or res.stdout)}")
        await self._capture_event("resumed", {"resumed": restore.resumed, "save_point_id": point.save_point_id,
                                              "step": point.step})

    # -----------------------------------------------------------------------------------------
    # What the daemon calls
    # -----------------------------------------------------------------------------------------

    async def run(self) -> AttemptResult:
        """Run the attempt to its result. Never raises except CancelledError (when the caller's task is
        cancelled); destroys its machine in every case (with background teardown, the destroy is
        started here and finishes after the return: see `wait_torn_down`)."""
        started = _now()
        self._log.info("attempt started", case=self.lease.case.test_case_id, image=self.lease.start_state.image)
        try:
            if self._cancel_reason is None:
                self._body = asyncio.create_task(self._guarded_lifecycle(), name=f"attempt-{self.machine_id}")
                try:
                    await self._body
                except asyncio.CancelledError:
                    if self._outer_cancelled() or self._cancel_reason is None:
                        raise
        finally:
            await self._teardown()
        result = self._result(started)
        self._log.info("attempt finished", outcome=result.outcome, error_phase=result.error_phase,
                       error=result.error, phase_seconds=result.metrics.phase_seconds)
        self._returned = True
        await self._status("done", "done")
        return result

    async def handle_request(self, req: MachineRequest) -> MachineResponse:
        """Answer the agent's screen/input/exec request, or refuse it with a reason."""
        if self.phase == TASK:
            self._agent_seen = True  # a request for this attempt: an agent is at work
            if req.op in ("exec", "input"):
                self._agent_acted = True  # it could have broken the guest's channel
        if not self._accepting or self._requests is None:
            refusal = self._stopped(refuse(req, self._why_not_now()))
            if self._restoring():
                refusal.refusal = MachineRefusal.AWAY  # nothing done: the server asks again once the task is on
            return refusal
        op = asyncio.create_task(self._requests.serve(req), name=f"request-{req.request_id}")
        self._inflight.add(op)
        op.add_done_callback(self._inflight.discard)
        try:
            return await op
        except asyncio.CancelledError:
            if self._outer_cancelled():
                raise
            return self._stopped(refuse(req, f"stopped before it finished: {self._closed_reason or 'the task ended'}"))

    @property
    def masked(self) -> asyncio.Event:
        """Set once a secret is about to be typed here: the replay masks from then, and watchers' live
        views of this machine end (gh_runner/live_views.py)."""
        return self._replay.masked

    def agent_started(self, late_seconds: float | None = None) -> None:
        """The server acknowledged the start of the task: its agent runs (`late_seconds` into the task
        when the link was down as the task began; the agent lost that time, and the result says so)."""
        self._agent_seen = True
        if late_seconds is not None and late_seconds > 0:
            self._metrics.task_seconds_lost = round(late_seconds, 3)
            self._log.warning("the agent started late: the link was down when the task began",
                              seconds_lost=late_seconds)

    def task_end(self, msg: TaskEnd) -> None:
        """The agent is done: the task phase ends and the check after runs with its answer."""
        self._agent_seen = True
        if self._task_over or self._task_end is not None:
            self._log.info("task_end ignored", reason="task already over" if self._task_over else "duplicate")
            return
        self._task_end = msg
        self._task_end_seen.set()

    def task_hold(self, held: bool) -> bool:
        """A person holds the machine (`held`) or handed it back: the task's clock stops or goes on, the
        agent's execs freeze or thaw, and the replay marks each end (gh_common/task_hold.py). False
        (nothing done) when the attempt is not in its task."""
        hold = self._hold
        if hold is None or self._task_over:
            return False
        if hold.change(held):
            self._log.info("task held by a person" if held else "task handed back",
                           held_seconds=round(hold.clock.held_seconds(), 3))
        return True

    async def _freeze_agent(self, frozen: bool) -> bool:
        """A hold's freeze or thaw of the agent's execs; a failure is logged, never raised (the hold
        stands: the clock is stopped either way)."""
        try:
            async with asyncio.timeout(self.timeouts.screen + SCRIPT_SLACK):
                return await self._machine().freeze_agent_execs(frozen, self.timeouts.screen)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._log.warning("the agent's execs were not frozen" if frozen else "the agent's execs were not thawed",
                              error=f"{type(e).__name__}: {str(e)[:200]}")
            return False

    def _restoring(self) -> bool:
        """Its machine is being made again from a save point, and the task is not on yet: the agent, on
        the server, runs on meanwhile (its requests wait there)."""
        return (self.lease.restore is not None and self.phase != TASK and not self._task_over
                and self._cancel_reason is None and self._error is None)

    def _frozen_seconds(self) -> float:
        return self._hold.frozen_seconds() if self._hold is not None else 0.0

    def cancel(self, reason: str) -> None:
        """End the attempt at once: the running phase is cancelled, the machine destroyed, and the
        result is `error` "cancelled: <reason>". No effect once the attempt's work is over (only the
        teardown left, which runs anyway): its real result stands."""
        if self._cancel_reason is not None or self._returned:
            return
        if self._body is not None and self._body.done():
            self._log.info("cancel after the attempt's work was done: its result stands", reason=reason)
            return
        self._cancel_reason = reason or "cancelled"
        self._cancel_phase = self.phase
        self._log.info("attempt cancelled", phase=self.phase, reason=self._cancel_reason)
        self._close_requests(f"the attempt was cancelled: {self._cancel_reason}")
        if self._body is not None and not self._body.done():
            self._body.cancel()

    # -----------------------------------------------------------------------------------------
    # Phases
    # -----------------------------------------------------------------------------------------

    async def _guarded_lifecycle(self) -> None:
        try:
            await self._lifecycle()
        except AttemptError as e:
            self._error = e
        except Exception as e:  # a bug of ours must still end as a result, with the machine destroyed
            self._log.exception("attempt crashed", phase=self.phase)
            self._error = AttemptError(self.phase, f"internal runner error: {type(e).__name__}: {str(e)[:300]}")
        if self._error is not None and self.machine is not None:
            # The screen at the moment of failure is often the fastest way to see what went wrong.
            await self._phase(LAST_SCREEN, None, lambda: self._capture("last"))

    async def _phase(self, name: str, timeout: float | None, work: Callable[[], Awaitable[T]]) -> T:
        """Run one phase, timed into metrics. `timeout` is what the provider is given too; the phase's
        own bound adds SCRIPT_SLACK so the provider's clean timeout wins when it works."""
        self.phase = name
        self._log.info("phase", phase=name)
        started = time.monotonic()
        try:
            async with asyncio.timeout(None if timeout is None else timeout + SCRIPT_SLACK):
                return await work()
        except TimeoutError:
            what = _TIMEOUT_WHAT.get(name, name + " did not finish within {t:g} s")
            raise AttemptError(name, what.format(t=timeout or 0)) from None
        except ProviderError as e:
            raise AttemptError(name, f"{_PROVIDER_WHAT.get(name, name + ' failed')}: {e}") from None
        finally:
            # Summed: the check phases run once per checkpoint.
            spent = self._metrics.phase_seconds.get(name, 0.0) + time.monotonic() - started
            self._metrics.phase_seconds[name] = round(spent, 3)

    def _machine(self) -> Machine:
        if self.machine is None:
            raise AttemptError(self.phase, "internal runner error: no machine")
        return self.machine

    async def _make_machine(self) -> Machine:
        source = source_of(self.lease.start_state)
        # Shielded: if this phase is cancelled or times out, creation runs on so that teardown can
        # wait for the machine and destroy it instead of leaving a half-made one behind.
        self._create = asyncio.ensure_future(
            self.provider.create_machine(self.machine_id, source, timeout=self.timeouts.machine)
        )
        machine = await asyncio.shield(self._create)
        self._metrics.machine_origin = str(machine.origin)
        self._requests = MachineRequests(machine, self.timeouts, replay=self._replay, frozen=self._frozen_seconds)
        restore = self.lease.restore
        self._requests.save_points = SavePoints(machine, self.provider, self.lease.attempt_id,
                                                self.lease.save_points_kept,
                                                kept=restore.kept if restore is not None else None,
                                                task_seconds=self._task_seconds, told=self.link.save_point_made)
        if restore is not None:  # the agent's steps and its next action, from the save point on
            self._requests.restored_at(restore.save_point)
        return machine

    def _task_seconds(self) -> float:
        """The task's own time so far (a hold's not counted)."""
        return self._hold.clock.used() if self._hold is not None else 0.0

    def _check_timeout(self) -> float:
        """The check's bound: the runner's `timeouts.check` and the lease's script timeout, and never
        longer than the case's own `limits.minutes`. A check is a quick look at the machine; one that
        loops must not hold a core for 5 minutes (times 3 tries) on a case given 1 minute."""
        case_bound = self.lease.case.limits.minutes * self._seconds_per_minute
        return min(self.lease.script_timeout, self.timeouts.check, case_bound)

    async def _script(self, script: str, env: dict[str, str], timeout: float) -> ScriptResult:
        return await self._machine().run_script(script, env=env, timeout=timeout, output_cap=CHECK_OUTPUT_CAP)

    def _checks(self) -> list[Checkpoint]:
        """What the check phases run: the lease's checkpoints (the server put a case's check_script among
        them as `check`), else its check_script alone; none for a rubric-only case."""
        case = self.lease.case
        if case.checkpoints:
            return list(case.checkpoints)
        return [Checkpoint(name="check", check_script=case.check_script)] if case.check_script else []

    def _scored_checks(self) -> bool:
        return bool(self.lease.case.checkpoints)

    async def _check_before_run(self, checks: list[Checkpoint], check_t: float) -> None:
        """Each check script before the task; their weighted mean must be below 1 (the setup broke the
        machine). A fractional score is recorded (`before_score`), the case's validation flags it."""
        env = {"GH_CHECK_PHASE": "before", "GH_AGENT_ANSWER": ""}
        runs: list[tuple[Checkpoint, ScriptResult]] = []
        for c in checks:
            script = answer_file.with_answer_file(c.check_script, "", self._machine().shell)
            res = await self._phase(CHECK_BEFORE, check_t, lambda s=script: self._script(s, env, check_t))  # type: ignore[misc]
            runs.append((c, res))
            score = rules.check_score(res, check_t, self._what(c))
            if isinstance(score, rules.Judgement):
                self._check_before = rules.check_output(res)
                raise AttemptError(CHECK_BEFORE, score.reason or "the check printed no score",
                                   score.cause or ErrorCause.INFRASTRUCTURE)
            self._before_scores[c.name] = score
        mean = rules.weighted_mean([(self._before_scores[c.name], c.weight) for c in checks])
        self._check_before = self._check_record(runs, mean)
        before = rules.judge_before_score(mean, "check of every checkpoint" if self._scored_checks() else "check")
        if before.outcome == "error":
            raise AttemptError(CHECK_BEFORE, before.reason or "the check did not print False",
                               before.cause or ErrorCause.INFRASTRUCTURE)

    async def _check_after_scored(self, checks: list[Checkpoint], answer: str, check_t: float) -> bool:
        """Each check script after the task, with the agent's answer; sets the outcome from their weighted
        mean (passed only at 1). False when the agent broke the check's channel for good."""
        env = {"GH_CHECK_PHASE": "after", "GH_AGENT_ANSWER": answer}
        runs: list[tuple[Checkpoint, ScriptResult]] = []
        scores: list[CheckpointScore] = []
        for c in checks:
            script = answer_file.with_answer_file(c.check_script, answer, self._machine().shell)
            res = await self._check_after_run(script, env, check_t)
            if res is None:
                return False
            runs.append((c, res))
            score = rules.check_score(res, check_t, self._what(c))
            if isinstance(score, rules.Judgement):
                self._check_after = rules.check_output(res)
                raise AttemptError(CHECK_AFTER, score.reason or "the check printed no score",
                                   score.cause or ErrorCause.INFRASTRUCTURE)
            scores.append(CheckpointScore(name=c.name, weight=c.weight, score=score,
                                          before_score=self._before_scores.get(c.name)))
        mean = rules.weighted_mean([(s.score, s.weight) for s in scores])
        self._check_after = self._check_record(runs, mean)
        if self._scored_checks():
            self._checkpoints = scores
        self._outcome = rules.judge_after_score(mean).outcome
        return True

    def _what(self, c: Checkpoint) -> str:
        return f"checkpoint {c.name!r}'s check script" if self._scored_checks() else "check script"

    def _check_record(self, runs: list[tuple[Checkpoint, ScriptResult]], mean: float) -> CheckOutput:
        """One check's own record; for checkpoints, one line per checkpoint (its name and last line) and
        their weighted mean as the score."""
        if not self._scored_checks():
            return rules.check_output(runs[0][1])
        lines = [f"{c.name}: {rules.last_line(r.stdout)}" for c, r in runs]
        return CheckOutput(exit_code=0, stdout_tail=rules.tail("\n".join(lines)), score=mean,
                           verdict=rules.verdict_of(mean),
                           truncated=any(r.stdout_truncated or r.stderr_truncated for _, r in runs))

    async def _check_after_run(self, script: str, env: dict[str, str], check_t: float) -> ScriptResult | None:
        """The check after, or None when the agent broke its channel for good.

        An agent with exec or input can stop, kill or remove the guest's agent and executor (it has root).
        The guest's init restarts a killed one, so when the check cannot run (the channel failed, or the
        script never finished) and the agent acted, the channel gets `timeouts.channel_back` to answer again:
        back, the check runs once more (a check only looks, so a second run is safe). Still dead while
        the hypervisor says the guest runs (not stopped, not paused by a full host disk, QEMU alive),
        it is the agent's doing: None, and the attempt is `failed` (check_channel_lost_in_task). A fault
        the runner sees (the hypervisor not answering, the domain not running) stays our error, as does
        everything when the agent never acted (the channel then failed by itself)."""
        try:
            res = await self._phase(CHECK_AFTER, check_t, lambda: self._script(script, env, check_t))
        except AttemptError as e:
            if not self._agent_acted:
                raise
            failed: AttemptError | None = e
        else:
            if self._agent_acted and (res.timed_out or res.exit_code is None):
                failed = None  # it may be the check's own fault: look at the channel before saying whose
            else:
                return res
        back = await self._channel_back()
        if back is None:
            self._log.warning("the check's channel is lost after the agent acted on the machine",
                              grace=self.timeouts.channel_back)
            return None
        if not back:  # ours: what the runner saw
            if failed is not None:
                raise failed
            return res
        if failed is None:
            return res  # the channel answers: the check itself did not finish, judged as before
        self._log.info("the check's channel is back; the check runs again")
        return await self._phase(CHECK_AFTER, check_t, lambda: self._script(script, env, check_t))

    async def _channel_back(self) -> bool | None:
        """True when the guest channel answers within `timeouts.channel_back`; None when it does not while the
        guest runs (the agent's doing); False when the runner sees a fault of ours."""
        m = self._machine()
        try:
            await m.wait_ready(self.timeouts.channel_back)
            return True
        except asyncio.CancelledError:
            raise
        except MachineNotReady:
            pass
        except Exception:
            return False
        try:
            return None if await m.guest_running() else False
        except asyncio.CancelledError:
            raise
        except Exception:
            return False

    async def _capture(self, label: str) -> None:
        """A replay frame of the whole screen, best effort."""
        await self._capture_event(label, None)

    async def _capture_event(self, label: str, event: dict[str, Any] | None) -> None:
        """A replay frame of the whole screen with `event`, best effort."""
        try:
            png = await self._screenshot()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._log.warning("screenshot for replay failed", label=label, error=f"{type(e).__name__}: {str(e)[:200]}")
            return
        await self._replay.send_frame(label, png, event)

    async def _screenshot(self) -> bytes:
        if self._requests is None:
            raise AttemptError(self.phase, "internal runner error: no machine")
        return await self._requests.screenshot()

    async def _task(self) -> TaskEnd | None:
        """The agent's turn: requests are served until task_end, or until limits.minutes of the task's
        own time (a TaskClock: the time a person holds the machine, `task_hold`, is not counted). A task
        that hits its limit still goes on to the check: the machine may be fixed anyway."""
        clock = TaskClock(self.lease.case.limits.minutes * self._seconds_per_minute)
        if self.lease.restore is not None:  # the task's time at its save point is spent
            clock.rewind(self.lease.restore.save_point.task_seconds or 0.0)
        hold = self._hold = TaskHold(clock, freeze=self._freeze_agent,
                                     mark=lambda label: self._capture_event(label, {"human": label}),
                                     step_timeout=self.timeouts.screen + WATCH_INTERVAL)
        self._accepting = True
        watcher = asyncio.create_task(self._replay.watch(self._screenshot, WATCH_INTERVAL))
        ended = asyncio.create_task(self._task_end_seen.wait())
        expired = asyncio.create_task(clock.expired())
        saving = self._periodic_save_points()
        try:
            try:
                await asyncio.wait({ended, expired}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ended.cancel()
                expired.cancel()
                if saving is not None:
                    saving.cancel()
                if self._requests is not None and self._requests.save_points is not None:
                    await self._requests.save_points.settle()  # the check runs on a machine that runs
            if not self._task_end_seen.is_set():
                self._limit_reached = True
                self._metrics.active_seconds = round(clock.used(), 3)
                minutes = self.lease.case.limits.minutes
                self._close_requests(f"the task reached its limit of {minutes} minute{'s' if minutes != 1 else ''}")
                self._log.info("task limit reached", minutes=minutes)
                try:  # the agent's answer and counts are still worth waiting a little for
                    async with asyncio.timeout(self.timeouts.task_grace):
                        await self._task_end_seen.wait()
                except TimeoutError:
                    self._log.info("no task_end after the limit", grace=self.timeouts.task_grace)
        finally:
            await hold.end()  # ended while held: thawed, and the hand-back frame marks the span's end
            if not self._limit_reached:
                self._metrics.active_seconds = round(clock.used(), 3)
            held = clock.held_seconds()
            self._metrics.held_seconds = round(held, 3) if held > 0 else None
            self._task_over = True
            self._close_requests("the task is over")
            self._replay.stop_watching()
            watcher.cancel()
            # Bounded: the watcher also stops on the flag at its next look, so never wait on it for ever.
            done, _ = await asyncio.wait({watcher, *hold.pending()}, timeout=self.timeouts.screen + WATCH_INTERVAL)
            if watcher not in done:
                self._log.warning("replay watcher did not stop in time; it ends at its next look")
            for t in done:
                if not t.cancelled() and t.exception() is not None:
                    self._log.info("replay watcher failed", error=str(t.exception())[:200])
        end = self._task_end
        if end is not None:
            self._metrics.steps, self._metrics.questions, self._metrics.approvals = (
                end.steps, end.questions, end.approvals)
            self._metrics.agent_usage = end.usage
        return end

    def _periodic_save_points(self) -> asyncio.Task[None] | None:
        """Every `limits.save_point_minutes` of the task, a save point (none without the limit)."""
        minutes = self.lease.case.limits.save_point_minutes
        requests = self._requests
        if minutes is None or requests is None or requests.save_points is None:
            return None
        return asyncio.create_task(requests.save_points.every(minutes * self._seconds_per_minute,
                                                              lambda: requests.steps),
                                   name=f"save-points-{self.machine_id}")

    async def wait_torn_down(self) -> None:
        """Return once the machine's destroy (started by `run`) is over, failed or timed out.
        Never raises but CancelledError; cancelling it leaves the destroy running."""
        if self._torn_down is not None:
            await asyncio.shield(self._torn_down)

    async def _teardown(self) -> None:
        """Destroy the machine, bounded by the teardown timeout. Never raises but CancelledError.
        With background teardown it only starts the destroy; `wait_torn_down` waits for it."""
        self.phase = TEARDOWN
        self._close_requests("the attempt is ending")
        if not self._background_teardown:
            await self._destroy_machine()
            return
        started = time.monotonic()
        self._torn_down = asyncio.create_task(self._destroy_machine(), name=f"teardown-{self.machine_id}")
        _background.add(self._torn_down)
        self._torn_down.add_done_callback(_background.discard)
        # What the slot waited for: the hand-off, not the destroy (logged when it ends).
        self._metrics.phase_seconds[TEARDOWN] = round(time.monotonic() - started, 3)

    async def _destroy_machine(self) -> None:
        started = time.monotonic()
        try:
            machine = self.machine or await self._machine_being_made()
            if machine is None:
                return
            destroy = asyncio.ensure_future(machine.destroy())
            _background.add(destroy)
            destroy.add_done_callback(_background.discard)
            try:
                async with asyncio.timeout(self.timeouts.teardown):
                    await asyncio.shield(destroy)
            except TimeoutError:
                self._log.error("machine not destroyed in time; the provider's reaper will remove it",
                                machine_id=self.machine_id, timeout=self.timeouts.teardown)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._log.error("machine destroy failed; the provider retries it (files kept until the domain is gone)",
                                machine_id=self.machine_id, error=f"{type(e).__name__}: {str(e)[:300]}")
            else:
                self.machine = None
        finally:
            seconds = round(time.monotonic() - started, 3)
            if self._background_teardown:
                self._log.info("machine torn down in the background", seconds=seconds)
            else:
                self._metrics.phase_seconds[TEARDOWN] = seconds

    async def _machine_being_made(self) -> Machine | None:
        """A machine whose creation was interrupted: wait for it (bounded) so it can be destroyed."""
        create = self._create
        if create is None:
            return None
        if not create.done():
            try:
                await asyncio.wait({create}, timeout=self.timeouts.teardown)
            finally:
                if not create.done():  # timed out, or we are cancelled ourselves: finish the job later
                    create.add_done_callback(_destroy_when_made)
                    self._log.error("machine creation is still running; it will be destroyed when it ends",
                                    machine_id=self.machine_id)
        if not create.done():
            return None
        if create.cancelled() or create.exception() is not None:
            return None
        return create.result()

    # -----------------------------------------------------------------------------------------
    # Machine requests
    # -----------------------------------------------------------------------------------------

    def _stopped(self, refusal: MachineResponse) -> MachineResponse:
        """A refusal because the time limit stopped the task says so, so the agent's side ends the task
        (scored by the check after) instead of reporting a machine failure."""
        if self._limit_reached and self._cancel_reason is None:
            refusal.stopped = TaskEndReason.TIME_LIMIT
        return refusal

    def _why_not_now(self) -> str:
        if self._cancel_reason is not None:
            return f"the attempt was cancelled: {self._cancel_reason}"
        if self.phase == TASK and self._closed_reason:
            return self._closed_reason
        if self._task_over:
            return f"the task is over (attempt is in phase {self.phase})"
        return f"attempt is in phase {self.phase}, not task"

    def _close_requests(self, reason: str) -> None:
        """Stop serving requests and stop those still running, so no agent action overlaps the check."""
        self._accepting = False
        if self._closed_reason is None:
            self._closed_reason = reason
        for op in list(self._inflight):
            op.cancel()

    # -----------------------------------------------------------------------------------------
    # Helpers
    # -----------------------------------------------------------------------------------------

    @staticmethod
    def _outer_cancelled() -> bool:
        """Whether the task running us was cancelled (as opposed to our own `cancel`)."""
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0

    async def _status(self, status: str, phase: str) -> None:
        try:
            async with asyncio.timeout(LINK_TIMEOUT):
                await self.link.status(status, phase)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._log.warning("status not sent", status=status, phase=phase, error=f"{type(e).__name__}: {e}"[:300])

    def _saved_points(self) -> list[SavePoint] | None:
        points = self._requests.save_points if self._requests is not None else None
        return list(points.kept) if points is not None and points.kept else None

    def _result(self, started: datetime) -> AttemptResult:
        outcome: Outcome
        error: str | None = None
        error_phase: str | None = None
        cause: ErrorCause | None = None
        if self._cancel_reason is not None:
            outcome, error, error_phase = "error", f"cancelled: {self._cancel_reason}", self._cancel_phase
            cause = ErrorCause.INFRASTRUCTURE
        elif self._error is not None:
            outcome, error, error_phase = "error", str(self._error), self._error.phase
            cause = self._error.cause
        elif self._outcome is not None:
            outcome = self._outcome
        else:  # unreachable unless the lifecycle returned without a verdict
            outcome, error, error_phase = "error", "internal runner error: no verdict", self.phase
            cause = ErrorCause.INFRASTRUCTURE
        end = self._task_end
        return AttemptResult(
            attempt_id=self.lease.attempt_id,
            outcome=outcome,
            error=error,
            error_phase=error_phase,
            error_cause=cause,
            check_before=self._check_before,
            check_after=self._check_after,
            check_absent=self._check_absent and outcome != "error",
            task_limit_reached=self._limit_reached,
            task_end=self._ending.reason if self._ending is not None else None,
            task_note=self._ending.note if self._ending is not None else None,
            task_fault=self._ending.fault if self._ending is not None else None,
            failed_reason=self._failed_reason if outcome == "failed" else None,
            checkpoints=self._checkpoints if outcome != "error" else None,
            # The answer the check got (never one that broke its contract: that is withheld, and the
            # fault says why).
            answer=(self._ending.answer if self._ending is not None else "") if end is not None else None,
            metrics=self._metrics,
            save_points=self._saved_points(),
            started_at=started,
            finished_at=_now(),
        )


def _destroy_when_made(create: asyncio.Future[Machine]) -> None:
    """A creation that outlived its attempt: destroy what it made, in the background."""
    if create.cancelled() or create.exception() is not None:
        return
    destroy = asyncio.ensure_future(create.result().destroy())
    _background.add(destroy)
    destroy.add_done_callback(_background.discard)

