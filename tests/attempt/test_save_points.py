"""Save points during the task (issue 51): made when the agent asks and every
`limits.save_point_minutes`, the machine running on; only the last `save_points_kept` are kept; the
result lists them; a failed periodic save never ends the task (gh_runner/save_points.py)."""

from __future__ import annotations

import asyncio

from gh_runner.attempt import Attempt
from gh_wire.protocol import Lease, MachineRequest, TaskEnd

from .fakes import WAIT, FakeLink, FakeProvider, make_lease
from .test_lifecycle import FAST, exec_req, finish, start


def lease_with(minutes: int = 10, every: int | None = None, keep: int = 3) -> Lease:
    lease = make_lease(minutes=minutes)
    lease.case.limits.save_point_minutes = every
    lease.save_points_kept = keep
    return lease


async def test_the_agent_asks_for_a_save_point_and_carries_on(provider: FakeProvider, link: FakeLink) -> None:
    a = Attempt(lease_with(), provider, link, FAST)
    run = await start(a)
    await link.reached("task")
    assert (await a.handle_request(exec_req("fix"))).ok  # step 1
    resp = await asyncio.wait_for(a.handle_request(MachineRequest(request_id="sp", attempt_id="at_test1",
                                                                  op="save_point")), WAIT)
    assert resp.ok, resp.error
    assert resp.save_point is not None and resp.save_point.save_point_id == "ss_test1p1"
    assert resp.save_point.step == 1 and resp.save_point.bytes > 0
    assert provider.saved[0][:2] == ("ss_test1p1", 1) and "/root/fixed" in provider.saved[0][2]
    assert (await a.handle_request(exec_req("fix", rid="r2"))).ok  # the machine runs on after it
    a.task_end(TaskEnd(attempt_id="at_test1", steps=2))
    result = await finish(run)
    assert result.outcome == "passed", result.error
    assert result.save_points == [resp.save_point]
    assert provider.deleted == []  # save points outlive the attempt (a start state can be made of one)


async def test_periodic_save_points_keep_the_last_few(provider: FakeProvider, link: FakeLink) -> None:
    # seconds_per_minute 0.05: a save every 50 ms, a task limit of 10 minutes = 0.5 s
    a = Attempt(lease_with(every=1, keep=2), provider, link, FAST, seconds_per_minute=0.05)
    run = await start(a)
    await link.reached("task")
    async with asyncio.timeout(WAIT):
        while len(provider.saved) < 4:
            provider.save_made.clear()
            await provider.save_made.wait()
    a.task_end(TaskEnd(attempt_id="at_test1"))
    result = await finish(run)
    made = [sp_id for sp_id, _, _ in provider.saved]
    assert made[:4] == [f"ss_test1p{n}" for n in range(1, 5)]
    assert result.save_points is not None and [p.save_point_id for p in result.save_points] == made[-2:]
    assert provider.deleted == [(sp_id, 1) for sp_id in made[:-2]]  # the older ones, as newer came


async def test_a_failed_periodic_save_does_not_end_the_task(provider: FakeProvider, link: FakeLink) -> None:
    provider.save_error = True
    a = Attempt(lease_with(every=1), provider, link, FAST, seconds_per_minute=0.05)
    run = await start(a)
    await link.reached("task")
    resp = await a.handle_request(MachineRequest(request_id="sp", attempt_id="at_test1", op="save_point"))
    assert not resp.ok and "virDomainSave failed" in (resp.error or "")  # the agent is told; not our error
    assert (await a.handle_request(exec_req("fix"))).ok
    a.task_end(TaskEnd(attempt_id="at_test1", steps=1))
    result = await finish(run)
    assert result.outcome == "passed", result.error
    assert result.save_points is None


async def test_no_save_points_without_the_limit_or_a_request(provider: FakeProvider, link: FakeLink) -> None:
    a = Attempt(lease_with(minutes=1), provider, link, FAST, seconds_per_minute=0.2)
    run = await start(a)
    await link.reached("task")
    result = await finish(run)  # the task runs to its limit
    assert result.task_limit_reached and provider.saved == [] and result.save_points is None
