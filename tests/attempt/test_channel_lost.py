"""The check's channel broken by the agent (docs/server-api.md, "How a task ended"): an agent with exec or
input that leaves the guest's agent and executor dead while the guest runs is `failed`
(check_channel_lost_in_task); one the guest's init brings back lets the check run again; a dead channel
stays our `error` when the agent never acted or the runner sees a fault of ours (the guest not running).
tests/e2e/test_escape.py breaks the channel for real on linux-tiny."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from gh_runner.attempt import Attempt
from gh_wire.protocol import MachineRefusal, MachineRequest, TaskEnd
from gh_wire.vocab import FailReason
from providers.base import ScriptResult
from providers.errors import ProviderError

from .fakes import FakeLink, FakeMachine, FakeProvider, make_lease, ok
from .test_lifecycle import FAST, finish, start

QUICK = FAST.model_copy(update={"channel_back": 0.3})


def _breaks(how: str, respawns: bool = False, guest_runs: bool = True):  # type: ignore[no-untyped-def]
    def handler(m: FakeMachine, env: Mapping[str, str], t: float) -> ScriptResult:
        m.channel, m.respawns, m.guest_runs = how, respawns, guest_runs
        return ok(stdout="done\n")
    return handler


async def _attempt(provider: FakeProvider, link: FakeLink, agent_acts: bool, **breaks: object):  # type: ignore[no-untyped-def]
    provider.scripts["break-channel"] = _breaks(**breaks)  # type: ignore[arg-type]
    a = Attempt(make_lease(), provider, link, QUICK)
    run = await start(a)
    await link.reached("task")
    if agent_acts:
        resp = await a.handle_request(MachineRequest(request_id="r1", attempt_id="at_test1", op="exec",
                                                     script="break-channel", timeout=30))
        assert resp.ok
    else:  # the channel fails by itself while the agent only looked
        assert (await a.handle_request(MachineRequest(request_id="r1", attempt_id="at_test1", op="screen"))).ok
        _breaks(**breaks)(provider.machines[0], {}, 1.0)  # type: ignore[arg-type]
    a.task_end(TaskEnd(attempt_id="at_test1", answer="done"))
    return await finish(run)


@pytest.mark.parametrize("how", ["dead", "stopped"])
async def test_a_channel_the_agent_left_dead_is_its_failure(provider: FakeProvider, link: FakeLink, how: str) -> None:
    result = await _attempt(provider, link, True, how=how)
    assert result.outcome == "failed", result.error
    assert result.failed_reason == FailReason.CHECK_CHANNEL_LOST_IN_TASK
    assert result.error is None and result.check_after is None


async def test_a_channel_the_guest_brings_back_runs_the_check_again(provider: FakeProvider, link: FakeLink) -> None:
    result = await _attempt(provider, link, True, how="dead", respawns=True)
    assert result.outcome == "failed" and result.failed_reason is None  # its check's own verdict
    assert result.check_after is not None and result.check_after.verdict == "False"


async def test_a_dead_channel_without_the_agents_exec_or_input_is_ours(provider: FakeProvider,
                                                                     link: FakeLink) -> None:
    result = await _attempt(provider, link, False, how="dead")
    assert result.outcome == "error" and result.error_phase == "check_after"


async def test_a_dead_channel_on_a_guest_that_does_not_run_is_ours(provider: FakeProvider, link: FakeLink) -> None:
    result = await _attempt(provider, link, True, how="dead", guest_runs=False)  # QEMU dead, disk full: paused
    assert result.outcome == "error" and result.error_phase == "check_after" and result.failed_reason is None


@pytest.mark.parametrize(("guest_runs", "typed"), [(True, True), (False, False)])
async def test_an_exec_that_kills_its_own_channel_is_refused_as_the_agents(provider: FakeProvider, link: FakeLink,
                                                                         guest_runs: bool, typed: bool) -> None:
    """The agent's own script (elevated) killed the guest agent under itself: while the guest runs, the refusal
    says so (CHANNEL_LOST_IN_EXEC: the server answers 422 and does not count it as the machine failing)."""
    def kills_itself(m: FakeMachine, env: Mapping[str, str], t: float) -> ScriptResult:
        m.channel, m.respawns, m.guest_runs = "dead", True, guest_runs
        raise ProviderError("guest agent guest-exec: the guest agent is not answering")

    provider.scripts["kill-qemu-ga"] = kills_itself
    a = Attempt(make_lease(), provider, link, QUICK)
    run = await start(a)
    await link.reached("task")
    resp = await a.handle_request(MachineRequest(request_id="r1", attempt_id="at_test1", op="exec",
                                                 script="kill-qemu-ga", timeout=30))
    assert not resp.ok
    assert (resp.refusal == MachineRefusal.CHANNEL_LOST_IN_EXEC) is typed, resp
    a.task_end(TaskEnd(attempt_id="at_test1", answer="done"))
    result = await finish(run)
    assert result.outcome == "failed", result.error  # the guest's init brought the channel back: checked
