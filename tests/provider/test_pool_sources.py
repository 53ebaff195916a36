"""The hot pool when a source goes away, at the `PoolHost` boundary (the real provider's side is
tests/provider/test_pool.py::test_deleting_a_version_destroys_its_pooled_machines_first): a machine
of a source no longer listed is destroyed on the next pass, and `dropping` destroys a source's machines,
waits out one being made of it, and makes none while the caller removes its files."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from kit.poll import until

from gh_common.timeouts import within
from providers.base import MachineSource
from providers.qemu.pool import HotPool, PoolConfig

pytestmark = pytest.mark.asyncio

V1 = MachineSource(image="linux-tiny", start_state_id="ss_p", version=1)
V2 = MachineSource(image="linux-tiny", start_state_id="ss_p", version=2)
KEPT = frozenset({V1, V2})  # hot from the start, as if kept by the config
WAIT = 10.0


@dataclass
class FakeMachine:
    machine_id: str
    source: MachineSource
    restored: bool = True
    destroyed: bool = False

    async def destroy(self) -> None:
        self.destroyed = True


@dataclass
class FakeHost:
    """Makes machines at once, or, for a source in `slow`, once the test opens its gate."""

    slow: dict[MachineSource, asyncio.Event] = field(default_factory=dict)
    making: asyncio.Event = field(default_factory=asyncio.Event)
    made: list[FakeMachine] = field(default_factory=list)

    async def make_paused(self, machine_id: str, source: MachineSource, *, timeout: float) -> FakeMachine:
        m = FakeMachine(machine_id, source)
        self.made.append(m)
        gate = self.slow.get(source)
        if gate is not None:
            self.making.set()
            await gate.wait()
        return m

    async def prime(self, machine: FakeMachine, timeout: float) -> float:
        return 0.01

    async def adopt(self, machine: FakeMachine, machine_id: str) -> None:
        pass

    def release(self, machine_id: str) -> None:
        pass


class Listing:
    def __init__(self, *sources: MachineSource) -> None:
        self.sources = list(sources)

    async def __call__(self) -> list[tuple[MachineSource, str, int]]:
        return [(s, f"{s.start_state_id}/v{s.version}", 256) for s in self.sources]


def alive(host: FakeHost, source: MachineSource) -> list[FakeMachine]:
    return [m for m in host.made if m.source == source and not m.destroyed]


async def test_a_source_no_longer_listed_loses_its_machines_on_the_next_pass() -> None:
    host, listing = FakeHost(), Listing(V1, V2)
    pool: HotPool[FakeMachine] = HotPool(host, PoolConfig(per_source=1, total_mib=1024, keep=KEPT), listing)
    pool.start()
    try:
        await until(lambda: pool.counts() == {V1: 1, V2: 1}, WAIT, "the pool to fill", every=0.01)
        listing.sources = [V2]  # v1's files were removed behind the pool's back
        pool.wake()
        await until(lambda: not alive(host, V1), WAIT, "v1's machine to be destroyed", every=0.01)
        assert pool.counts() == {V2: 1} and len(alive(host, V2)) == 1
    finally:
        await pool.close()
    assert not alive(host, V1) and not alive(host, V2)


async def test_dropping_destroys_the_sources_machines_and_one_being_made_of_it() -> None:
    gate = asyncio.Event()
    host, listing = FakeHost(slow={V2: gate}), Listing(V1, V2)
    pool: HotPool[FakeMachine] = HotPool(host, PoolConfig(per_source=1, total_mib=1024, keep=KEPT), listing)
    pool.start()
    try:
        await until(lambda: pool.counts().get(V1) == 1 and host.making.is_set(), WAIT, "v1 pooled, v2 being made",
                    every=0.01)

        def is_version(s: MachineSource) -> bool:
            return s.start_state_id == "ss_p"

        entered = asyncio.Event()
        removed = asyncio.Event()

        async def delete() -> int:
            async with pool.dropping(is_version) as destroyed:
                entered.set()
                assert alive(host, V1) == [] and alive(host, V2) == []  # before the files go
                # The caller's files go here: the pool makes no machine of them meanwhile.
                pool.wake()
                await asyncio.sleep(0.1)
                assert len(host.made) == 2
                listing.sources = []
                removed.set()
            return destroyed

        deleting = asyncio.create_task(delete())
        await asyncio.sleep(0.1)
        assert not entered.is_set()  # it waits out the machine being made of v2
        gate.set()
        destroyed = await within(WAIT, deleting)
        assert removed.is_set() and destroyed == 1  # v1's pooled machine; v2's was never pooled
        assert alive(host, V1) == [] and alive(host, V2) == [] and pool.counts() == {}
        pool.wake()
        await asyncio.sleep(0.1)
        assert len(host.made) == 2  # nothing listed, nothing made
    finally:
        await pool.close()
