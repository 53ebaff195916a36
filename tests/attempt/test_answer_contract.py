"""An answer the guest cannot carry (gh_wire.answer) ends the task as `agent_failed` with its typed fault,
decided by the runner before the check after: the check runs with an empty answer (file and variable)
and decides; the attempt is never an `error` and never retried. The runner holds this whatever sent
the task_end (the server checks the same first)."""

from __future__ import annotations

import pytest

from gh_runner.attempt import Attempt
from gh_wire.answer import ANSWER_MAX_CHARS
from gh_wire.protocol import TaskEnd, TaskEndReason
from gh_wire.vocab import AgentFault

from .fakes import FakeLink, FakeProvider, make_lease
from .test_lifecycle import FAST, finish, start


@pytest.mark.parametrize(("answer", "fault"), [
    ("fixed it\x00really", AgentFault.ANSWER_HAS_NUL),
    ("日" * (ANSWER_MAX_CHARS + 1), AgentFault.ANSWER_TOO_LONG),
    ("half a pair \ud800", AgentFault.ANSWER_NOT_UTF8),
])
async def test_answer_breaking_its_contract_is_the_agents_failure(provider: FakeProvider, link: FakeLink,
                                                                  answer: str, fault: AgentFault) -> None:
    a = Attempt(make_lease(), provider, link, FAST)
    run = await start(a)
    await link.reached("task")
    a.task_end(TaskEnd(attempt_id="at_test1", answer=answer, steps=2))
    result = await finish(run)
    assert result.outcome == "failed", result.error  # the check (nothing fixed) decides: not an error
    assert result.task_end == TaskEndReason.AGENT_FAILED and result.task_fault == fault
    assert result.answer == ""
    after = provider.machines[0].scripts_run[-1][1]
    assert after["GH_CHECK_PHASE"] == "after" and after["GH_AGENT_ANSWER"] == ""
    assert provider.machines[0].files[after["GH_AGENT_ANSWER_FILE"]] == ""


async def test_answer_at_the_limit_reaches_the_check_whole(provider: FakeProvider, link: FakeLink) -> None:
    answer = "😀" * ANSWER_MAX_CHARS  # the worst case: 2 UTF-16 units and 4 UTF-8 bytes each
    a = Attempt(make_lease(), provider, link, FAST)
    run = await start(a)
    await link.reached("task")
    a.task_end(TaskEnd(attempt_id="at_test1", answer=answer))
    result = await finish(run)
    assert result.task_end == TaskEndReason.FINISHED and result.task_fault is None
    after = provider.machines[0].scripts_run[-1][1]
    assert after["GH_AGENT_ANSWER"] == answer
    assert provider.machines[0].files[after["GH_AGENT_ANSWER_FILE"]] == answer
