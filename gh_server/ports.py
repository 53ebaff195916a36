"""Ports: the small surfaces one part of gh-server needs from another, as Protocols, so that no service
imports the loop or router that provides them (app.py wires the real ones together).

- `RunnerLink`: what the agent supervisor needs of the runner gateway (the sockets, the DB writer, the
  takeover desk's gate).
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
    """Where an attempt's machine requests wait while a person holds the machine (gh_server/takeovers.py)."""

    def held(self, attempt_id: str) -> bool:
        """A person holds the attempt's machine now."""

    async def passage(self, attempt_id: str, runner_id: str) -> bool:
        """Return once nobody holds the attempt's machine (`runner_id`'s), in this process or another;
        True when a hold was in progress on arrival (what the request was planned on is gone)."""


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
