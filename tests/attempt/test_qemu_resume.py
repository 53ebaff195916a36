"""An attempt that goes on from its save point (issue 51, `Lease.restore`), on the real QEMU provider and
linux-tiny: the runner lost the attempt after the save (here its first machine is cancelled, as a
crash leaves it to the reaper), and a second lease of the same attempt makes the machine from the save
point. The guest holds what it held at the save and nothing written after, its clock is the host's,
the agent's first action is refused `machine_restored` and its requests before the task `machine_away`,
steps and save points go on from the save point, and the replay marks the resume."""

from __future__ import annotations

import asyncio
import time

import pytest
from kit.libvirt import LIBVIRT_URI  # noqa: F401 - the libvirt marker's connection

from gh_runner.config import Timeouts
from gh_wire.protocol import MachineRefusal, MachineRequest, Restore, StartStateRef, TaskEnd
from providers.base import Provider

from .fakes import FakeLink
from .test_qemu_attempt import WAIT, assert_clean, lease, qemu, state_dir, until_task  # noqa: F401 - fixtures

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(1500)]

AID = "at_itest_resume"


def exec_req(rid: str, script: str) -> MachineRequest:
    return MachineRequest(request_id=rid, op="exec", timeout=60, script=script)


async def test_the_same_attempt_goes_on_from_its_save_point(qemu: tuple[Provider, object]) -> None:  # noqa: F811
    from gh_runner.attempt import Attempt

    provider, state = qemu
    timeouts = Timeouts(machine=WAIT, ready=WAIT, teardown=120)
    first_link = FakeLink()
    first = Attempt(lease(AID), provider, first_link, timeouts)
    run = asyncio.create_task(first.run())
    try:
        await until_task(first_link, run)
        wrote = await first.handle_request(exec_req("b", "echo one > /root/before && sync"))
        assert wrote.ok and wrote.exit_code == 0, wrote
        saved = await asyncio.wait_for(first.handle_request(MachineRequest(request_id="sp", op="save_point")), 900)
        assert saved.ok and saved.save_point is not None, saved.error
        point = saved.save_point
        assert point.step == 1 and point.task_seconds is not None and point.task_seconds > 0
        assert first_link.save_points == [point]  # the server is told as it is made
        after = await first.handle_request(exec_req("a", "touch /root/after"))
        assert after.ok and after.exit_code == 0, after
        first.cancel("the runner was lost")  # its machine goes, as the reaper takes a crashed runner's
        lost = await asyncio.wait_for(run, WAIT)
        assert lost.outcome == "error"
    finally:
        if not run.done():
            run.cancel()

    resumed = lease(AID)
    resumed.start_state = StartStateRef(kind="state", image="linux-tiny", start_state_id=point.save_point_id,
                                        version=1)
    resumed.restore = Restore(save_point=point, kept=[point], resumed=1, replay_seq=40)
    link = FakeLink()
    second = Attempt(resumed, provider, link, timeouts)
    early = await second.handle_request(exec_req("early", "true"))  # the agent, on the server, runs on meanwhile
    assert not early.ok and early.refusal == MachineRefusal.AWAY, early
    run = asyncio.create_task(second.run())
    try:
        await until_task(link, run)
        assert [p for _, p in link.statuses if p in ("setup", "check_before")] == []  # neither runs again
        marks = [e for label, _, e in link.frames if label == "resumed"]
        assert marks == [{"resumed": 1, "save_point_id": point.save_point_id, "step": 1}]
        refused = await second.handle_request(exec_req("r", "touch /root/planned-before"))
        assert not refused.ok and refused.refusal == MachineRefusal.RESTORED, refused
        assert point.save_point_id in (refused.error or "") and refused.save_point == point
        host_s = time.time()
        seen = await second.handle_request(exec_req(
            "s", "cat /root/before; for f in after planned-before; do [ -e /root/$f ] && echo $f; done; date +%s"))
        assert seen.ok and seen.exit_code == 0, seen
        lines = seen.stdout.split()
        assert lines[:-1] == ["one"], seen.stdout  # what it held at the save, nothing after, nothing refused
        assert abs(int(lines[-1]) - host_s) < 5, (lines[-1], host_s)  # the clock set after the restore
        again = await asyncio.wait_for(second.handle_request(MachineRequest(request_id="sp2", op="save_point")), 900)
        assert again.ok and again.save_point is not None, again.error
        # Numbered after the first; the refused action spent no step; the task time goes on from the save's.
        assert again.save_point.save_point_id == point.save_point_id[:-1] + "2" and again.save_point.step == 2
        assert (again.save_point.task_seconds or 0) > (point.task_seconds or 0)
        fixed = await second.handle_request(exec_req("f", "touch /root/fixed"))
        assert fixed.ok and fixed.exit_code == 0, fixed
        second.task_end(TaskEnd(attempt_id=AID, answer="done", steps=3))
        result = await asyncio.wait_for(run, 2 * WAIT)
    finally:
        if not run.done():
            run.cancel()
    assert result.outcome == "passed", result.error
    assert result.metrics.resumed == 1
    assert "setup" not in result.metrics.phase_seconds and "resume" in result.metrics.phase_seconds
    assert [p.save_point_id for p in result.save_points or []] == [point.save_point_id, again.save_point.save_point_id]
    for sp in result.save_points or []:
        await provider.delete_version(sp.save_point_id, 1)
    await assert_clean(provider, state)
