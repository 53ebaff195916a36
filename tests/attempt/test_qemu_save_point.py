"""A save point on the real QEMU provider and linux-tiny (issue 51): the agent asks for one mid-task,
the machine carries on, and a machine started from it (as a start state made from it starts) holds
what the guest wrote before the save and nothing written after."""

from __future__ import annotations

import asyncio

import pytest
from kit.libvirt import LIBVIRT_URI  # noqa: F401 - the libvirt marker's connection

from gh_runner.config import Timeouts
from gh_wire.protocol import MachineRequest, TaskEnd
from providers.base import MachineSource, Provider

from .fakes import FakeLink
from .test_qemu_attempt import WAIT, assert_clean, lease, qemu, state_dir, until_task  # noqa: F401 - fixtures

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(1200)]


async def test_save_point_mid_task_then_a_machine_from_it(qemu: tuple[Provider, object]) -> None:  # noqa: F811
    from gh_runner.attempt import Attempt

    provider, state = qemu
    link = FakeLink()
    a = Attempt(lease("at_itest_sp"), provider, link, Timeouts(machine=WAIT, ready=WAIT, teardown=120))
    run = asyncio.create_task(a.run())
    sp_id = None
    try:
        await until_task(link, run)
        before = await a.handle_request(MachineRequest(request_id="b", op="exec", timeout=60,
                                                       script="echo one > /root/before && sync"))
        assert before.ok and before.exit_code == 0, before
        saved = await asyncio.wait_for(a.handle_request(MachineRequest(request_id="sp", op="save_point")), 900)
        assert saved.ok, saved.error
        assert saved.save_point is not None and saved.save_point.step == 1 and saved.save_point.bytes > 0
        sp_id = saved.save_point.save_point_id
        after = await a.handle_request(MachineRequest(request_id="a", op="exec", timeout=60,
                                                      script="cat /root/before && touch /root/after /root/fixed"))
        assert after.ok and after.exit_code == 0 and after.stdout.strip() == "one", after  # it carried on
        a.task_end(TaskEnd(attempt_id="at_itest_sp", answer="done", steps=2))
        result = await asyncio.wait_for(run, 2 * WAIT)
        assert result.outcome == "passed", result.error
        assert result.save_points == [saved.save_point]
        assert (sp_id, 1) in await provider.held_versions()
        await assert_clean(provider, state)  # the attempt's machine and overlay are gone; the save point stays

        fork = await provider.create_machine("at_itest_fork", MachineSource(image="linux-tiny", start_state_id=sp_id,
                                                                            version=1), timeout=WAIT)
        try:
            await fork.wait_ready(WAIT)
            seen = await fork.run_script("cat /root/before; [ -e /root/after ] && echo after || echo no-after",
                                         timeout=60)
            assert seen.exit_code == 0 and seen.stdout.split() == ["one", "no-after"], seen
        finally:
            await fork.destroy()
    finally:
        if not run.done():
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
        if sp_id is not None:
            await provider.delete_version(sp_id, 1)
    assert await provider.held_versions() == []
