"""Runs one agent per attempt during its task phase and ends the phase with a `task_end`.

The runner says when the task phase starts (`attempt_status` running); the agent runs as an
asyncio task in the process that holds the runner's socket, and its `task_end` goes back on that
socket. A `checking`/`done` status, a result or a cancel stops it. An agent that crashes ends the
task with `error` (the attempt becomes an error and is retried); one that runs out of time just
ends (the check after decides). External agents reach the machine through `machine_api` with a
token that is valid only while their attempt's task runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gh_runner import protocol
from gh_runner.replay import mask_png
from gh_server.agents.base import AgentContext, AgentError, AgentOutcome, Machine, MachineError
from gh_server.agents.models import CustomerReply
from gh_server.agents.registry import AgentRegistry
from gh_server.models import Attempt, RunCase
from gh_server.workpool import PoolTimeout, WorkPool
from providers.base import InputEvent, KeyEvent, TypeEvent

if TYPE_CHECKING:
    from gh_server.gateway import Gateway

log = logging.getLogger(__name__)

MACHINE_API_PATH = "/v1/agent/machine"
# At limits.minutes the agent is stopped here too and the task ended (no error: running out of time is the
# agent's failure, and the check after decides), so the runner need not wait out its own grace period.
TIME_SLACK_S = 0.0
CUSTOMER_SLACK_S = 5.0  # on top of the customer endpoint's timeout: waiting for a free worker


@dataclass
class Grant:
    """What a machine-API token allows: this attempt's machine, while its task runs."""

    attempt_id: str
    runner_id: str
    machine: Machine
    ctx: AgentContext
    max_steps: int | None
    steps: int = 0
    questions: int = 0
    approvals: int = 0
    secret_typed: bool = False  # from then on the models get the screen masked (a guest may echo it)
    customer_error: str | None = None


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


def _add_turn(session: Session, attempt_id: str, turn: dict[str, Any]) -> None:
    """The simulated customer's turns, shown as the attempt's `customer` (one writer thread: no lost update)."""
    a = session.get(Attempt, attempt_id)
    if a is not None:
        a.customer_turns = [*(a.customer_turns or []), turn]


def _secret_values(case: dict[str, Any]) -> list[str]:
    facts = (case.get("customer") or {}).get("facts") or {}
    return [str(v["secret"]) for v in facts.values() if isinstance(v, dict) and v.get("secret")]


class AgentSupervisor:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.registry = AgentRegistry(gateway.settings.agents)
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.grants: dict[str, Grant] = {}  # token hash -> grant
        self._started: OrderedDict[str, None] = OrderedDict()  # attempts that had an agent (bounded)
        self._ended: dict[str, tuple[str, protocol.TaskEnd]] = {}  # task_ends to resend after a reconnect
        st = gateway.settings
        # Agents get their case's time limit each (passed per run); the customer its endpoint's timeout.
        self.agent_pool = WorkPool("agent", st.agent_workers, 3600.0)
        customer_timeout = (st.customer_model.timeout if st.customer_model else 120.0) + CUSTOMER_SLACK_S
        self.customer_pool = WorkPool("customer", st.customer_workers, customer_timeout)

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

    def stop(self, attempt_id: str) -> None:
        """The task phase is over for this attempt (checking, result, cancel): stop its agent."""
        self._ended.pop(attempt_id, None)
        task = self.tasks.pop(attempt_id, None)
        if task is not None and not task.done():
            task.cancel()

    async def resend_task_ends(self, runner_id: str, attempt_ids: list[str], in_task: list[str]) -> None:
        """After a reconnect: repeat task_ends the runner may have missed; end with an error the tasks
        whose agent is not here (this process started after it, e.g. a gh-server restart): an agent
        cannot pick up half a task, and without one the runner would wait out the whole time limit."""
        for aid in attempt_ids:
            ended = self._ended.get(aid)
            if ended is not None and ended[0] == runner_id:
                await self.gw.send(runner_id, ended[1])
        for aid in in_task:
            if aid in self.tasks or aid in self._ended or aid in self._started:
                continue
            self._started[aid] = None
            end = protocol.TaskEnd(attempt_id=aid, error="the agent was lost: the control plane restarted "
                                   "during the task")
            self._ended[aid] = (runner_id, end)
            await self.gw.send(runner_id, end)

    async def stop_all(self) -> None:
        tasks = list(self.tasks.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self.tasks.clear()
        self.grants.clear()

    async def _drive(self, runner_id: str, attempt_id: str, info: dict[str, Any]) -> None:
        case = info["case"]
        agent_id = info["agent_id"]
        token = secrets.token_urlsafe(32)
        machine = Machine(self.gw.machine_request, runner_id, attempt_id, redact=_secret_values(case))
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
        grant = Grant(attempt_id, runner_id, machine, ctx, ctx.max_steps)
        ctx.ask_customer = lambda q: self.ask(grant, q)
        ctx.ask_approval = lambda what: self.approve(grant, what)
        end: protocol.TaskEnd
        try:
            with self.granted(token, grant):
                agent = self.registry.get(agent_id)
                # Out of time (PoolTimeout, a TimeoutError) is the agent's failure: the check after decides.
                out: AgentOutcome = await self.agent_pool.run(lambda: agent.run(ctx),
                                                              timeout=ctx.minutes * 60.0 + TIME_SLACK_S)
            if grant.customer_error:
                raise AgentError(grant.customer_error)
            end = protocol.TaskEnd(
                attempt_id=attempt_id,
                answer=out.answer,
                steps=max(out.steps, grant.steps),
                questions=max(out.questions, grant.questions),
                approvals=max(out.approvals, grant.approvals),
            )
        except TimeoutError:
            end = protocol.TaskEnd(attempt_id=attempt_id, answer="", steps=grant.steps, questions=grant.questions,
                                   approvals=grant.approvals)
        except AgentError as e:
            end = protocol.TaskEnd(attempt_id=attempt_id, error=str(e)[:2000], steps=grant.steps)
        except Exception as e:
            log.exception("agent %s crashed on %s", agent_id, attempt_id)
            end = protocol.TaskEnd(
                attempt_id=attempt_id,
                steps=grant.steps,
                error=f"agent {agent_id} crashed: {type(e).__name__}: {str(e)[:500]}",
            )
        self.tasks.pop(attempt_id, None)
        self._ended[attempt_id] = (runner_id, end)
        while len(self._ended) > 10_000:  # runners that never came back: forget the oldest
            self._ended.pop(next(iter(self._ended)))
        if not await self.gw.send(runner_id, end):
            log.info("task_end for %s kept until runner %s is back", attempt_id, runner_id)

    @contextlib.contextmanager
    def granted(self, token: str, grant: Grant) -> Iterator[None]:
        """`token` opens the machine API on `grant`'s machine while the block runs: a case's task, or
        the agent of an instruction start state."""
        key = _token_key(token)
        self.grants[key] = grant
        try:
            yield
        finally:
            self.grants.pop(key, None)

    def grant_for(self, token: str) -> Grant | None:
        return self.grants.get(_token_key(token))

    async def ask(self, grant: Grant, question: str) -> str:
        """The simulated customer answers (an OpenAI-compatible model). Without one, the attempt is an error.

        It sees the screen, and may act on the machine the way a person at it would: type a fact's
        value into the focused field (the runner keeps secret values out of the replay) or accept an
        admin prompt when the case lets it. The turn records what it did by fact name, never by value.
        """
        from gh_server.agents.models import ask_customer

        grant.questions += 1
        endpoint = self.gw.settings.customer_model
        if endpoint is None:
            grant.customer_error = (
                "the agent asked the simulated customer a question and no customer model is "
                "configured on this server (set customer_model in the server settings)"
            )
            raise AgentError(grant.customer_error)
        screen: bytes | None
        try:
            screen = await grant.machine.screen(timeout=10)
        except MachineError as e:
            log.info("customer answers %s without the screen: %s", grant.attempt_id, e)
            screen = None
        if screen is not None and grant.secret_typed:
            try:
                screen = await asyncio.to_thread(mask_png, screen)
            except Exception:  # never the unmasked screen
                screen = None
        try:
            try:
                reply = await self.customer_pool.run(lambda: ask_customer(endpoint, grant.ctx.case, question, screen))
            except PoolTimeout as e:
                raise AgentError(f"the simulated customer did not answer within {e.timeout:g} s") from None
            actions = await self._customer_acts(grant, reply)
        except AgentError as e:
            grant.customer_error = str(e)
            raise
        turn = {"question": question[:8000], "answer": reply.answer[:8000], "actions": actions}
        await self.gw.dbq.run(lambda s: _add_turn(s, grant.attempt_id, turn))
        return reply.answer

    async def _customer_acts(self, grant: Grant, reply: CustomerReply) -> list[dict[str, Any]]:
        customer = grant.ctx.case.get("customer") or {}
        facts = customer.get("facts") or {}
        actions: list[dict[str, Any]] = []
        events: list[InputEvent] = []
        if reply.type_fact is not None:
            if reply.type_fact in facts:
                v = facts[reply.type_fact]
                events.append(TypeEvent(text=str(v.get("secret", "")) if isinstance(v, dict) else str(v)))
                grant.secret_typed = grant.secret_typed or isinstance(v, dict)
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
                raise AgentError(f"the simulated customer could not act on the machine: {e}") from None
        return actions

    async def approve(self, grant: Grant, request: str) -> str:
        """An approval request the agent raises during the task, decided by the case's operator.approvals."""
        grant.approvals += 1
        decision = str((grant.ctx.case.get("operator") or {}).get("approvals") or "approve")
        log.info("approval %d on %s: %s", grant.approvals, grant.attempt_id, decision)
        return decision
