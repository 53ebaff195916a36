"""The agent's failures are never our errors (docs/agents.md). How the task ended (time limit mid-exec,
an agent that failed on its own) is noted on the result, and the check after decides the outcome;
only a failure on our side, reported as `task_end.error` before the limit, makes the attempt an error."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from gh_runner import outcome as rules
from gh_runner.attempt import Attempt
from gh_wire.protocol import MachineRequest, TaskEnd, TaskEndReason
from providers.base import ScriptResult

from .fakes import WAIT, FakeLink, FakeMachine, FakeProvider, make_lease, ok
from .test_lifecycle import FAST, finish, start


def exec_req(script: str, rid: str = "r1") -> MachineRequest:
    return MachineRequest(request_id=rid, attempt_id="at_test1", op="exec", script=script, timeout=600)


async def test_limit_mid_exec_ends_the_task_and_the_check_decides(provider: FakeProvider, link: FakeLink) -> None:
    """The reference fix still runs when limits.minutes hits. The refusal says the
    task was stopped, the agent's side then reports the failed exec as task_end.error (what the server did
    once), and the attempt is `failed` by its check, not an `error` retried twice."""
    began = asyncio.Event()

    async def slow_fix(m: FakeMachine, env: Mapping[str, str], t: float) -> ScriptResult:
        began.set()
        await asyncio.Event().wait()  # runs past the limit, until the runner stops it
        return ok()

    provider.scripts["slow-fix"] = slow_fix
    a = Attempt(make_lease(minutes=1), provider, link, FAST, seconds_per_minute=0.5)
    run = await start(a)
    await link.reached("task")
    resp = await asyncio.wait_for(a.handle_request(exec_req("slow-fix")), WAIT)
    assert began.is_set()
    assert not resp.ok and "limit of 1 minute" in (resp.error or "")
    assert resp.stopped == TaskEndReason.TIME_LIMIT
    a.task_end(TaskEnd(attempt_id="at_test1", error=f"exec on the machine failed: {resp.error}"))
    result = await finish(run)
    assert result.outcome == "failed", result.error
    assert result.error is None and result.error_phase is None
    assert result.task_limit_reached and result.task_end == TaskEndReason.TIME_LIMIT
    assert result.task_note is not None and "limit of 1 minute" in result.task_note
    assert result.check_after is not None and result.check_after.verdict == "False"


async def test_agent_that_failed_on_its_own_is_checked(provider: FakeProvider, link: FakeLink) -> None:
    a = Attempt(make_lease(), provider, link, FAST)
    run = await start(a)
    await link.reached("task")
    assert (await a.handle_request(exec_req("fix"))).ok
    a.task_end(TaskEnd(attempt_id="at_test1", reason=TaskEndReason.AGENT_FAILED,
                       note="agent cmd exited with code 3: boom", steps=1))
    result = await finish(run)
    assert result.outcome == "passed"  # it fixed the machine before it crashed: the check says so
    assert result.task_end == TaskEndReason.AGENT_FAILED and result.task_note == "agent cmd exited with code 3: boom"
    assert not result.task_limit_reached


async def test_our_failure_before_the_limit_stays_an_error(provider: FakeProvider, link: FakeLink) -> None:
    a = Attempt(make_lease(), provider, link, FAST)
    run = await start(a)
    await link.reached("task")
    a.task_end(TaskEnd(attempt_id="at_test1", error="the customer model endpoint failed: ConnectError"))
    result = await finish(run)
    assert result.outcome == "error" and result.error_phase == "task"
    assert result.error is not None and "customer model" in result.error
    # The refusal of a request after the task is not a time-limit stop.
    late = await a.handle_request(exec_req("fix", "r2"))
    assert not late.ok and late.stopped is None


def test_task_ending_rows() -> None:
    limit = rules.task_ending(TaskEnd(attempt_id="a", error="exec failed: stopped"), limit_reached=True)
    assert limit == rules.TaskEnding(TaskEndReason.TIME_LIMIT, "exec failed: stopped", None)
    assert rules.task_ending(None, limit_reached=True) == rules.TaskEnding(TaskEndReason.TIME_LIMIT)
    ours = rules.task_ending(TaskEnd(attempt_id="a", error="machine gone"), limit_reached=False)
    assert ours.error == "the agent could not carry on: machine gone"
    step = rules.task_ending(TaskEnd(attempt_id="a", reason=TaskEndReason.STEP_LIMIT, note="n"), limit_reached=False)
    assert step == rules.TaskEnding(TaskEndReason.STEP_LIMIT, "n", None)
    assert rules.task_ending(TaskEnd(attempt_id="a"), False) == rules.TaskEnding(TaskEndReason.FINISHED)


async def test_a_task_whose_start_the_server_never_acknowledged_is_our_error(provider: FakeProvider,
                                                                            link: FakeLink) -> None:
    """The task began while the link was down, and no agent ever came (no status_ack, no
    request, no task_end) from a server that acknowledges statuses. Reaching the limit is then not the
    agent's failure: the attempt is `error` (retried), never `failed` with `time_limit`."""
    link.status_acks = True
    a = Attempt(make_lease(minutes=1), provider, link, FAST, seconds_per_minute=0.3)
    run = await start(a)
    await link.reached("task")
    result = await finish(run)
    assert result.outcome == "error" and result.error_phase == "task", result
    assert "the agent never started" in (result.error or "")
    assert result.task_end is None and result.check_after is None


async def test_an_agent_started_late_is_checked_and_says_the_time_it_lost(provider: FakeProvider,
                                                                           link: FakeLink) -> None:
    link.status_acks = True
    a = Attempt(make_lease(minutes=1), provider, link, FAST, seconds_per_minute=0.3)
    run = await start(a)
    await link.reached("task")
    a.agent_started(late_seconds=12.5)  # the server heard of the task from the hello, 12.5 s into it
    result = await finish(run)
    assert result.outcome == "failed" and result.task_end == TaskEndReason.TIME_LIMIT  # the agent did nothing
    assert result.metrics.task_seconds_lost == 12.5
