"""The model agent's step loop: one attempt's task, a model turn at a time.

Lifecycle (each phase bounded; limits.minutes bounds the whole, and cancels a model call in flight):

    look     screenshot through the runner (SCREEN_S), scaled and encoded for the model (ENCODE_S)
    call     one model call through the API's SDK: its timeout per request, its retries of 429/5xx and
             connection errors with backoff honouring Retry-After; our bound over all of them (call_bound)
    parse    the reply into our actions (the API module); a reply that cannot be read is an invalid turn
    act      each action on the machine (gh_server.agents.model.actor), each machine request with its
             own timeout; the screen after the turn is the next look
    record   tokens, cost and seconds on the context's usage (kept current for any end); each request
             carries a note (step, the model's words, the action) that the runner puts on its replay frame

Ends (docs/agents.md, "What ends a task"): no action and no answer -> finished, the reply's text the
answer; done / infeasible -> finished; limits.steps (else max_steps) model turns -> step_limit;
max_invalid invalid turns in a row -> agent_failed; the endpoint unreachable, refusing the key, or
answering 429/5xx after the retries -> AgentError (ours: the attempt is an error, retried).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import time
from contextlib import AsyncExitStack
from typing import Any

import anthropic
import httpx
import openai

from gh_common.timeouts import within
from gh_server.agents.base import AgentContext, AgentError, AgentFailed, AgentOutcome, MachineError
from gh_server.agents.model import a11y
from gh_server.agents.model import actions as A
from gh_server.agents.model.actor import Actor, ActResult, taken_over
from gh_server.agents.model.conversation import Conversation, Turn
from gh_server.agents.model.screen import Shot, prepare
from gh_server.agents.model.usage import Account
from gh_server.settings import ModelAgentConfig, ModelApi, ModelObservation
from gh_wire.protocol import MachineRefusal, TaskEndReason
from gh_wire.vocab import AgentFault

SCREEN_S = 30.0
A11Y_S = 120.0  # the runner's own bound on a read (gh_runner/machine_requests.py)
# The tree's refusals the model is told of in its place (the machine has no desktop, or its tree is too
# large or too slow to read now): the agent goes on with the screen, or without; any other failure is ours.
A11Y_SAID = (MachineRefusal.NO_ACCESSIBILITY, MachineRefusal.ACCESSIBILITY_TOO_LARGE,
             MachineRefusal.ACCESSIBILITY_TIMEOUT)
ENCODE_S = 20.0
RETRY_AFTER_CAP_S = 60.0  # the SDKs wait at most this long on a Retry-After
TEXT_SHOWN = 4000  # of the model's words per step, on the replay frame
# Actions carried out in one turn. A computer-use model acts a handful per turn (the SDKs' batches are
# a few clicks and keys); a reply with a thousand would hold the machine for minutes on one step. Past
# this, each further action is answered to the model as an error, not done (every call gets its result,
# as the APIs require), and the turn is invalid: a step the agent spent.
MAX_ACTIONS_PER_TURN = 50
DEFAULT_BASE = {ModelApi.ANTHROPIC: "https://api.anthropic.com", ModelApi.OPENAI_RESPONSES: "https://api.openai.com/v1",
                ModelApi.OPENAI_CHAT: "https://api.openai.com/v1"}
# Sent as the key to a server that needs none (a local vLLM): an explicit value, so that the SDK never
# picks up OPENAI_API_KEY from gh-server's environment and sends it to a server it was not meant for.
NO_KEY = "none"


class ModelAgent:
    """`kind: model`: a built-in computer-use agent driving a model through its API's SDK."""

    def __init__(self, agent_id: str, cfg: ModelAgentConfig) -> None:
        self.agent_id = agent_id
        self.cfg = cfg

    def _key(self) -> str:
        """The API key, read from gh-server's environment now (never stored, logged or passed on)."""
        if self.cfg.api_key_env is None:
            return NO_KEY
        key = os.environ.get(self.cfg.api_key_env)
        if not key:
            raise AgentError(f"agent {self.agent_id}: the environment variable {self.cfg.api_key_env} (its API key) "
                             "is not set in gh-server's environment")
        return key

    def call_bound(self) -> float:
        """All of one call's tries and the SDK's waits between them."""
        return (self.cfg.retries + 1) * self.cfg.timeout + self.cfg.retries * RETRY_AFTER_CAP_S

    def _conversation(self, stack: AsyncExitStack, key: str, shot: Shot, ctx: AgentContext) -> Conversation:
        base = self.cfg.base_url or DEFAULT_BASE[self.cfg.api]
        common: dict[str, Any] = {"api_key": key, "base_url": base, "max_retries": self.cfg.retries,
                                  "timeout": self.cfg.timeout}
        if self.cfg.api == ModelApi.ANTHROPIC:
            from gh_server.agents.model.anthropic_api import AnthropicConversation

            return AnthropicConversation(self.cfg, anthropic.AsyncAnthropic(**common), shot.scale.model)
        client = openai.AsyncOpenAI(**common)
        stack.push_async_callback(client.close)
        if self.cfg.api == ModelApi.OPENAI_RESPONSES:
            from gh_server.agents.model.responses_api import ResponsesConversation

            start = str(ctx.case.get("start_state") or "")
            environment = "windows" if "win" in start.lower() else "linux"
            return ResponsesConversation(self.cfg, client, shot.scale.model, environment)
        from gh_server.agents.model.chat_api import ChatConversation

        return ChatConversation(self.cfg, client, shot.scale)

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        key = self._key()
        limit = ctx.max_steps or self.cfg.max_steps
        first = await self._look(ctx, step=0)
        account = Account(self.cfg.price, "", str(self.cfg.api), self.cfg.model)
        actor = Actor(ctx, list(self.cfg.tools), first.scale)
        try:
            return await self._steps(ctx, key, limit, first, account, actor)
        finally:
            ctx.usage = account.as_dict()  # whatever ended the task: what was spent goes on the attempt

    async def _steps(self, ctx: AgentContext, key: str, limit: int, first: Shot, account: Account,
                     actor: Actor) -> AgentOutcome:
        async with AsyncExitStack() as stack:
            conv = self._conversation(stack, key, first, ctx)
            if self.cfg.api == ModelApi.ANTHROPIC:
                stack.push_async_callback(conv.client.close)  # type: ignore[attr-defined]
            account.coordinates = conv.coordinates
            ctx.usage = account.as_dict()
            conv.begin(ctx.prompt, first)
            invalid_in_a_row = 0
            while True:
                if account.steps >= limit:
                    return AgentOutcome(answer="", steps=account.steps, reason=TaskEndReason.STEP_LIMIT,
                                        note=f"stopped at {limit} model turns")
                turn = await self._call(conv, account, key)
                ctx.usage = account.as_dict()
                step = account.steps
                if not turn.acts:  # neither an action nor an answer: its words are the answer
                    return self._finished(turn.text, account)
                # The model's words go on the turn's first frame: its first request, or the look after.
                said = [turn.text[:TEXT_SHOWN]] if turn.text else []
                acted = await conv.act(turn, self._doer(ctx, actor, step, said),
                                       functools.partial(self._look, ctx, step, actor, said))
                account.invalid += len(acted.invalid)
                ctx.usage = account.as_dict()
                if acted.end is not None:
                    return self._finished(A.answer_of(acted.end), account)
                invalid_in_a_row = invalid_in_a_row + 1 if acted.invalid else 0
                if invalid_in_a_row >= self.cfg.max_invalid:
                    why = "; ".join(acted.invalid)[:500]
                    return AgentOutcome(answer="", steps=account.steps, reason=TaskEndReason.AGENT_FAILED,
                                        note=f"agent {self.agent_id}: {invalid_in_a_row} invalid turns in a row "
                                             f"(last: {why})")
        raise AssertionError("unreachable")  # mypy: an exit stack may swallow exceptions

    @staticmethod
    def _finished(answer: str, account: Account) -> AgentOutcome:
        # Never cut: an answer over its contract (gh_wire.answer) is the agent's failure, decided by the supervisor.
        return AgentOutcome(answer=answer, steps=account.steps)

    async def _look(self, ctx: AgentContext, step: int, actor: Actor | None = None,
                    said: list[str] | None = None) -> Shot:
        """The look phase: the screen the model will see (its replay frame noted with the step, and with
        the turn's words when none of its actions took them: `said`, emptied here)."""
        note: dict[str, Any] = {"agent": "model", "step": step, "seen_by_model": True}
        if said:
            note["text"] = said.pop()
        png = await ctx.machine.screen(timeout=SCREEN_S, note=note)
        try:
            shot = await within(ENCODE_S, asyncio.to_thread(prepare, png, self.cfg.screen))
        except TimeoutError:
            raise AgentError(f"scaling the screenshot took over {ENCODE_S:g} s") from None
        except OSError as e:
            raise AgentError(f"the machine's screenshot could not be read: {e}") from None
        if actor is not None:
            actor.scale = shot.scale  # the guest may have changed its resolution
        if self.cfg.observation != ModelObservation.SCREENSHOT:
            shot = dataclasses.replace(shot, tree=await self._tree(ctx))
        return shot

    async def _tree(self, ctx: AgentContext) -> str:
        """The accessibility tree as OSWorld's agents give it to their model (gh_server/agents/model/a11y.py)."""
        try:
            xml = await ctx.machine.accessibility(timeout=A11Y_S)
        except MachineError as e:
            if e.refusal in A11Y_SAID:
                return f"(no accessibility tree: {e})"
            raise
        try:
            return a11y.linearize(xml, self.cfg.a11y_max_chars)
        except a11y.NotATree as e:
            raise AgentError(f"the runner's accessibility tree could not be read: {e}") from None

    async def _call(self, conv: Conversation, account: Account, key: str) -> Turn:
        """The call phase: one model turn, counted as a step whatever it says."""
        started = time.monotonic()
        try:
            turn = await within(self.call_bound(), conv.call())
        except TimeoutError:
            # The endpoint answered and kept its reply coming past every bound the agent set itself (a
            # reply that never ends): the agent under test stalled, not our side.
            raise AgentFailed(f"agent {self.agent_id}: the model's reply did not end within {self.call_bound():g} s "
                              f"({self.cfg.retries} retries)", AgentFault.MODEL_STALLED) from None
        except (anthropic.APITimeoutError, openai.APITimeoutError) as e:
            if not isinstance(e.__cause__, httpx.ConnectTimeout):
                # Connected and asked, and no reply within the agent's own `timeout` after its retries.
                raise AgentFailed(f"agent {self.agent_id}: the model did not answer within its timeout of "
                                  f"{self.cfg.timeout:g} s ({self.cfg.retries} retries)",
                                  AgentFault.MODEL_STALLED) from None
            raise AgentError(self._why(e, key)) from None
        except (anthropic.APIError, openai.APIError) as e:
            raise AgentError(self._why(e, key)) from None
        account.add(turn.usage, time.monotonic() - started)
        return turn

    def _why(self, e: Exception, key: str) -> str:
        """An API failure as the attempt's error (the key, should a server echo it, never in it)."""
        who = f"agent {self.agent_id}: the model endpoint {self.cfg.base_url or DEFAULT_BASE[self.cfg.api]}"
        status = getattr(e, "status_code", None)
        detail = str(getattr(e, "message", "") or e)
        if key and key != NO_KEY:
            detail = detail.replace(key, "•••")
        detail = detail[:300]
        if isinstance(e, anthropic.APIConnectionError | openai.APIConnectionError):
            return f"{who} could not be reached after {self.cfg.retries} retries ({type(e).__name__})"
        if status in (401, 403):
            return f"{who} refused the API key from {self.cfg.api_key_env} (HTTP {status}): {detail}"
        if status == 429 or (status is not None and status >= 500):
            return f"{who} answered HTTP {status} after {self.cfg.retries} retries: {detail}"
        if status is not None:
            return f"{who} refused the request (HTTP {status}): {detail}"
        return f"{who} sent a reply that is not the API's: {type(e).__name__}: {detail}"

    def _doer(self, ctx: AgentContext, actor: Actor, step: int, said: list[str]) -> Any:
        """The act phase's `do`: each action on the machine, its request noted for the replay (the first
        request takes the turn's words, `said`)."""

        acted = 0
        taken = False  # a person took the machine over during this turn: its later actions are not done either

        async def do(action: A.Action) -> ActResult:
            nonlocal acted, taken
            acted += 1
            if acted > MAX_ACTIONS_PER_TURN:
                return ActResult(f"not done: at most {MAX_ACTIONS_PER_TURN} actions in one turn", error=True,
                                 invalid=True)
            if taken and action.type in A.REQUESTS:
                return taken_over()
            note: dict[str, Any] = {"agent": "model", "step": step, "action": A.describe(action)}
            if said and action.type in A.REQUESTS:
                note["text"] = said.pop()
            result = await actor.act(action, note)
            taken = taken or result.taken_over
            return result

        return do
