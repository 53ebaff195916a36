"""What an agent is given (the attempt's prompt and its machine) and what it gives back."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gh_server.ports import TaskGate
from gh_wire import protocol
from gh_wire.input import InputEvent
from gh_wire.vocab import AgentFault


class AgentError(Exception):
    """The agent could not do its job for a reason on our side (becomes the attempt's `error`)."""


class MachineError(AgentError):
    """A screen, input or exec request on the attempt's machine was refused or failed."""

    def __init__(self, message: str, refusal: protocol.MachineRefusal | None = None,
                 save_point: protocol.SavePoint | None = None) -> None:
        super().__init__(message)
        self.refusal = refusal  # set when it was refused for a typed reason (e.g. too large to relay)
        self.save_point = save_point  # for `machine_restored`: the save point the machine went back to


class TaskStopped(MachineError):
    """A request was refused because the task was stopped (its time limit): the agent's end, scored by
    the check after, never an error."""

    def __init__(self, message: str, reason: protocol.TaskEndReason) -> None:
        super().__init__(message)
        self.reason = reason


class AgentFailed(Exception):
    """The agent under test failed on its own (its process exited non-zero, its endpoint answered an
    error or garbage): the task ends and the check after scores it. Not an AgentError on purpose.
    `fault` types it when what the agent sent broke its contract (gh_wire.answer)."""

    def __init__(self, message: str, fault: AgentFault | None = None) -> None:
        super().__init__(message)
        self.fault = fault


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    # It stood still while it ran: a takeover's hold froze it (docs/agents.md, "Takeover").
    frozen: protocol.ExecFrozen | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code, "stdout": self.stdout, "stderr": self.stderr,
            "stdout_truncated": self.stdout_truncated, "stderr_truncated": self.stderr_truncated,
            "timed_out": self.timed_out,
            "frozen": self.frozen.model_dump(mode="json") if self.frozen is not None else None,
        }


Relay = Callable[[str, protocol.MachineRequest, float], Awaitable[protocol.MachineResponse]]
SLACK_S = 15.0  # on top of a request's own timeout: the runner's round trip
# A save point's memory image and disk copy (the runner bounds its own save at 900 s:
# gh_runner/save_points.py); past this the agent is told it failed.
SAVE_POINT_TIMEOUT_S = 960.0
# What a request that waited out a takeover is told when it was an action (planned on a screen now gone).
TAKEN_OVER = "not done: a person took over the machine; look again"
# A request turned back this many times by the process holding the runner (a hold there that this process's
# gate did not see yet) is answered `taken_over`: that process turns requests back only once the hold is on
# the attempt's row, where the gate sees it, so this bounds a race, never a normal wait.
TURNED_BACK_MAX = 5
# While the machine is away (its runner not connected, or the machine being made again from a save point),
# a request is asked again this often, until the machine answers or `away_wait` has passed.
AWAY_POLL_S = 1.0
# What an action that met the machine's return from a save point is told (docs/agents.md, "Save points").
RESTORED = "not done: the machine went back to a save point (its runner was lost); look again"
MAX_MOVES = 3  # a request follows its attempt to another runner at most this often
LOOKS = ("screen", "accessibility")  # requests that change nothing: asked again whatever became of the first


class Machine:
    """The attempt's machine, through the runner that holds it (screen, input, exec).

    With a `gate`, every request first waits while a person holds the machine (docs/agents.md,
    "Takeover"), in this process or, with several, in the one holding the runner: then a screen is taken
    as it is now, and an input or exec is refused with `taken_over` (MachineError), not done. The wait
    comes before the request is relayed, so its own timeout never counts the time held.

    While the machine is away (`machine_away`: its runner is not connected, or the machine is being made
    again from a save point after the runner was lost), a request waits up to `away_wait` seconds and is
    asked again (of the runner the attempt is on by then: `runner_of`): nothing was done, so asking again
    is safe. A look whose answer was lost with the link is asked again too; an input or exec is not
    (whether it was done is not known), and the agent is told `link_lost`."""

    def __init__(self, relay: Relay, runner_id: str, attempt_id: str, redact: Sequence[str] = (),
                 start_state_id: str | None = None, gate: TaskGate | None = None, away_wait: float = 0.0,
                 runner_of: Callable[[str], Awaitable[str | None]] | None = None) -> None:
        self._relay = relay
        self.runner_id = runner_id
        self.attempt_id = attempt_id
        self.start_state_id = start_state_id  # an open start state's machine is addressed by start state
        self._redact = list(redact)
        self._gate = gate if start_state_id is None else None
        self._away_wait = away_wait
        self._runner_of = runner_of  # where the attempt is now: asked again while away (it may move)
        self.requests = 0

    async def _ask(self, req: protocol.MachineRequest, timeout: float) -> protocol.MachineResponse:
        self.requests += 1
        held = False
        turned_back = 0
        away_until: float | None = None
        moves = 0
        while True:
            if self._gate is not None and await self._gate.passage(self.attempt_id, self.runner_id):
                held = True
            if held and req.op not in LOOKS:  # looks, taken as the machine is now
                raise MachineError(TAKEN_OVER, protocol.MachineRefusal.TAKEN_OVER)
            resp = await self._relay(self.runner_id, req, timeout + SLACK_S)
            if await self._moved(resp) and moves < MAX_MOVES:
                moves += 1  # the attempt went on on another runner under the request: ask that one
                continue
            if await self._away(resp, req.op):
                away_until = away_until if away_until is not None else time.monotonic() + self._away_wait
                if time.monotonic() < away_until:
                    await asyncio.sleep(AWAY_POLL_S)  # a poll with a deadline: the runner may be in another process
                    if self._runner_of is not None:  # it may go on on another runner, from a save point
                        self.runner_id = await self._runner_of(self.attempt_id) or self.runner_id
                    continue
                break
            if (self._gate is None or resp.refusal != protocol.MachineRefusal.TAKEN_OVER
                    or turned_back >= TURNED_BACK_MAX):
                break
            # Turned back by the process holding the runner: a hold began there as it crossed. Wait for
            # it here (the next passage sees it on the row), then as any request that met a hold.
            held = True
            turned_back += 1
        if not resp.ok:
            why = f"{req.op} on the machine failed: {resp.error or 'no reason given'}"
            if resp.stopped is not None:
                raise TaskStopped(why, resp.stopped)
            raise MachineError(why, resp.refusal, resp.save_point)
        return resp

    async def _moved(self, resp: protocol.MachineResponse) -> bool:
        """Whether a request that was not answered (refused without a reason of the machine's, away, or its
        link lost) met the attempt gone on on another runner (`drain --migrate`, a lost runner): then the
        request is for that runner, where the first action after the move is refused `machine_restored`."""
        if resp.ok or self._runner_of is None or resp.refusal not in (None, protocol.MachineRefusal.AWAY,
                                                                       protocol.MachineRefusal.LINK_LOST,
                                                                       protocol.MachineRefusal.NOT_HERE):
            return False
        now = await self._runner_of(self.attempt_id)
        if now is None or now == self.runner_id:
            return False
        self.runner_id = now
        return True

    async def _away(self, resp: protocol.MachineResponse, op: str) -> bool:
        """Whether to ask again: nothing was done, or it was a look. A runner that holds no such attempt
        (`attempt_not_here`) is asked again while the attempt is still running on it: the server moved the
        attempt there (a lost runner's, from a save point) as it sent the lease, and a request can reach
        the runner before its lease does."""
        if resp.refusal == protocol.MachineRefusal.NOT_HERE:
            return self._runner_of is not None and await self._runner_of(self.attempt_id) == self.runner_id
        return resp.refusal == protocol.MachineRefusal.AWAY or (
            resp.refusal == protocol.MachineRefusal.LINK_LOST and op in LOOKS)

    def _req(self, op: str, note: dict[str, Any] | None = None, **kw: Any) -> protocol.MachineRequest:
        if self.start_state_id is not None:
            return protocol.MachineRequest(request_id=uuid.uuid4().hex, start_state_id=self.start_state_id,
                                           op=op, **kw)  # type: ignore[arg-type]
        return protocol.MachineRequest(request_id=uuid.uuid4().hex, attempt_id=self.attempt_id, op=op,  # type: ignore[arg-type]
                                       redact=self._redact, note=note, **kw)

    async def screen(self, timeout: float = 30.0, note: dict[str, Any] | None = None) -> bytes:
        """The screen as PNG. `note` (what the agent means by looking) goes on the replay frame."""
        import base64

        resp = await self._ask(self._req("screen", note, timeout=timeout), timeout)
        if not resp.png_b64:
            raise MachineError("screen: the runner sent no image")
        return base64.b64decode(resp.png_b64)

    async def accessibility(self, timeout: float = 120.0) -> str:
        """The signed-in session's accessibility tree as XML in OSWorld's form (docs/desktop-guests.md).
        MachineError with refusal NO_ACCESSIBILITY, ACCESSIBILITY_TOO_LARGE or ACCESSIBILITY_TIMEOUT
        when the machine has none, or it is over the runner's size or time bound."""
        resp = await self._ask(self._req("accessibility", None, timeout=timeout), timeout)
        if resp.xml is None:
            raise MachineError("accessibility: the runner sent no tree")
        return resp.xml

    async def input(self, events: Sequence[InputEvent], timeout: float = 60.0,
                    note: dict[str, Any] | None = None) -> None:
        await self._ask(self._req("input", note, events=list(events), timeout=timeout), timeout)

    async def exec(self, script: str, env: dict[str, str] | None = None, timeout: float = 120.0,
                   note: dict[str, Any] | None = None) -> ExecResult:
        resp = await self._ask(self._req("exec", note, script=script, env=dict(env or {}), timeout=timeout),
                               timeout)
        return ExecResult(resp.exit_code, resp.stdout or "", resp.stderr or "", resp.stdout_truncated,
                          resp.stderr_truncated, resp.timed_out, resp.frozen)

    async def save_point(self, timeout: float = SAVE_POINT_TIMEOUT_S) -> protocol.SavePoint:
        """Save the machine (disk and memory) now; it runs on (docs/agents.md, "Save points")."""
        resp = await self._ask(self._req("save_point", None, timeout=timeout), timeout)
        if resp.save_point is None:
            raise MachineError("save_point: the runner sent no save point")
        return resp.save_point


@dataclass
class AgentContext:
    attempt_id: str
    runner_id: str
    agent_id: str
    test_run_id: str
    case: dict[str, Any]  # the frozen test case (built-ins only: it holds the expected fix)
    machine: Machine
    machine_api_url: str  # for external agents: the HTTP machine API and its per-attempt token
    machine_api_token: str
    ask_customer: Callable[[str], Awaitable[str]] | None = None
    ask_approval: Callable[[str], Awaitable[str]] | None = None  # "approve" or "deny" (operator.approvals)
    # A model agent's running account (steps, tokens, cost), kept up to date as it goes so that a task
    # stopped mid-call (its time or step limit, an error) still reports what was spent (TaskEnd.usage).
    usage: dict[str, Any] | None = None

    @property
    def prompt(self) -> str:
        return str(self.case.get("prompt", ""))

    @property
    def minutes(self) -> int:
        return int((self.case.get("limits") or {}).get("minutes") or 10)

    @property
    def max_steps(self) -> int | None:
        steps = (self.case.get("limits") or {}).get("steps")
        return int(steps) if steps else None

    def public_case(self) -> dict[str, Any]:
        """What an external agent may know of the case: never the fix, the check or the customer's facts."""
        return {k: self.case.get(k) for k in ("test_case_id", "key", "name", "category", "tags")}


@dataclass
class AgentOutcome:
    answer: str = ""
    steps: int = 0
    questions: int = 0
    approvals: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    reason: protocol.TaskEndReason = protocol.TaskEndReason.FINISHED
    note: str | None = None


class Agent(Protocol):
    async def run(self, ctx: AgentContext) -> AgentOutcome: ...
