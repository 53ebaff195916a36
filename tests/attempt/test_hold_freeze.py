"""A takeover's hold freezes what the agent runs on the real linux-tiny guest (issue 49 part 4,
providers/qemu/agent_groups.py, gh_common/task_hold.py).

The agent's exec starts a counter that leaves its session (setsid, its parent gone: a daemon) and
writes a number to a file every 0.2 s, then waits for its counter to reach 40. Two such execs run at
once: the first through gh-execd (its shell joins its group), the second through qemu-ga (gh-execd is
busy: the wrapper joins as root, the way a desktop user's script does). A hold is taken while all
run: both counters stand still for as long as the guest's own clock says 1.5 s passed, read after
read; after the hand-back they advance again, the execs finish, and each answer says it was frozen
for the takeover.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from gh_wire.protocol import MachineRequest, TaskEnd
from gh_wire.vocab import ExecFreeze
from providers.base import Provider

from .fakes import FakeLink
from .test_qemu_attempt import WAIT, assert_clean, new_attempt, qemu, state_dir, until_task  # noqa: F401 - the fixtures this test uses

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(900)]



def agent_exec(name: str) -> str:
    return (
        f"( setsid sh -c 'i=0; while :; do i=$((i + 1)); echo $i > /tmp/{name}.new; "
        f"mv /tmp/{name}.new /tmp/{name}; sleep 0.2; done' < /dev/null > /dev/null 2>&1 & )\n"
        f"until [ \"$(cat /tmp/{name} 2>/dev/null || echo 0)\" -ge 40 ]; do sleep 0.2; done\n"
        "echo counted\n"
    )


STILL_FOR = 1.5  # guest seconds the counter must stand still while held
STILL_READS = 5  # and at least this many reads


async def read(a: Any) -> tuple[tuple[int, int], float]:
    """Both counters and the guest's uptime, read through the guest (qemu-ga: gh-execd is busy with
    the agent's exec), outside any agent group."""
    res = await a.machine.run_script("for c in one two; do cat /tmp/$c 2>/dev/null || echo 0; done; "
                                     "cut -d' ' -f1 /proc/uptime", timeout=60)
    assert res.exit_code == 0, res
    one, two, uptime = res.stdout.split()
    return (int(one), int(two)), float(uptime)


async def until_counters(a: Any, above: tuple[int, int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        counters, _ = await read(a)
        if all(c > b for c, b in zip(counters, above, strict=True)):
            return
        assert time.monotonic() < deadline, f"the counters stayed at {counters} for {timeout:.0f} s"
        await asyncio.sleep(0.2)  # a poll interval; the deadline above bounds it


async def test_a_hold_freezes_the_agents_exec_and_what_it_left_running(qemu: tuple[Provider, Path]) -> None:  # noqa: F811
    provider, state = qemu
    link = FakeLink()
    a = new_attempt(provider, link)
    run = asyncio.create_task(a.run())
    try:
        await until_task(link, run)
        execs = [asyncio.create_task(a.handle_request(MachineRequest(request_id=name, op="exec",
                                                                     script=agent_exec(name), timeout=600)))
                 for name in ("one", "two")]
        # Both count at once, so the second did not wait for gh-execd (one script at a time): qemu-ga ran it.
        await until_counters(a, (1, 1), WAIT)

        assert a.task_hold(True)
        await link.reached("frame:takeover")  # the freeze is done before the hold's frame
        held_at, since = await read(a)
        reads = 0
        uptime = since
        while reads < STILL_READS or uptime - since < STILL_FOR:
            counters, uptime = await read(a)
            reads += 1
            assert counters == held_at, f"the counters moved from {held_at} to {counters} during the hold"
            assert uptime - since < WAIT, "the guest's clock went on for too long"
        assert not any(ex.done() for ex in execs), "an agent's exec ended during the hold"

        assert a.task_hold(False)
        await link.reached("frame:handback")
        await until_counters(a, held_at, WAIT)
        answers = [await asyncio.wait_for(ex, 2 * WAIT) for ex in execs]
        a.task_end(TaskEnd(attempt_id=a.machine_id, answer="done"))
        await asyncio.wait_for(run, 2 * WAIT)
    finally:
        if not run.done():
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
    for resp in answers:
        assert resp.ok and resp.exit_code == 0 and resp.stdout.strip() == "counted", resp
        assert not resp.timed_out
        assert resp.frozen is not None and resp.frozen.reason is ExecFreeze.TAKEOVER, resp
        assert resp.frozen.seconds >= STILL_FOR, resp.frozen
    await assert_clean(provider, state)


SLEEP_S = 10  # what each exec sleeps; its timeout is a little more, and the hold longer than both
EXEC_TIMEOUT_S = 12
HELD_FOR = 14  # guest seconds


async def test_a_hold_does_not_count_against_the_execs_timeout(qemu: tuple[Provider, Path]) -> None:  # noqa: F811
    """An exec frozen by a hold longer than its own timeout is not timed out for it: gh-execd's deadline
    (the first exec) and the host's deadline on qemu-ga's path (the second) move on by the hold."""
    provider, state = qemu
    link = FakeLink()
    a = new_attempt(provider, link)
    run = asyncio.create_task(a.run())
    try:
        await until_task(link, run)
        execs = [asyncio.create_task(a.handle_request(MachineRequest(
            request_id=name, op="exec", script=f"touch /tmp/began-{name}; sleep {SLEEP_S}; echo slept",
            timeout=EXEC_TIMEOUT_S))) for name in ("one", "two")]
        deadline = time.monotonic() + WAIT
        while (await a.machine.run_script("ls /tmp/began-one /tmp/began-two", timeout=60)).exit_code != 0:
            assert time.monotonic() < deadline, "the execs did not begin"
            await asyncio.sleep(0.2)  # a poll interval; the deadline above bounds it

        assert a.task_hold(True)
        await link.reached("frame:takeover")
        assert not any(ex.done() for ex in execs), "an exec ended before the hold froze it"
        _, since = await read(a)
        uptime = since
        while uptime - since < HELD_FOR:
            _, uptime = await read(a)
            assert not any(ex.done() for ex in execs), f"an exec ended {uptime - since:.1f} s into the hold"
        assert a.task_hold(False)
        await link.reached("frame:handback")
        answers = [await asyncio.wait_for(ex, 2 * WAIT) for ex in execs]
        a.task_end(TaskEnd(attempt_id=a.machine_id, answer="done"))
        await asyncio.wait_for(run, 2 * WAIT)
    finally:
        if not run.done():
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
    for resp in answers:
        assert resp.ok and not resp.timed_out and resp.exit_code == 0 and resp.stdout.strip() == "slept", resp
        assert resp.frozen is not None and resp.frozen.seconds >= HELD_FOR, resp.frozen
    await assert_clean(provider, state)
