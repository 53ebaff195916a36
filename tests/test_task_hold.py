"""The runner's side of a hold (gh_common/task_hold.py): the clock stops, the agent's processes freeze
and the replay marks each end, in order; only time truly frozen is counted as frozen."""

from __future__ import annotations

import asyncio

from gh_common.task_clock import TaskClock
from gh_common.task_hold import TaskHold


class FakeTime:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Guest:
    """What a hold asks of the machine and the replay, in order."""

    def __init__(self, *, can_freeze: bool = True) -> None:
        self.can_freeze = can_freeze
        self.calls: list[str] = []
        self.slow_freeze: asyncio.Event | None = None

    async def freeze(self, frozen: bool) -> bool:
        if frozen and self.slow_freeze is not None:
            await self.slow_freeze.wait()
        self.calls.append("freeze" if frozen else "thaw")
        return self.can_freeze

    async def mark(self, label: str) -> None:
        self.calls.append(label)


def make(guest: Guest, now: FakeTime) -> TaskHold:
    return TaskHold(TaskClock(60.0, clock=now), freeze=guest.freeze, mark=guest.mark, step_timeout=5.0, now=now)


async def test_the_ends_freeze_thaw_and_mark_in_order_even_when_the_first_is_slow() -> None:
    guest, now = Guest(), FakeTime()
    guest.slow_freeze = asyncio.Event()
    hold = make(guest, now)
    assert hold.change(True) and not hold.change(True)  # held twice: nothing changed the second time
    assert hold.clock.held  # the clock stops at once, before the guest has frozen anything
    assert hold.change(False)  # handed back before the freeze came back
    await asyncio.sleep(0)
    assert guest.calls == []
    guest.slow_freeze.set()
    await hold.end()
    assert guest.calls == ["freeze", "takeover", "thaw", "handback"]
    assert not hold.change(False)


async def test_only_frozen_time_counts_and_a_machine_that_cannot_freeze_adds_none() -> None:
    now = FakeTime()
    hold = make(Guest(), now)
    hold.change(True)
    await asyncio.wait(hold.pending())
    now.t += 7
    assert hold.frozen_seconds() == 7.0  # a freeze in progress counts up to now
    hold.change(False)
    await asyncio.wait(hold.pending())
    now.t += 3
    assert hold.frozen_seconds() == 7.0

    guest = Guest(can_freeze=False)
    cannot = make(guest, now)
    cannot.change(True)
    await asyncio.wait(cannot.pending())
    now.t += 7
    assert cannot.frozen_seconds() == 0.0 and cannot.clock.held_seconds() == 7.0
    cannot.change(False)
    await cannot.end()
    assert guest.calls == ["freeze", "takeover", "handback"]  # nothing frozen: no thaw asked


async def test_a_task_that_ends_while_held_is_thawed() -> None:
    guest, now = Guest(), FakeTime()
    hold = make(guest, now)
    hold.change(True)
    await hold.end()
    assert guest.calls == ["freeze", "takeover", "thaw", "handback"]
    assert not hold.clock.held and hold.pending() == set()
