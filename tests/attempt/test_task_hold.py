"""A person's takeover on the runner's side (`task_hold`, docs/protocol.md): the task's time limit stops
while held and runs on after; the held time is `metrics.held_seconds`, and the replay marks the span."""

from __future__ import annotations

import asyncio
import time

from gh_runner.attempt import Attempt
from gh_wire.protocol import MachineRequest, TaskEnd

from .fakes import WAIT, FakeLink, FakeProvider, make_lease
from .test_lifecycle import FAST, finish, start


async def test_a_hold_longer_than_the_limit_is_not_the_tasks_time(provider: FakeProvider, link: FakeLink) -> None:
    a = Attempt(make_lease(minutes=1), provider, link, FAST, seconds_per_minute=0.5)  # a 0.5 s limit
    assert not a.task_hold(True)  # not in its task yet: ignored
    run = await start(a)
    await link.reached("task")
    assert a.task_hold(True)
    await link.reached("frame:takeover")
    assert a._hold is not None
    clock = a._hold.clock
    assert clock is not None
    deadline = time.monotonic() + WAIT
    while clock.held_seconds() < 1.5:  # three times the limit, held
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    fixed = await asyncio.wait_for(a.handle_request(MachineRequest(request_id="r1", attempt_id="at_test1",
                                                                   op="exec", script="fix")), WAIT)
    assert fixed.ok, fixed  # still in its task: the limit did not run
    assert fixed.frozen is None  # a machine that cannot freeze never tells the agent it was frozen
    assert a.task_hold(False)
    await link.reached("frame:handback")
    a.task_end(TaskEnd(attempt_id="at_test1", answer="done"))
    result = await finish(run)
    assert result.outcome == "passed" and not result.task_limit_reached, result
    assert result.metrics.held_seconds is not None and result.metrics.held_seconds >= 1.5
    assert result.metrics.active_seconds < result.metrics.held_seconds
    marks = [(label, event) for label, _, event in link.frames if label in ("takeover", "handback")]
    assert marks == [("takeover", {"human": "takeover"}), ("handback", {"human": "handback"})]
    assert not a.task_hold(True)  # the task is over: ignored


async def test_a_task_that_ends_while_held_closes_the_span(provider: FakeProvider, link: FakeLink) -> None:
    a = Attempt(make_lease(), provider, link, FAST)
    run = await start(a)
    await link.reached("task")
    assert a.task_hold(True)
    a.task_end(TaskEnd(attempt_id="at_test1", answer="done"))
    result = await finish(run)
    assert result.metrics.held_seconds is not None
    assert [label for label in link.labels() if label in ("takeover", "handback")] == ["takeover", "handback"]
