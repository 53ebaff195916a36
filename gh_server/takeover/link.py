"""The takeover desk's link over this process's runner gateway (gh_server/gateway.py): the gateway's part
of a takeover, kept here so that the gateway only says what it knows of its sockets (`runner_here`,
`shares_runners`) and the desk decides what that means for a hold.

- A hold is taken on the runner's connection to this process, and only one whose hello said
  `task_holds`; the hold belongs to that connection's session (its close ends the hold).
- A runner not connected here, with a shared database, may be held by another process: an agent's
  request waits on the attempt's row there (TakeoverDesk.passage).
- A hold stops the clock of the attempt's agent when it runs here (gh_server/agents/supervisor.py).
"""

from __future__ import annotations

import pydantic

from gh_server.ports import HoldHost
from gh_server.settings import Settings
from gh_server.takeover.desk import TakeoverDesk


class GatewayLink:
    """`DeskLink` (gh_server/ports.py) over the runner gateway."""

    def __init__(self, gateway: HoldHost) -> None:
        self.gateway = gateway
        self.dbq = gateway.dbq

    async def send(self, runner_id: str, msg: pydantic.BaseModel) -> bool:
        return await self.gateway.send(runner_id, msg)

    def hold_session(self, runner_id: str) -> str | None:
        """The session id of the runner's connection to this process when its hello said `task_holds`."""
        here = self.gateway.runner_here(runner_id)
        return here.session_id if here is not None and here.task_holds else None

    def holds_elsewhere(self, runner_id: str) -> bool:
        """Another process may hold the runner's socket, and a hold on its attempts (PostgreSQL)."""
        return self.gateway.shares_runners and self.gateway.runner_here(runner_id) is None

    def task_held(self, attempt_id: str, held: bool) -> None:
        self.gateway.clocks.task_held(attempt_id, held)


def desk_for(gateway: HoldHost, settings: Settings) -> TakeoverDesk:
    """This process's takeover desk, beside the runners' sockets and the agents it gates."""
    return TakeoverDesk(GatewayLink(gateway), settings.takeover_cap_minutes * 60.0, settings.takeover_idle_seconds)


__all__ = ["GatewayLink", "desk_for"]
