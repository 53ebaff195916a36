"""Actions reach the machine: one `Action` becomes input events, an exec, a question to the simulated
customer or an approval request, the way the machine API does them for external agents.

Coordinates arrive in the model's screen and leave in the guest's (`Scale`). What happened comes back as
an `ActResult`: the text (and image) the model reads, and whether the action was the model's mistake
(`invalid`: counted towards max_invalid) or an error the model should see but is not to blame for.
An action that waited out a person's takeover is answered `taken_over` (not done, not invalid: the
screen it was planned on is gone). A machine that fails under an action raises (MachineError: ours, the
attempt is an error); a stopped task raises TaskStopped.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from gh_server.agents.base import RESTORED, TAKEN_OVER, AgentContext, AgentError, MachineError
from gh_server.agents.model import actions as A
from gh_server.agents.model.screen import Scale, Shot, zoom
from gh_server.settings import ModelTool
from gh_wire.input import (
    ClickEvent,
    DoubleClickEvent,
    InputEvent,
    KeyEvent,
    MouseDownEvent,
    MouseUpEvent,
    MoveEvent,
    ScrollEvent,
    TypeEvent,
)
from gh_wire.protocol import MachineRefusal

EXEC_SHOWN = 8000  # of an exec's stdout and stderr each, the tail the model reads
SCREEN_TIMEOUT_S = 30.0
INPUT_TIMEOUT_S = 60.0


@dataclass
class ActResult:
    text: str
    error: bool = False  # answered to the model as an error result
    invalid: bool = False  # and the model's own mistake (counted towards max_invalid)
    image: Shot | None = None  # zoom: the image the model asked for
    exec: dict[str, Any] | None = None
    # Not done: a person held the machine while it waited, or the machine went back to a save point (the
    # rest of the turn isn't done either: it was planned on a screen now gone).
    taken_over: bool = False


def taken_over() -> ActResult:
    """An action that waited out a takeover: not done and not the model's mistake; it looks again."""
    return ActResult(TAKEN_OVER, error=True, taken_over=True)


def restored() -> ActResult:
    """An action that met the machine's return to a save point: as a takeover's, it looks again."""
    return ActResult(RESTORED, error=True, taken_over=True)


@dataclass
class Actor:
    ctx: AgentContext
    tools: list[ModelTool]
    scale: Scale
    pointer: tuple[int, int] = (0, 0)  # guest pixels: where the last pointer event left it
    notes: list[dict[str, Any]] = field(default_factory=list)

    def _at(self, x: int | None, y: int | None) -> tuple[int, int]:
        if x is None or y is None:
            return self.pointer
        return self.scale.to_guest(x, y)

    async def _input(self, events: list[InputEvent], note: dict[str, Any]) -> ActResult | None:
        """None when delivered; an invalid result when the machine cannot deliver such an event."""
        try:
            await self.ctx.machine.input(events, timeout=INPUT_TIMEOUT_S, note=note)
        except MachineError as e:
            if e.refusal == MachineRefusal.INPUT_NOT_SUPPORTED:
                return ActResult(str(e), error=True, invalid=True)
            if e.refusal == MachineRefusal.TAKEN_OVER:
                return taken_over()
            if e.refusal == MachineRefusal.RESTORED:
                return restored()
            raise
        return None

    async def act(self, action: A.Action, note: dict[str, Any]) -> ActResult:
        """Do `action` on the machine. Done and Infeasible are the loop's, not the machine's.

        Raises:
            MachineError: the machine failed (ours); TaskStopped when the task was stopped under it.
            AgentError: the simulated customer failed (ours).
        """
        events: list[InputEvent]
        if isinstance(action, A.Click):
            if action.keys:
                return ActResult("holding keys during a click is not supported on this machine; press them "
                                 "with key instead", error=True)
            x, y = self._at(action.x, action.y)
            events = [ClickEvent(x=x, y=y, button=action.button)]
            if action.clicks >= 2:
                events = [DoubleClickEvent(x=x, y=y, button=action.button)]
            if action.clicks == 3:
                events.append(ClickEvent(x=x, y=y, button=action.button))
            self.pointer = (x, y)
            return await self._input(events, note) or ActResult(f"clicked {action.button} x{action.clicks}")
        if isinstance(action, A.MouseDown | A.MouseUp):
            x, y = self._at(action.x, action.y)
            cls = MouseDownEvent if isinstance(action, A.MouseDown) else MouseUpEvent
            self.pointer = (x, y)
            return await self._input([cls(x=x, y=y, button=action.button)], note) or ActResult(action.type)
        if isinstance(action, A.Move):
            self.pointer = self._at(action.x, action.y)
            return await self._input([MoveEvent(x=self.pointer[0], y=self.pointer[1])], note) or ActResult("moved")
        if isinstance(action, A.Drag):
            points = [self.scale.to_guest(x, y) for x, y in action.path]
            events = [MouseDownEvent(x=points[0][0], y=points[0][1], button=action.button)]
            events += [MoveEvent(x=x, y=y) for x, y in points[1:]]
            events.append(MouseUpEvent(x=points[-1][0], y=points[-1][1], button=action.button))
            self.pointer = points[-1]
            return await self._input(events, note) or ActResult("dragged")
        if isinstance(action, A.Scroll):
            x, y = self._at(action.x, action.y)
            self.pointer = (x, y)
            scroll = ScrollEvent(x=x, y=y, dx=action.dx, dy=action.dy)
            return await self._input([scroll], note) or ActResult(f"scrolled dx={action.dx} dy={action.dy}")
        if isinstance(action, A.Key):
            events = [KeyEvent(keys=action.keys) for _ in range(action.repeat)]
            return await self._input(events, note) or ActResult("pressed " + "+".join(action.keys))
        if isinstance(action, A.HoldKey):
            held = KeyEvent(keys=action.keys, hold_ms=max(1, round(action.seconds * 1000)))
            return await self._input([held], note) or ActResult(f"held {'+'.join(action.keys)} {action.seconds:g} s")
        if isinstance(action, A.Type):
            return await self._input([TypeEvent(text=action.text)], note) or ActResult("typed")
        if isinstance(action, A.Wait):
            await asyncio.sleep(action.seconds)  # the model asked to let the machine get on with it
            return ActResult(f"waited {action.seconds:g} s")
        if isinstance(action, A.Screenshot):
            return ActResult("the screen follows")
        if isinstance(action, A.Zoom):
            png = await self.ctx.machine.screen(timeout=SCREEN_TIMEOUT_S, note=note)
            try:
                shot = await asyncio.to_thread(zoom, png, action.region, self.scale)
            except ValueError as e:
                return ActResult(str(e), error=True, invalid=True)
            return ActResult("zoomed", image=shot)
        if isinstance(action, A.AskUser):
            if self.ctx.ask_customer is None:
                raise AgentError("the agent asked the customer and this attempt has no customer")
            answer = await self.ctx.ask_customer(action.question)
            return ActResult(f"The user answered: {answer}")
        if isinstance(action, A.RequestApproval):
            if self.ctx.ask_approval is None:
                raise AgentError("the agent asked for approval and this attempt has no operator policy")
            decision = await self.ctx.ask_approval(action.what)
            return ActResult(f"The operator's decision: {decision}", error=decision != "approve")
        if isinstance(action, A.Shell):
            if ModelTool.SHELL not in self.tools:
                return ActResult("shell is not one of this agent's tools", error=True, invalid=True)
            try:
                res = await self.ctx.machine.exec(action.script, timeout=action.timeout, note=note)
            except MachineError as e:
                if e.refusal == MachineRefusal.CHANNEL_LOST_IN_EXEC:  # its own script's doing: told, not ours
                    return ActResult(str(e), error=True)
                if e.refusal == MachineRefusal.TAKEN_OVER:
                    return taken_over()
                if e.refusal == MachineRefusal.RESTORED:
                    return restored()
                raise
            # A hold froze it: the model is told, since what it started stood still and the screen moved on.
            froze = f" (frozen {res.frozen.seconds:.0f} s while a person held the machine)" if res.frozen else ""
            text = (f"exit code {res.exit_code}{' (timed out)' if res.timed_out else ''}{froze}\n"
                    f"stdout:\n{res.stdout[-EXEC_SHOWN:]}\nstderr:\n{res.stderr[-EXEC_SHOWN:]}")
            return ActResult(text, error=res.exit_code != 0, exec=res.as_dict())
        raise AssertionError(f"not an action for the machine: {action.type}")  # Done, Infeasible: the loop's
