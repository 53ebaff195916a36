"""A person's hold on a running task, on the runner's side (`task_hold`, docs/protocol.md).

One hold per task, made with the task's clock (gh_common/task_clock.py). When a person takes the
machine over:
1. the clock stops at once (the agent's time limit does not run while it is held);
2. every process the agent's execs started is frozen (`freeze(True)`: Machine.freeze_agent_execs,
   providers/qemu/agent_groups.py), so nothing the agent left running watches or acts while a
   person works;
3. the replay gets its "takeover" frame.
At the hand-back the clock goes on, the processes are thawed (`freeze(False)`), and the replay gets
its "handback" frame. The steps of one end run after those of the end before, so a quick
takeover and hand-back still freeze, thaw and mark in that order.

`frozen_seconds` counts only time the agent's processes were truly frozen (a machine that cannot
freeze, or a freeze that failed, adds none): an exec's answer reports its share of it
(gh_runner/machine_requests.py), so the agent is never told it stood still when it did not.

    hold = TaskHold(clock, freeze=..., mark=..., step_timeout=30)
    hold.change(True); hold.change(False)   # False when nothing changed
    await hold.end()                  # the task is over: released if held, steps awaited
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from gh_common.task_clock import TaskClock

# The two ends of a hold, as the replay names them.
TAKEOVER = "takeover"
HANDBACK = "handback"


class TaskHold:
    def __init__(self, clock: TaskClock, *, freeze: Callable[[bool], Awaitable[bool]],
                 mark: Callable[[str], Awaitable[None]], step_timeout: float,
                 now: Callable[[], float] = time.monotonic) -> None:
        """`freeze(frozen)` freezes or thaws the agent's processes and says whether it did (it
        handles and logs its own failures); `mark(label)` puts a replay frame; `step_timeout` bounds
        how long one end waits for the end before it."""
        self.clock = clock
        self._freeze = freeze
        self._mark = mark
        self._step_timeout = step_timeout
        self._now = now
        self._frozen_since: float | None = None
        self._frozen_total = 0.0
        self._last: asyncio.Task[None] | None = None
        self._steps: set[asyncio.Task[None]] = set()

    @property
    def held(self) -> bool:
        return self.clock.held

    def frozen_seconds(self) -> float:
        """Seconds the agent's processes have been frozen so far (a freeze in progress counts to now)."""
        extra = self._now() - self._frozen_since if self._frozen_since is not None else 0.0
        return self._frozen_total + extra

    def change(self, held: bool) -> bool:
        """A person took the machine (`held`) or handed it back. False when nothing changed (held
        twice, or handed back unheld); otherwise the clock has changed and the end's steps are under way."""
        changed = self.clock.hold() if held else self.clock.release()
        if changed:
            self._start_steps(held)
        return changed

    def pending(self) -> set[asyncio.Task[None]]:
        """The ends whose steps are still running."""
        return set(self._steps)

    async def end(self) -> None:
        """The task is over: a hold still on is ended here (thawed, its hand-back frame), and every
        end's steps are awaited, each bounded by `step_timeout`."""
        if self.clock.release():
            self._start_steps(False)
        if self._steps:
            await asyncio.wait(self.pending(), timeout=2 * self._step_timeout)

    def _start_steps(self, held: bool) -> None:
        label = TAKEOVER if held else HANDBACK
        step = asyncio.create_task(self._run_end(held, self._last), name=f"task-{label}")
        self._last = step
        self._steps.add(step)
        step.add_done_callback(self._steps.discard)

    async def _run_end(self, held: bool, after: asyncio.Task[None] | None) -> None:
        if after is not None:
            await asyncio.wait({after}, timeout=self._step_timeout)
        if held:
            if await self._freeze(True):
                self._frozen_since = self._now()
            await self._mark(TAKEOVER)
        else:
            if self._frozen_since is not None:
                await self._freeze(False)
                # Counted to the thaw's end: the processes stood still until then (a thaw that failed
                # is logged by `freeze`; they are counted as frozen until it was given up).
                self._frozen_total += self._now() - self._frozen_since
                self._frozen_since = None
            await self._mark(HANDBACK)


__all__ = ["HANDBACK", "TAKEOVER", "TaskHold"]
