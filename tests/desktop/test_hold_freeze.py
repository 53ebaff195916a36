"""A takeover's hold freezes what the agent runs on the real linux-desktop (issue 49 part 4: the desktop's
exec path, providers/qemu/agent_groups.py). tests/attempt/test_hold_freeze.py proves it on linux-tiny
through gh-execd and qemu-ga; here the agent's exec goes the desktop's way, as the signed-in user through
qemu-ga's wrapper, which joins the exec group as root (the user cannot write under /sys/fs/cgroup).

The exec starts a counter that leaves its session (setsid, a daemon) and writes a number every 0.2 s,
then waits for it to reach 40. Frozen: the counter stands still for as long as the guest's own clock says
1.5 s passed, read after read, and the exec does not end; thawed: it counts on and the exec finishes.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from providers.qemu import QemuMachine

from .conftest import DESKTOP_TEST_TIMEOUT_S

pytestmark = [pytest.mark.desktop, pytest.mark.libvirt, pytest.mark.slow,
              pytest.mark.timeout(DESKTOP_TEST_TIMEOUT_S), pytest.mark.asyncio(loop_scope="session")]

# In the user's home: the guest agent's service may have a /tmp of its own.
COUNTER = "/home/user/.gh-freeze-count"
AGENT_EXEC = (
    f"rm -f {COUNTER}\n"
    f"( setsid sh -c 'echo $$ > {COUNTER}.pid; i=0; while :; do i=$((i + 1)); echo $i > {COUNTER}.new; "
    f"mv {COUNTER}.new {COUNTER}; sleep 0.2; done' < /dev/null > /dev/null 2>&1 & )\n"
    f"until [ \"$(cat {COUNTER} 2>/dev/null || echo 0)\" -ge 40 ]; do sleep 0.2; done\n"
    "echo counted\n"
)
STILL_FOR = 1.5  # guest seconds the counter must stand still while frozen
STILL_READS = 5  # and at least this many reads
WAIT = 120.0  # a step under TCG on a loaded 2-core host


async def read(m: QemuMachine) -> tuple[int, float]:
    """The counter and the guest's uptime, read outside any agent group."""
    res = await m.run_script(f"cat {COUNTER} 2>/dev/null || echo 0; cut -d' ' -f1 /proc/uptime", timeout=60)
    assert res.exit_code == 0, res
    count, uptime = res.stdout.split()
    return int(count), float(uptime)


async def until_above(m: QemuMachine, above: int) -> int:
    deadline = time.monotonic() + WAIT
    while True:
        count, _ = await read(m)
        if count > above:
            return count
        assert time.monotonic() < deadline, f"the counter stayed at {count} for {WAIT:.0f} s"
        await asyncio.sleep(0.2)  # a poll interval; the deadline above bounds it


async def test_a_hold_freezes_the_agents_desktop_exec_and_what_it_left_running(desktop: QemuMachine) -> None:
    run = asyncio.create_task(desktop.run_agent_script(AGENT_EXEC, timeout=600))
    try:
        await until_above(desktop, 0)
        assert await desktop.freeze_agent_execs(True, WAIT)
        held_at, since = await read(desktop)
        reads, uptime = 0, since
        while reads < STILL_READS or uptime - since < STILL_FOR:
            count, uptime = await read(desktop)
            reads += 1
            assert count == held_at, f"the counter moved from {held_at} to {count} while frozen"
            assert uptime - since < WAIT, "the guest's clock went on for too long"
        assert not run.done(), "the agent's exec ended while frozen"
        assert await desktop.freeze_agent_execs(False, WAIT)
        await until_above(desktop, held_at)
        res = await asyncio.wait_for(run, 2 * WAIT)
        assert res.exit_code == 0 and res.stdout.strip() == "counted" and not res.timed_out, res
    finally:
        if not run.done():
            await desktop.freeze_agent_execs(False, WAIT)
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
        # The counter it left running is the agent's: the next test on this machine finds none.
        await desktop.run_script(f"kill $(cat {COUNTER}.pid) 2>/dev/null; rm -f {COUNTER} {COUNTER}.pid", timeout=60)
