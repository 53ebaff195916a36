"""An attempt goes on from its save point on the real linux-desktop with a GUI application open (issue 51,
part 3; tests/attempt/test_qemu_resume.py proves the rest on linux-tiny). The agent opens Mousepad on a
file and asks for a save point; the first machine is then lost. The attempt's second lease makes the
machine from the save point: the same Mousepad window is on the restored desktop (restored with the
memory, not started again), nothing written after the save is there, the guest's clock is the host's,
the screen is a painted desktop, and the agent's first action is refused `machine_restored`."""

from __future__ import annotations

import asyncio
import time

import pytest
from attempt.fakes import FakeLink

from gh_runner.attempt import Attempt
from gh_runner.config import Timeouts
from gh_wire.protocol import (
    AttemptResult,
    FrozenCase,
    Lease,
    Limits,
    MachineRefusal,
    MachineRequest,
    Restore,
    StartStateRef,
    TaskEnd,
)
from providers.qemu import QemuMachine, QemuProvider
from providers.qemu.screen import PAINTED_MIN_COLOURS, distinct_colours

from .conftest import BOOT_TIMEOUT, DESKTOP_TEST_TIMEOUT_S, IMAGE
from .gui import sh, until

pytestmark = [pytest.mark.desktop, pytest.mark.libvirt, pytest.mark.slow,
              pytest.mark.timeout(DESKTOP_TEST_TIMEOUT_S), pytest.mark.asyncio(loop_scope="session")]

AID = "at_dtest_resume"
NOTE = "/home/user/resume-note.txt"
WINDOW = "xdotool search --onlyvisible --name resume-note"


def desktop_lease() -> Lease:
    return Lease(attempt_id=AID, agent_id="ag_test", script_timeout=300,
                 case=FrozenCase(test_case_id="tc_dresume", name="note", prompt="keep the note",
                                 check_script="[ -e /home/user/fixed ] && echo True || echo False",
                                 limits=Limits(minutes=60)),
                 start_state=StartStateRef(kind="image", image=IMAGE))


async def until_task(attempt: Attempt, link: FakeLink, run: asyncio.Task[AttemptResult]) -> QemuMachine:
    """The attempt's machine once its task began; fails at once with its error if it ended before."""
    seen = asyncio.ensure_future(link._event("task").wait())
    try:
        await asyncio.wait({seen, run}, timeout=BOOT_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
    finally:
        seen.cancel()
    if run.done():
        pytest.fail(f"the attempt ended before its task: {run.result().error}")
    assert link._event("task").is_set(), "the task phase was not reached in time"
    assert isinstance(attempt.machine, QemuMachine)
    return attempt.machine


def exec_req(rid: str, script: str) -> MachineRequest:
    return MachineRequest(request_id=rid, op="exec", timeout=120, script=script)


async def test_a_desktop_with_an_app_open_goes_on_from_its_save_point(desktop_provider: QemuProvider) -> None:
    timeouts = Timeouts(machine=BOOT_TIMEOUT, ready=BOOT_TIMEOUT, teardown=300)
    link = FakeLink()
    first = Attempt(desktop_lease(), desktop_provider, link, timeouts)
    run = asyncio.create_task(first.run())
    try:
        m = await until_task(first, link, run)
        opened = await first.handle_request(exec_req("open", f"echo before > {NOTE}; "
                                                             f"setsid mousepad {NOTE} >/dev/null 2>&1 &"))
        assert opened.ok and opened.exit_code == 0, opened
        await until(m, WINDOW, 120, "Mousepad's window")
        pid = (await sh(m, "pgrep -x mousepad")).split()[0]
        saved = await asyncio.wait_for(first.handle_request(MachineRequest(request_id="sp", op="save_point")), 900)
        assert saved.ok and saved.save_point is not None, saved.error
        point = saved.save_point
        after = await first.handle_request(exec_req("after", "touch /home/user/after"))
        assert after.ok and after.exit_code == 0, after
        first.cancel("the runner was lost")
        assert (await asyncio.wait_for(run, 600)).outcome == "error"
    finally:
        if not run.done():
            run.cancel()

    resumed = desktop_lease()
    resumed.start_state = StartStateRef(kind="state", image=IMAGE, start_state_id=point.save_point_id, version=1)
    resumed.restore = Restore(save_point=point, kept=[point], resumed=1)
    link = FakeLink()
    second = Attempt(resumed, desktop_provider, link, timeouts)
    run = asyncio.create_task(second.run())
    try:
        m = await until_task(second, link, run)
        host_s = time.time()
        # The same process and its window, restored with the memory; nothing of after the save.
        seen = await sh(m, f"{WINDOW} >/dev/null && echo window; pgrep -x mousepad; [ -e /home/user/after ] "
                           "&& echo after; date +%s")
        lines = seen.split()
        assert lines[:2] == ["window", pid], seen
        assert abs(int(lines[-1]) - host_s) < 10, (lines[-1], host_s)
        assert distinct_colours(await m.screenshot()) >= PAINTED_MIN_COLOURS  # a painted desktop
        refused = await second.handle_request(exec_req("r", "true"))
        assert not refused.ok and refused.refusal == MachineRefusal.RESTORED, refused
        fixed = await second.handle_request(exec_req("f", "touch /home/user/fixed"))
        assert fixed.ok and fixed.exit_code == 0, fixed
        second.task_end(TaskEnd(attempt_id=AID, answer="done", steps=2))
        result = await asyncio.wait_for(run, 600)
    finally:
        if not run.done():
            run.cancel()
    assert result.outcome == "passed", result.error
    assert result.metrics.resumed == 1
    for sp in result.save_points or []:
        await desktop_provider.delete_version(sp.save_point_id, 1)
