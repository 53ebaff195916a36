"""The task clock stops while a person holds the machine, and only then (gh_common/task_clock.py)."""

from __future__ import annotations

import asyncio

import pytest

from gh_common.task_clock import TaskClock


class FakeTime:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_held_time_is_not_the_tasks() -> None:
    now = FakeTime()
    clock = TaskClock(60.0, clock=now)
    now.t += 10
    assert clock.hold() and not clock.hold()
    now.t += 25
    assert clock.remaining() == 50.0 and clock.held_seconds() == 25.0
    assert clock.release() and not clock.release()
    now.t += 5
    assert clock.used() == 15.0 and clock.remaining() == 45.0 and clock.held_seconds() == 25.0


async def test_expired_waits_out_a_hold_that_began_before_the_limit() -> None:
    clock = TaskClock(0.2)
    clock.hold()
    waiter = asyncio.ensure_future(clock.expired())
    done, _ = await asyncio.wait({waiter}, timeout=0.6)
    assert not done, "the clock ran out while held"
    clock.release()
    await asyncio.wait_for(waiter, 2.0)
    assert clock.held_seconds() >= 0.6


async def test_expired_without_a_hold() -> None:
    clock = TaskClock(0.05)
    await asyncio.wait_for(clock.expired(), 2.0)
    assert clock.remaining() == pytest.approx(0.0)


def test_a_rewind_sets_the_tasks_own_time_and_keeps_its_holds() -> None:
    """An attempt that goes on from a save point (gh_server/attempts/resume.py) has the time it had then."""
    now = FakeTime()
    clock = TaskClock(60.0, clock=now)
    now.t += 40
    clock.hold()
    now.t += 7
    clock.rewind(12.5)  # the save point's task_seconds
    assert clock.used() == 12.5 and clock.remaining() == 47.5 and clock.held
    now.t += 3  # still held: not counted
    assert clock.used() == 12.5
    clock.release()
    now.t += 2
    assert clock.used() == 14.5 and clock.held_seconds() == 10.0
