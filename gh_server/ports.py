"""Ports: the small surfaces one part of gh-server needs from another, as Protocols, so that no service
imports the loop or router that provides them (app.py wires the real ones together).

The runner gateway (gh_server/gateway.py) as each of its users sees it; every interface to a Gateway is here:
- `GatewayPort`: what the API needs (kick a revoked runner, send it a message, relay a machine request,
  whether it takes views, an agent's time left, the agents); on ServerState.gateway.
- `RunnerLink`: what the agent supervisor and the result intake need (the sockets, the DB writer, the
  takeover desk's gate).
- `LeaseSink`: what the scheduler loop needs (the runners it may lease to here, and a send).
- `DeskLink`: what the takeover desk needs (gh_server/takeover/desk.py); `HoldHost`: what the desk's link
  over the gateway reads of it (gh_server/takeover/link.py).

The others:
- `TaskGate`: where an agent's machine requests wait while a person holds its machine.
- `AgentHost`: what the API and the start-state jobs need of the agents (the machine API's grants).
- `AttemptEvents`: what result intake needs of the scheduler loop (a run to check, a pass to run soon).
- `JobResultApplier`: what a finished start-state job means (the start-state service's, called by the
  gateway in its DB batch).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pydantic
from sqlalchemy.orm import Session

from gh_server.dbqueue import DbQueue
from gh_server.settings import Settings
from gh_wire import protocol

if TYPE_CHECKING:
    from gh_server.metrics import ServerMetrics

JobResultApplier = Callable[[Session, str, protocol.JobResult], bool]


@dataclass(frozen=True)
class GrantSpec:
    """What the process that runs an agent grants its machine-API token (see `AgentHost.granted`)."""

    attempt_id: str
    runner_id: str
    max_steps: int | None
    minutes: float
    start_state_id: str | None = None


class TaskGate(Protocol):
    """Where an attempt's machine requests wait while a person holds the machine (gh_server/takeover/desk.py)."""

    def held(self, attempt_id: str) -> bool:
        """A person holds the attempt's machine now."""

    async def passage(self, attempt_id: str, runner_id: str) -> bool:
        """Return once nobody holds the attempt's machine (`runner_id`'s), in this process or another;
        True when a hold was in progress on arrival (what the request was planned on is gone)."""


class GatewayPort(Protocol):
    """The runner gateway as the API sees it (ServerState.gateway)."""

    async def kick(self, runner_id: str, code: int, reason: str) -> None:
        """Close that runner's socket now (revoked)."""

    async def machine_request(
        self, runner_id: str, req: protocol.MachineRequest, timeout: float
    ) -> protocol.MachineResponse: ...

    async def send(self, runner_id: str, msg: pydantic.BaseModel) -> bool:
        """False if the runner is not connected to this process."""

    def connected(self, runner_id: str) -> bool: ...

    def takes_views(self, runner_id: str) -> bool:
        """Connected to this process and takes `view_open` (gh_server/live/screen_relay.py)."""

    def task_time_left(self, attempt_id: str) -> float | None:
        """Seconds of limits.minutes the attempt's agent has left, held time not counted; None when its
        agent does not run in this process."""

    @property
    def agents(self) -> AgentHost:
        """The agents of this process and their machine API (instruction start states use it too)."""


class LeaseSink(Protocol):
    """What the scheduler needs of the gateway (kept tiny so the loop can be tested alone)."""

    def local_runner_ids(self) -> list[str]: ...

    async def send(self, runner_id: str, msg: Any) -> bool: ...

    def restoring_runner_ids(self) -> list[str]: ...

    async def resumed_elsewhere(self, runner_id: str, lease: Any) -> None: ...


class DeskLink(Protocol):
    """What the takeover desk needs of the runner gateway (gh_server/takeover/link.py is the real one)."""

    dbq: DbQueue

    async def send(self, runner_id: str, msg: pydantic.BaseModel) -> bool:
        """False if the runner is not connected to this process."""

    def hold_session(self, runner_id: str) -> str | None:
        """The session id of the runner's connection to this process when its hello said `task_holds`."""

    def holds_elsewhere(self, runner_id: str) -> bool:
        """Another gh-server process may hold the runner's socket (a shared database, and not here)."""

    def task_held(self, attempt_id: str, held: bool) -> None:
        """Stop (held) or start again the clock of the attempt's agent, when it runs here."""


@dataclass(frozen=True)
class RunnerHere:
    """A runner's connection to this process, as its hello described it."""

    session_id: str
    live_views: bool  # takes `view_open`
    task_holds: bool  # takes `task_hold`: its attempts can be taken over


class HeldClocks(Protocol):
    def task_held(self, attempt_id: str, held: bool) -> None:
        """Stop (held) or start again the clock of the attempt's agent, when it runs here."""


class HoldHost(Protocol):
    """What the takeover desk's link reads of the runner gateway (gh_server/takeover/link.py)."""

    dbq: DbQueue

    async def send(self, runner_id: str, msg: pydantic.BaseModel) -> bool:
        """False if the runner is not connected to this process."""

    def runner_here(self, runner_id: str) -> RunnerHere | None:
        """The runner's open connection to this process; None when it has none here."""

    @property
    def shares_runners(self) -> bool:
        """Other gh-server processes may hold runners' sockets (PostgreSQL: machine requests relayed)."""

    @property
    def clocks(self) -> HeldClocks:
        """The clocks of the agents of this process."""


class RunnerLink(Protocol):
    settings: Settings
    dbq: DbQueue
    metrics: ServerMetrics

    @property
    def takeovers(self) -> TaskGate:
        """Where the agents' machine requests wait while a person holds the machine."""

    async def send(self, runner_id: str, msg: pydantic.BaseModel) -> bool:
        """False if the runner is not connected to this process."""

    async def machine_request(
        self, runner_id: str, req: protocol.MachineRequest, timeout: float
    ) -> protocol.MachineResponse:
        """Relay a request to the runner holding the machine (wherever it is connected); never raises."""


class AttemptEvents(Protocol):
    def run_changed(self, run_id: str | None) -> None:
        """An attempt of this run finished: check (soon) whether the run is complete."""

    def poke(self) -> None:
        """Something changed that may let an attempt be leased: run a pass soon."""

    def retry_queued(self, retry_id: str, after_runner_id: str, attempts_so_far: int) -> None:
        """An error (ours) queued `retry_id`: space it out, and prefer another runner than the one it failed on."""


class AgentHost(Protocol):
    @property
    def machine_api_url(self) -> str: ...

    def granted(self, token: str, spec: GrantSpec) -> AbstractAsyncContextManager[Any]:
        """`token` opens the machine API on `spec`'s machine while the block runs."""
