"""The hot pool by demand, at the `PoolHost` boundary (the real provider's side is
tests/provider/test_pool_demand_libvirt.py): nothing is hot until leased or kept by the config, a
first lease starts the filling for its source and its next lease is pooled, and a source not
leased for `keep_leased_s` loses its machines."""

from __future__ import annotations

from kit.poll import until

from providers.base import MachineSource
from providers.qemu.pool import Demand, HotPool, PoolConfig

from .test_pool_sources import WAIT, FakeHost, FakeMachine

TINY = MachineSource(image="linux-tiny")
DESKTOP = MachineSource(image="linux-desktop")
STATE = MachineSource(image="linux-tiny", start_state_id="ss_d", version=1)


class Images:
    """What the provider would list: every image of its images dir, and a version with memory."""

    async def __call__(self) -> list[tuple[MachineSource, str, int]]:
        return [(TINY, "t1", 256), (DESKTOP, "d1", 2048), (STATE, "ss_d/v1", 256)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_demand_keeps_the_kept_always_and_the_leased_until_idle() -> None:
    clock = Clock()
    demand = Demand(frozenset({TINY}), keep_leased_s=600, clock=clock)
    assert demand.wanted(TINY) and not demand.wanted(DESKTOP) and not demand.wanted(STATE)
    assert demand.next_idle_in() is None
    assert demand.leased(TINY) is False  # kept already: nothing starts
    assert demand.leased(DESKTOP) is True  # not hot until now: the pool starts filling for it
    assert demand.leased(DESKTOP) is False
    clock.now += 400
    assert demand.leased(STATE) is True
    assert demand.next_idle_in() == 200  # the desktop, leased 400 s ago
    clock.now += 199
    assert demand.wanted(DESKTOP) and demand.forget_idle() == []
    clock.now += 1
    assert not demand.wanted(DESKTOP) and demand.wanted(STATE) and demand.wanted(TINY)
    assert demand.forget_idle() == [DESKTOP]
    assert demand.next_idle_in() == 400  # the version
    clock.now += 10_000
    assert demand.wanted(TINY)  # kept by the config, leased or not
    assert demand.forget_idle() == [STATE] and demand.next_idle_in() is None
    assert demand.leased(DESKTOP) is True  # hot again from its next lease


async def test_nothing_is_hot_until_leased_and_the_next_lease_is_pooled() -> None:
    host = FakeHost()
    pool: HotPool[FakeMachine] = HotPool(host, PoolConfig(per_source=1, total_mib=4096, refill_delay_s=0), Images())
    await pool._fill_once()  # a pass, awaited: nothing to make
    assert host.made == [] and pool.counts() == {} and await pool.hot_sources() == []
    pool.start()
    try:

        assert await pool.take("at_1", DESKTOP, "d1") is None  # a first lease: the caller makes its machine
        await until(lambda: pool.counts() == {DESKTOP: 1}, WAIT, "the pool to fill for the desktop")
        assert await pool.hot_sources() == [DESKTOP]
        taken = await pool.take("at_2", DESKTOP, "d1")
        assert taken is not None and taken.source == DESKTOP
        await until(lambda: pool.counts() == {DESKTOP: 1}, WAIT, "the refill")
        assert {m.source for m in host.made} == {DESKTOP}  # nothing of what nobody leased
    finally:
        await pool.close()


async def test_the_kept_sources_are_hot_from_the_start() -> None:
    host = FakeHost()
    config = PoolConfig(per_source=2, total_mib=4096, keep=frozenset({TINY, STATE}))
    pool: HotPool[FakeMachine] = HotPool(host, config, Images())
    pool.start()
    try:
        await until(lambda: pool.counts() == {TINY: 2, STATE: 2}, WAIT, "the kept sources to fill")
        assert sorted(await pool.hot_sources(), key=str) == sorted([TINY, STATE], key=str)
        assert all(m.source != DESKTOP for m in host.made)
    finally:
        await pool.close()


async def test_a_source_not_leased_for_the_idle_time_is_dropped() -> None:
    """The idle time passes on the loop's clock: no lease, no wake from outside, the machines go."""
    host = FakeHost()
    config = PoolConfig(per_source=1, total_mib=4096, refill_delay_s=0, keep=frozenset({TINY}), keep_leased_s=0.5)
    pool: HotPool[FakeMachine] = HotPool(host, config, Images())
    pool.start()
    try:
        assert await pool.take("at_1", DESKTOP, "d1") is None
        await until(lambda: pool.counts() == {TINY: 1, DESKTOP: 1}, WAIT,
                    "the desktop pooled beside the kept image")
        desktop = next(m for m in host.made if m.source == DESKTOP)
        await until(lambda: desktop.destroyed, WAIT, "the idle desktop's machine to be destroyed")
        assert pool.counts() == {TINY: 1} and await pool.hot_sources() == [TINY]
        assert [m for m in host.made if m.source == DESKTOP and not m.destroyed] == []
    finally:
        await pool.close()
    assert all(m.destroyed for m in host.made)
