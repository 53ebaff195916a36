"""The takeover's gate in the screen relay (gh_server/live/screen_relay.py): which view of an attempt drives
its machine, what its input becomes, and what a failed view does to the hold (docs/server-api.md,
"Takeovers").

- A writable ticket's view drives an attempt's machine only while that ticket's key holds the attempt
  (`holder`); the relay opens it on the runner as not watch-only, every other view of an attempt as a
  watcher's.
- Each input message of the holder's view moves the hold's idle clock and becomes its human steps
  (`passes`); any other view's input to an attempt's machine stops here.
- A holder's view that ends before it ever piped, with one of OPEN_FAILURES, was never a screen: the
  hold is undone (TakeoverDesk.view_failed), so no attempt is left assisted and paused with no screen.
- A hold's end ends its holder's views (`on_ended`, given the relay's callback).
"""

from __future__ import annotations

from collections.abc import Callable

from gh_server.live.rfb import Message
from gh_server.live.tickets import Ticket
from gh_server.takeover.desk import Hold, TakeoverDesk
from gh_wire.vocab import ViewEndReason

# A holder's view that ends so before it ever piped was never a screen: its hold is undone.
OPEN_FAILURES = frozenset({ViewEndReason.NO_MACHINE, ViewEndReason.NO_SCREEN, ViewEndReason.TOO_MANY_VIEWS,
                           ViewEndReason.SCREEN_FAILED, ViewEndReason.DIAL_FAILED,
                           ViewEndReason.RUNNER_UNAVAILABLE})


class HolderGate:
    """The desk as the screen relay sees it: one per relay, over this process's desk."""

    def __init__(self, desk: TakeoverDesk, hold_ended: Callable[[Hold], object]) -> None:
        self.desk = desk
        desk.on_ended.append(hold_ended)

    def holder(self, t: Ticket) -> Hold | None:
        """The hold when `t` is a writable ticket of an attempt whose machine its key holds now."""
        if t.attempt_id is None or t.read_only:
            return None
        return self.desk.holder(t.attempt_id, t.key_id)

    def passes(self, t: Ticket, msg: Message) -> bool:
        """Whether an input message of the holder's view `t` reaches the machine: only while its key holds
        the attempt; then it moves the hold's idle clock and becomes a human step."""
        hold = self.holder(t)
        if hold is None:
            return False
        self.desk.human_input(hold, msg)
        return True

    async def view_ended(self, t: Ticket, reason: ViewEndReason) -> None:
        """The holder's view `t` ended with `reason`: a view that never opened undoes its hold."""
        if reason not in OPEN_FAILURES:
            return
        hold = self.holder(t)
        if hold is not None:
            await self.desk.view_failed(hold, reason)


__all__ = ["OPEN_FAILURES", "HolderGate"]
