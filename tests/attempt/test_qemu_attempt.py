"""The attempt lifecycle on the real QEMU provider and the linux-tiny guest.

The same scenario as the unit tests, for real: setup writes /root/x, the check looks for
/root/fixed, and the "agent" (this test) fixes the machine through an exec request.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.libvirt import LIBVIRT_URI
from kit.scratch import scratch_dir

from gh_runner.attempt import Attempt
from gh_runner.config import Timeouts
from gh_wire.input import KeyEvent
from gh_wire.protocol import FrozenCase, Lease, Limits, MachineRequest, StartStateRef, TaskEnd
from providers.base import Provider

from .fakes import FakeLink

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(900)]

SETUP = "echo broken > /root/x"
CHECK = "[ -f /root/fixed ] && echo True || echo False"
WAIT = 240.0  # a TCG boot on a loaded 2-core host


@pytest.fixture
def state_dir() -> Iterator[Path]:
    with scratch_dir("gh-attempt-itest-") as state:  # libvirt-qemu must traverse it to reach the overlays
        yield state


@pytest.fixture
async def qemu(images_dir: Path, state_dir: Path) -> AsyncIterator[tuple[Provider, Path]]:
    from providers.qemu import QemuProvider

    provider = QemuProvider(images_dir, state_dir, f"attempttest{secrets.token_hex(3)}", LIBVIRT_URI)
    try:
        yield provider, state_dir
    finally:
        try:
            left = await asyncio.wait_for(provider.reap(keep=set()), 120)
        finally:
            await provider.close()
        assert left == [], f"the attempt left machines behind: {left}"


def lease(attempt_id: str) -> Lease:
    return Lease(
        attempt_id=attempt_id, agent_id="ag_test",
        case=FrozenCase(test_case_id="tc_itest", name="fixed file", prompt="create /root/fixed",
                        setup_script=SETUP, check_script=CHECK, limits=Limits(minutes=5)),
        start_state=StartStateRef(kind="image", image="linux-tiny"),
        script_timeout=120,
    )


def disks_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and p.suffix in {".qcow2", ".img"}]


async def until_task(link: FakeLink, run: asyncio.Task[Any]) -> None:
    """Wait for the task phase, or fail at once with the attempt's own error if it ended before."""
    seen = asyncio.create_task(link._event("task").wait())
    try:
        await asyncio.wait({seen, run}, timeout=2 * WAIT, return_when=asyncio.FIRST_COMPLETED)
    finally:
        seen.cancel()
    if run.done():
        pytest.fail(f"the attempt ended before its task: {run.result().error}")
    assert link._event("task").is_set(), "the task phase was not reached in time"


def new_attempt(provider: Provider, link: FakeLink) -> Attempt:
    attempt_id = f"at_itest_{secrets.token_hex(4)}"
    return Attempt(lease(attempt_id), provider, link, Timeouts(machine=WAIT, ready=WAIT, teardown=120))


async def play(provider: Provider, *, fix: bool) -> tuple[Any, FakeLink, list[Any]]:
    link = FakeLink()
    a = new_attempt(provider, link)
    attempt_id = a.machine_id
    run = asyncio.create_task(a.run())
    responses: list[Any] = []
    try:
        await until_task(link, run)
        responses.append(await a.handle_request(MachineRequest(request_id="s", op="screen")))
        responses.append(await a.handle_request(MachineRequest(request_id="i", op="input",
                                                               events=[KeyEvent(keys=["SHIFT"])])))
        if fix:
            responses.append(await a.handle_request(MachineRequest(
                request_id="e", op="exec", script="touch /root/fixed && cat /root/x", timeout=60)))
        a.task_end(TaskEnd(attempt_id=attempt_id, answer="done", steps=2))
        result = await asyncio.wait_for(run, 2 * WAIT)
    finally:
        if not run.done():
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
    return result, link, responses


async def assert_clean(provider: Provider, state: Path) -> None:
    assert await asyncio.wait_for(provider.reap(keep=set()), 120) == []  # nothing of ours still defined
    assert disks_under(state / "machines") == []


async def test_passing_attempt_on_linux_tiny(qemu: tuple[Provider, Path]) -> None:
    provider, state = qemu
    result, link, (screen, inp, fix) = await play(provider, fix=True)
    assert result.outcome == "passed", result.error
    assert result.check_before is not None and result.check_before.verdict == "False"
    assert result.check_after is not None and result.check_after.verdict == "True"
    assert screen.ok and base64.b64decode(screen.png_b64).startswith(b"\x89PNG")
    assert inp.ok, inp.error
    assert fix.ok and fix.exit_code == 0 and fix.stdout.strip() == "broken"  # the setup really ran
    labels = link.labels()
    assert labels[0] == "first" and labels[-1] == "last" and "input" in labels
    assert all(png.startswith(b"\x89PNG") for _, png, _ in link.frames)
    assert [s for s, _ in link.statuses] == ["preparing", "preparing", "preparing", "checking", "running",
                                             "checking", "done"]
    m = result.metrics
    assert m.steps == 2 and m.active_seconds > 0
    assert {"machine", "ready", "setup", "check_before", "task", "check_after", "teardown"} <= set(m.phase_seconds)
    await assert_clean(provider, state)


async def test_failing_attempt_on_linux_tiny(qemu: tuple[Provider, Path]) -> None:
    provider, state = qemu
    result, _, _ = await play(provider, fix=False)
    assert result.outcome == "failed", result.error
    assert result.check_after is not None and result.check_after.verdict == "False"
    await assert_clean(provider, state)


async def test_cancel_mid_task_leaves_nothing(qemu: tuple[Provider, Path]) -> None:
    provider, state = qemu
    link = FakeLink()
    a = new_attempt(provider, link)
    run = asyncio.create_task(a.run())
    try:
        await until_task(link, run)
        long_exec = asyncio.create_task(a.handle_request(MachineRequest(
            request_id="e", op="exec", script="sleep 600", timeout=900)))
        await asyncio.sleep(1)  # let the exec reach the guest: the cancel must stop a busy machine too
        a.cancel("run cancelled")
        result = await asyncio.wait_for(run, 150)
        resp = await asyncio.wait_for(long_exec, 30)
    finally:
        if not run.done():
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
    assert result.outcome == "error" and result.error == "cancelled: run cancelled"
    assert not resp.ok and "cancelled" in (resp.error or "")
    assert result.metrics.phase_seconds["teardown"] < 120
    await assert_clean(provider, state)


async def test_a_looping_check_is_stopped_at_the_cases_time_limit(qemu: tuple[Provider, Path]) -> None:
    """A check that never ends, on the real guest: its bound is the case's `limits.minutes` (scaled here
    to 6 s a minute), not the runner's 300 s or the lease's script timeout (120 s)."""
    provider, state = qemu
    link = FakeLink()
    attempt_id = f"at_itest_{secrets.token_hex(4)}"
    looping = lease(attempt_id).model_copy(deep=True)
    looping.case.check_script = "while true; do sleep 1; done"
    looping.case.limits = Limits(minutes=1)
    a = Attempt(looping, provider, link, Timeouts(machine=WAIT, ready=WAIT, teardown=120),
                seconds_per_minute=6.0)
    result = await asyncio.wait_for(a.run(), 3 * WAIT)
    assert result.outcome == "error" and result.error_phase == "check_before", result.error
    assert "did not finish within 6 s" in (result.error or ""), result.error
    assert result.metrics.phase_seconds["check_before"] < 60
    await assert_clean(provider, state)
