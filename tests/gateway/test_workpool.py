"""The worker pools' two promises: at most `size` jobs at once, and a deadline on each."""

from __future__ import annotations

import asyncio

import pytest

from gh_server.workpool import PoolTimeout, WorkPool


async def test_at_most_size_jobs_run_at_once() -> None:
    seen: list[tuple[str, str]] = []
    pool = WorkPool("judge", 2, 30.0, observer=lambda name, _s, outcome: seen.append((name, outcome)))
    peak = 0
    gate, full = asyncio.Event(), asyncio.Event()

    async def job() -> int:
        nonlocal peak
        peak = max(peak, pool.running)
        if pool.running == 2:
            full.set()
        await gate.wait()
        return 1

    tasks = [asyncio.create_task(pool.run(job)) for _ in range(5)]
    await asyncio.wait_for(full.wait(), 10)
    assert pool.running == 2 and pool.waiting == 3
    gate.set()
    assert sum(await asyncio.gather(*tasks)) == 5
    assert peak == 2 and seen == [("judge", "ok")] * 5


async def test_a_job_past_its_deadline_is_cancelled_and_raises() -> None:
    pool = WorkPool("customer", 1, 0.05)
    cancelled = asyncio.Event()

    async def slow() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(PoolTimeout, match=r"customer did not finish within 0\.05 s"):
        await pool.run(slow)
    assert cancelled.is_set() and pool.running == 0
    assert await pool.run(lambda: asyncio.sleep(0, "free again"), timeout=5) == "free again"
