"""Runs one agent per attempt during its task phase and ends the phase with a `task_end`.

The runner says when the task phase starts (`attempt_status` running); the agent runs as an
asyncio task in the process that holds the runner's socket, and its `task_end` goes back on that
socket. A `checking`/`done` status, a result or a cancel stops it. Our side's failures (an agent
that cannot start, the customer model, the machine under an agent that then gives up) end the task
with `error` (retried); the agent's own ends (out of time, a step past limits.steps, exiting non-zero)
end it with a typed reason, and the check after decides. External agents reach the machine through `machine_api` with a
token that is valid only while their attempt's task runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from sqlalchemy import select
from sqlalchemy.orm import Session

from gh_common.task_clock import TaskClock
from gh_server.agents import grants
from gh_server.agents.base import (
    Agent,
    AgentContext,
    AgentError,
    AgentFailed,
    AgentOutcome,
    Machine,
    MachineError,
    TaskStopped,
)
from gh_server.agents.models import CustomerReply
from gh_server.agents.registry import AgentRegistry
from gh_server.models import Attempt, RunCase, utcnow
from gh_server.ports import GrantSpec, RunnerLink
from gh_server.workpool import PoolTimeout, WorkPool
from gh_wire import answer as answer_contract
from gh_wire import protocol
from gh_wire.input import InputEvent, KeyEvent, TypeEvent
from gh_wire.masking import mask_png
from gh_wire.vocab import AgentFault, AttemptStatus

log = logging.getLogger(__name__)

MACHINE_API_PATH = "/v1/agent/machine"
# At limits.minutes the agent is stopped here too and the task ended (no error: running out of time is the
# agent's failure, and the check after decides), so the runner need not wait out its own grace period.
TIME_SLACK_S = 0.0
# A grant outlives its task's time limit by this much at most (a process that died cannot delete it); a
# takeover moves its expiry on by the time held (gh_server/takeover/desk.py).
GRANT_SLACK_S = 120.0
# The agent's own time is its TaskClock's (held time not counted); the pool's bound only catches a clock
# that never ran out (holds are capped one by one, not in total).
HELD_BOUND_S = 24 * 3600.0
RESTORE_S = 600.0  # a desktop's machine made again from a save point (memory read in full) on a loaded host
CUSTOMER_SLACK_S = 5.0  # on top of the customer endpoint's timeout: waiting for a free worker
# How often the grants of this process's running agents are read for a step limit reached through another
# gh-server process (a shared database only; in one process the refusing request signals at once).
STEP_LIMIT_POLL_S = 1.0
# A task the server heard of late gets its agent only while at least this share of limits.minutes is
# left; with less, the try is our error and retried (a fair try needs most of its time).
LATE_START_SHARE = 0.5
CLEANUP_S = 10.0  # an agent stopped at its step limit gets this long for its own clean-up (its process group)


@dataclass
class Grant:
    """A machine-API token's grant as one request sees it: this attempt's machine, while its task runs.

    The row is in `machine_grants` (any process may serve the request); its counters are updated there."""

    token_hash: str
    attempt_id: str
    runner_id: str
    machine: Machine
    case: dict[str, Any]
    max_steps: int | None
    start_state_id: str | None = None


def _token_key(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _load(session: Session, attempt_id: str) -> dict[str, Any] | None:
    row = session.execute(
        select(Attempt.status, Attempt.runner_id, Attempt.agent_id, Attempt.test_run_id, RunCase.case)
        .join(RunCase, RunCase.id == Attempt.run_case_id)
        .where(Attempt.id == attempt_id)
    ).first()
    if row is None:
        return None
    return {
        "status": row.status,
        "runner_id": row.runner_id,
        "agent_id": row.agent_id,
        "test_run_id": row.test_run_id,
        "case": dict(row.case or {}),
    }


def _aware_utc(t: datetime) -> datetime:
    """A runner's timestamp as an aware UTC time (one without a zone is UTC, as the protocol says)."""
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _add_turn(session: Session, attempt_id: str, turn: dict[str, Any]) -> None:
    """The simulated customer's turns, shown as the attempt's `customer` (one writer thread: no lost update)."""
    a = session.get(Attempt, attempt_id)
    if a is not None:
        a.customer_turns = [*(a.customer_turns or []), turn]


def _secret_values(case: dict[str, Any]) -> list[str]:
    facts = (case.get("customer") or {}).get("facts") or {}
    return [str(v["secret"]) for v in facts.values() if isinstance(v, dict) and v.get("secret")]


def _ended(attempt_id: str, tally: grants.Tally, reason: protocol.TaskEndReason,
           note: str | None = None, fault: AgentFault | None = None) -> protocol.TaskEnd:
    """The task ended on the agent's side without an answer: the check after still decides."""
    return protocol.TaskEnd(attempt_id=attempt_id, answer="", steps=tally.steps, questions=tally.questions,
                            approvals=tally.approvals, reason=reason, note=note, fault=fault)


class AgentSupervisor:
    def __init__(self, gateway: RunnerLink) -> None:
        self.gw = gateway
        self.registry = AgentRegistry.from_settings(gateway.settings)
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._started: OrderedDict[str, None] = OrderedDict()  # attempts that had an agent (bounded)
        self._ended: dict[str, tuple[str, protocol.TaskEnd]] = {}  # task_ends to resend after a reconnect
        st = gateway.settings
        # Agents get their case's time limit each (passed per run); the customer its endpoint's timeout.
        observer = gateway.metrics.pool_observer
        self.agent_pool = WorkPool("agent", st.agent_workers, 3600.0, observer=observer)
        customer_timeout = (st.customer_model.timeout if st.customer_model else 120.0) + CUSTOMER_SLACK_S
        self.customer_pool = WorkPool("customer", st.customer_workers, customer_timeout, observer=observer)
        # Token hash -> set when a step past limits.steps was asked (here, or seen on the grant's row).
        self._step_limits: dict[str, asyncio.Event] = {}
        self._limit_watch: asyncio.Task[None] | None = None
        self._shared_db = not st.sqlalchemy_url.startswith("sqlite")  # other processes may serve its agents
        self._clocks: dict[str, TaskClock] = {}  # attempt id -> its agent's time limit, while it runs here

    async def runner_of(self, attempt_id: str) -> str | None:
        """The runner the attempt's row says it runs on now (an attempt can go on on another runner); None once
        it is not running (a request then waits for no runner)."""
        return await self.gw.dbq.run(
            lambda s: s.scalar(select(Attempt.runner_id).where(
                Attempt.id == attempt_id, Attempt.status.in_((AttemptStatus.PREPARING, AttemptStatus.RUNNING)))))

    @property
    def away_wait(self) -> float:
        """How long an agent's request waits for its machine while it is away: the runner's grace and a
        restore from a save point (past the grace the attempt is an error and its agent stopped anyway)."""
        return self.gw.settings.runner_grace_seconds + RESTORE_S

    @property
    def machine_api_url(self) -> str:
        return self.gw.settings.base_url + MACHINE_API_PATH

    async def on_running(self, runner_id: str, attempt_id: str) -> None:
        if attempt_id in self._started:
            return  # a repeated status (e.g. after a reconnect): one agent per attempt
        self._started[attempt_id] = None
        while len(self._started) > 50_000:
            self._started.popitem(last=False)
        info = await self.gw.dbq.run(lambda s: _load(s, attempt_id))
        if info is None or info["runner_id"] != runner_id or info["status"] != "running":
            return
        self.tasks[attempt_id] = asyncio.create_task(
            self._drive(runner_id, attempt_id, info), name=f"gh-agent-{attempt_id}"
        )

    def time_left(self, attempt_id: str) -> float | None:
        """Seconds of limits.minutes left to this attempt's agent (held time not counted); None when it
        does not run here."""
        clock = self._clocks.get(attempt_id)
        return None if clock is None else round(clock.remaining(), 3)

    async def resumed(self, attempt_id: str, point: protocol.SavePoint, runner_id: str | None = None) -> None:
        """The attempt goes on from `point` (its runner was lost: gh_server/attempts/resume.py), on
        `runner_id` when that is another runner. Its agent runs on, with the time the task had left at the
        save point, and its requests follow the attempt's row to its runner (`runner_of`); it is told by
        its next action's refusal (`machine_restored`, from the runner), which also takes its steps back
        to the save point's. A task_end kept for the lost runner goes to the new one."""
        if runner_id is not None and (ended := self._ended.get(attempt_id)) is not None:
            self._ended[attempt_id] = (runner_id, ended[1])
        used = point.task_seconds or 0.0
        clock = self._clocks.get(attempt_id)
        if clock is not None:
            clock.rewind(used)
        info = await self.gw.dbq.run(lambda s: _load(s, attempt_id))
        minutes = float((((info or {}).get("case") or {}).get("limits") or {}).get("minutes", 10))
        expires = utcnow() + timedelta(seconds=max(0.0, minutes * 60.0 - used) + GRANT_SLACK_S)
        await self.gw.dbq.run(lambda s: grants.resumed(s, attempt_id, expires))

    def task_held(self, attempt_id: str, held: bool) -> None:
        """A person holds the attempt's machine (or handed it back): its agent's clock stops (or runs)."""
        clock = self._clocks.get(attempt_id)
        if clock is None:
            return
        if held:
            clock.hold()
        else:
            clock.release()

    def stop(self, attempt_id: str) -> None:
        """The task phase is over for this attempt (checking, result, cancel): stop its agent."""
        self._ended.pop(attempt_id, None)
        task = self.tasks.pop(attempt_id, None)
        if task is not None and not task.done():
            task.cancel()

    async def resend_task_ends(
        self, runner_id: str, attempt_ids: list[str], in_task: list[str],
        unheard: Mapping[str, datetime] | None = None,
    ) -> dict[str, float]:
        """After a reconnect: repeat task_ends the runner may have missed, and give every task in
        progress its agent or a `task_end` with an error, never neither (without one the runner would
        wait out the whole time limit and the check would score an agent that never came).

        - A task that began while this server did not hear it (`unheard`: attempt id -> when it
          began) never had an agent: it gets one now if at least half of `limits.minutes` is left
          (the agent gets what is left), otherwise an error ("could not start"), which is retried.
        - A task whose agent is not here although the server saw it start (this process started
          after it, e.g. a gh-server restart) lost its agent, which cannot pick up half a task: error.

        Returns the tasks whose agent started late, with the seconds the agent lost.
        """
        for aid in attempt_ids:
            ended = self._ended.get(aid)
            if ended is not None and ended[0] == runner_id:
                await self.gw.send(runner_id, ended[1])
        late: dict[str, float] = {}
        for aid, began in (unheard or {}).items():
            if aid in self.tasks or aid in self._ended or aid in self._started:
                continue
            info = await self.gw.dbq.run(lambda s, aid=aid: _load(s, aid))  # type: ignore[misc]
            limit_s = float((((info or {}).get("case") or {}).get("limits") or {}).get("minutes", 10)) * 60.0
            lost = max(0.0, (utcnow() - _aware_utc(began)).total_seconds())
            if info is not None and lost <= limit_s * LATE_START_SHARE:
                log.warning("attempt %s: the task began %.0f s before the server heard of it; its agent starts "
                            "now with %.0f s of %.0f s left", aid, lost, limit_s - lost, limit_s)
                await self.on_running(runner_id, aid)
                late[aid] = lost
                continue
            self._started[aid] = None
            end = protocol.TaskEnd(attempt_id=aid, error=(
                f"the agent could not start: the link to the runner was down for {lost:.0f} s of the task's "
                f"{limit_s:.0f} s limit (less than half of it left)"))
            self._ended[aid] = (runner_id, end)
            await self.gw.send(runner_id, end)
        for aid in in_task:
            if aid in self.tasks or aid in self._ended or aid in self._started:
                continue
            self._started[aid] = None
            end = protocol.TaskEnd(attempt_id=aid, error="the agent was lost: the control plane restarted "
                                   "during the task")
            self._ended[aid] = (runner_id, end)
            await self.gw.send(runner_id, end)
        return late

    async def stop_all(self) -> None:
        tasks = list(self.tasks.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self.tasks.clear()
        if self._limit_watch is not None:
            self._limit_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._limit_watch
            self._limit_watch = None

    async def _drive(self, runner_id: str, attempt_id: str, info: dict[str, Any]) -> None:
        case = info["case"]
        agent_id = info["agent_id"]
        token = secrets.token_urlsafe(32)
        machine = Machine(self.gw.machine_request, runner_id, attempt_id, redact=_secret_values(case),
                          gate=self.gw.takeovers, away_wait=self.away_wait, runner_of=self.runner_of)
        ctx = AgentContext(
            attempt_id=attempt_id,
            runner_id=runner_id,
            agent_id=agent_id,
            test_run_id=info["test_run_id"],
            case=case,
            machine=machine,
            machine_api_url=self.machine_api_url,
            machine_api_token=token,
        )
        grant = Grant(_token_key(token), attempt_id, runner_id, machine, case, ctx.max_steps)
        ctx.ask_customer = lambda q: self.ask(grant, q)
        ctx.ask_approval = lambda what: self.approve(grant, what)
        tally = grants.Tally()
        end: protocol.TaskEnd
        try:
            async with self.granted(token, GrantSpec(attempt_id, runner_id, ctx.max_steps, ctx.minutes)) as tally:
                agent = self.registry.get(agent_id)
                out: AgentOutcome = await self._until_stopped(agent, ctx, grant)
            if tally.customer_error:
                raise AgentError(tally.customer_error)
            if (fault := answer_contract.text_fault(out.answer)) is not None:
                # Decided here, before the runner or any check sees it: no guest can carry it.
                raise AgentFailed(f"agent {agent_id}: {answer_contract.describe(fault, len(out.answer))}", fault)
            end = protocol.TaskEnd(
                attempt_id=attempt_id,
                answer=out.answer,
                steps=max(out.steps, tally.steps),
                questions=max(out.questions, tally.questions),
                approvals=max(out.approvals, tally.approvals),
                reason=out.reason,
                note=out.note,
            )
        except TimeoutError:  # out of time (PoolTimeout): the agent's failure, the check after decides
            end = _ended(attempt_id, tally, protocol.TaskEndReason.TIME_LIMIT)
        except TaskStopped as e:  # the runner stopped the task (its limit) while a request was in flight
            end = _ended(attempt_id, tally, e.reason, str(e))
        except AgentFailed as e:
            if tally.customer_error or tally.machine_failure:
                # It gave up because our side failed under it: that is ours to retry, not its failure.
                ours = tally.customer_error or tally.machine_failure
                end = protocol.TaskEnd(attempt_id=attempt_id, steps=tally.steps,
                                       error=f"{ours} (then {str(e)[:500]})"[:2000])
            else:
                end = _ended(attempt_id, tally, protocol.TaskEndReason.AGENT_FAILED, str(e)[:2000], e.fault)
        except AgentError as e:
            end = protocol.TaskEnd(attempt_id=attempt_id, error=str(e)[:2000], steps=tally.steps)
        except Exception as e:
            log.exception("agent %s crashed on %s", agent_id, attempt_id)
            end = protocol.TaskEnd(
                attempt_id=attempt_id,
                steps=tally.steps,
                error=f"agent {agent_id} crashed: {type(e).__name__}: {str(e)[:500]}",
            )
        if ctx.usage is not None:  # a model agent's account, whatever ended it
            end.usage = dict(ctx.usage)
            end.steps = max(end.steps, int(ctx.usage.get("steps") or 0))
        self.tasks.pop(attempt_id, None)
        try:  # it may have gone on on another runner
            runner_id = await self.runner_of(attempt_id) or runner_id
        except Exception:
            log.warning("could not read where attempt %s runs; its task_end goes to %s", attempt_id, runner_id)
        self._ended[attempt_id] = (runner_id, end)
        while len(self._ended) > 10_000:  # runners that never came back: forget the oldest
            self._ended.pop(next(iter(self._ended)))
        if not await self.gw.send(runner_id, end):
            log.info("task_end for %s kept until runner %s is back", attempt_id, runner_id)

    @contextlib.asynccontextmanager
    async def granted(self, token: str, spec: GrantSpec) -> AsyncIterator[grants.Tally]:
        """`token` opens the machine API on `spec`'s machine, in every process, while the block runs (a
        case's task, or the agent of an instruction start state). The tally is filled when it ends."""
        key = _token_key(token)
        expires = utcnow() + timedelta(seconds=spec.minutes * 60.0 + GRANT_SLACK_S)
        await self.gw.dbq.run(lambda s: grants.add(s, key, spec.attempt_id, spec.runner_id, spec.max_steps, expires,
                                                   spec.start_state_id))
        tally = grants.Tally()
        try:
            yield tally
        finally:
            # Shielded: a cancelled task (stopped at `checking`) must still close its grant.
            got = await asyncio.shield(self.gw.dbq.run(lambda s: grants.end(s, key)))
            tally.steps, tally.questions, tally.approvals = got.steps, got.questions, got.approvals
            tally.customer_error = got.customer_error
            tally.machine_failure = got.machine_failure

    async def grant_for(self, token: str) -> Grant | None:
        """The live grant of a machine-API token, from the database (whichever process made it)."""
        key = _token_key(token)
        row = await self.gw.dbq.run(lambda s: grants.load(s, key))
        if row is None:
            return None
        machine = Machine(self.gw.machine_request, row.runner_id, row.attempt_id,
                          redact=_secret_values(row.case), start_state_id=row.start_state_id, gate=self.gw.takeovers,
                          away_wait=self.away_wait if row.start_state_id is None else 0.0,
                          runner_of=self.runner_of if row.start_state_id is None else None)
        return Grant(key, row.attempt_id, row.runner_id, machine, row.case, row.max_steps, row.start_state_id)

    async def take_step(self, grant: Grant) -> bool | None:
        """Count one step against the case's limit: True, False (limit reached: the task ends there, and
        the row says so for the process running the agent) or None (grant gone)."""
        counted = await self.gw.dbq.run(lambda s: grants.take_step(s, grant.token_hash))
        if counted is False and (hit := self._step_limits.get(grant.token_hash)) is not None:
            hit.set()  # the agent runs here: stop it now, not at the next poll
        return counted

    async def give_back_step(self, grant: Grant) -> None:
        """A counted step was not done (a person took the machine over while it waited): not the agent's."""
        await self.gw.dbq.run(lambda s: grants.give_back_step(s, grant.token_hash))

    async def steps_back_to(self, grant: Grant, steps: int) -> None:
        """The machine went back to a save point made at `steps` (its runner was lost): the steps the agent
        took after it were undone by our fault, and are not counted against limits.steps."""
        await self.gw.dbq.run(lambda s: grants.set_steps(s, grant.token_hash, steps))

    async def machine_failed(self, grant: Grant, why: str) -> None:
        """The machine failed a request under the agent (ours): an agent that then gives up is our error."""
        await self.gw.dbq.run(lambda s: grants.mark(s, grant.token_hash, machine_failure=why))

    async def _until_stopped(self, agent: Agent, ctx: AgentContext, grant: Grant) -> AgentOutcome:
        """The agent's run (in the agent pool), until it ends, its TaskClock runs out (limits.minutes, the
        time a person held the machine not counted: PoolTimeout), or it asks for a step past limits.steps,
        in whichever process that request landed (the task ends there, as a person would be stopped)."""
        hit = self._step_limits[grant.token_hash] = asyncio.Event()  # before the agent can ask for a step
        if self._shared_db and (self._limit_watch is None or self._limit_watch.done()):
            self._limit_watch = asyncio.create_task(self._watch_step_limits(), name="gh-agent-step-limits")
        limit_s = ctx.minutes * 60.0 + TIME_SLACK_S
        clock = self._clocks[ctx.attempt_id] = TaskClock(limit_s)
        if self.gw.takeovers.held(ctx.attempt_id):  # taken over before its agent came
            clock.hold()
        run = asyncio.ensure_future(self.agent_pool.run(lambda: agent.run(ctx), timeout=limit_s + HELD_BOUND_S))
        stop = asyncio.ensure_future(hit.wait())
        expired = asyncio.ensure_future(clock.expired())
        try:
            done, _ = await asyncio.wait({run, stop, expired}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._step_limits.pop(grant.token_hash, None)
            if self._clocks.get(ctx.attempt_id) is clock:
                del self._clocks[ctx.attempt_id]
            stop.cancel()
            expired.cancel()
            if not run.done():
                run.cancel()
                # Bounded: an agent's own clean-up (killing its process group) gets a moment, never for ever.
                await asyncio.wait({run}, timeout=CLEANUP_S)
        if run in done:
            return run.result()
        if stop not in done:
            raise PoolTimeout("agent", limit_s)  # out of its own time: the agent's end, the check decides
        return AgentOutcome(answer="", reason=protocol.TaskEndReason.STEP_LIMIT,
                            note=f"stopped at the case's step limit ({grant.max_steps})")

    async def _watch_step_limits(self) -> None:
        """One read per interval for all of this process's running agents, while there are any."""
        while self._step_limits:
            await asyncio.sleep(STEP_LIMIT_POLL_S)
            keys = list(self._step_limits)
            if not keys:
                continue  # the last one ended while we slept: the loop's test ends the watcher
            try:
                reached = await self.gw.dbq.run(functools.partial(grants.step_limits_reached, token_hashes=keys))
            except Exception:
                log.warning("could not read the grants' step limits; retrying", exc_info=True)
                continue
            for key in reached:
                if (hit := self._step_limits.get(key)) is not None:
                    hit.set()
        self._limit_watch = None  # no await since the loop's test: a new agent starts a new watcher

    async def ask(self, grant: Grant, question: str) -> str:
        """The simulated customer answers (an OpenAI-compatible model). Without one, the attempt is an error.

        It sees the screen, and may act on the machine the way a person at it would: type a fact's
        value into the focused field (the runner keeps secret values out of the replay) or accept an
        admin prompt when the case lets it. The turn records what it did by fact name, never by value.
        """
        from gh_server.agents.models import ask_customer

        secret_typed = await self.gw.dbq.run(lambda s: grants.count(s, grant.token_hash, "questions"))
        endpoint = self.gw.settings.customer_model
        if endpoint is None:
            await self._customer_failed(grant, "the agent asked the simulated customer a question and no customer "
                                        "model is configured on this server (set customer_model in the server "
                                        "settings)")
        screen: bytes | None
        try:
            screen = await grant.machine.screen(timeout=10)
        except MachineError as e:
            log.info("customer answers %s without the screen: %s", grant.attempt_id, e)
            screen = None
        if screen is not None and secret_typed:
            try:
                screen = await asyncio.to_thread(mask_png, screen)
            except Exception:  # never the unmasked screen
                screen = None
        usage: dict[str, float] = {}  # the customer model's seconds and tokens: the evaluator's overhead
        try:
            try:
                reply = await self.customer_pool.run(lambda: ask_customer(endpoint, grant.case, question, screen,
                                                                          usage))
            except PoolTimeout as e:
                raise AgentError(f"the simulated customer did not answer within {e.timeout:g} s") from None
            actions = await self._customer_acts(grant, reply)
        except AgentError as e:
            await self._customer_failed(grant, str(e))
        turn = {"question": question[:8000], "answer": reply.answer[:8000], "actions": actions, "usage": usage}
        await self.gw.dbq.run(lambda s: _add_turn(s, grant.attempt_id, turn))
        return reply.answer

    async def _customer_failed(self, grant: Grant, why: str) -> NoReturn:
        """The customer's failure is the attempt's (an error, retried), even if the agent carries on."""
        await self.gw.dbq.run(lambda s: grants.mark(s, grant.token_hash, customer_error=why))
        raise AgentError(why)

    async def _customer_acts(self, grant: Grant, reply: CustomerReply) -> list[dict[str, Any]]:
        customer = grant.case.get("customer") or {}
        facts = customer.get("facts") or {}
        actions: list[dict[str, Any]] = []
        events: list[InputEvent] = []
        if reply.type_fact is not None:
            if reply.type_fact in facts:
                v = facts[reply.type_fact]
                events.append(TypeEvent(text=str(v.get("secret", "")) if isinstance(v, dict) else str(v)))
                if isinstance(v, dict):
                    await self.gw.dbq.run(lambda s: grants.mark(s, grant.token_hash, secret_typed=True))
                actions.append({"type": "type_fact", "fact": reply.type_fact})
            else:
                log.info("customer of %s asked to type an unknown fact; ignored", grant.attempt_id)
        if reply.click_yes and customer.get("clicks_admin_prompts"):
            events.append(KeyEvent(keys=["ALT", "Y"]))  # the Yes button of an admin (UAC) prompt
            actions.append({"type": "click_yes"})
        if events:
            try:
                await grant.machine.input(events)
            except MachineError as e:
                if e.refusal == protocol.MachineRefusal.TAKEN_OVER:  # a person held the machine: not done
                    log.info("the customer's actions on %s were not done: the machine was taken over",
                             grant.attempt_id)
                    return [{**a, "done": False} for a in actions]
                raise AgentError(f"the simulated customer could not act on the machine: {e}") from None
        return actions

    async def approve(self, grant: Grant, request: str) -> str:
        """An approval request the agent raises during the task, decided by the case's operator.approvals."""
        await self.gw.dbq.run(lambda s: grants.count(s, grant.token_hash, "approvals"))
        decision = str((grant.case.get("operator") or {}).get("approvals") or "approve")
        log.info("approval on %s: %s", grant.attempt_id, decision)
        return decision
