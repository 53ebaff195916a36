"""No way out of the score, at the server (docs/agents.md, "What counts against whom"): a hostile command agent
(tests/e2e/agents/hostile.py, run for real in gh-server's sandbox) does one hostile thing through the machine API
or in its answer, against a real gh-server and a simulated runner. Each ends its task without an `error`: the
agent sees a 4xx (or 200), or its task ends as `agent_failed` with a typed fault. None reaches the runner as a
request the guest could choke on. tests/e2e/test_escape.py runs a few on the real guest; bench/escape.py all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agentfiles import agent_command

from gh_server.settings import AgentConfig, ModelEndpoint
from gh_wire import protocol
from gh_wire.vocab import AgentFault

from .conftest import GwServer
from .fakehttp import chat_reply, serve
from .test_agents import Machine, agent_dir, cmd_agent, connect, start_task

HOSTILE = Path(__file__).parents[1] / "e2e" / "agents" / "hostile.py"


def hostile(mode: str) -> dict[str, AgentConfig]:
    return {"evil": AgentConfig(id="evil", kind="command", command=agent_command(HOSTILE, mode), timeout=300)}


async def _task(server_factory: Any, mode: str, **kw: Any) -> tuple[protocol.TaskEnd, Machine]:
    server: GwServer = server_factory(agents=hostile(mode), dead_after=300.0, **kw)
    r = await connect(server)
    m = Machine(r)
    try:
        await start_task(server, r, {}, "evil")
        end = await r.expect("task_end", timeout=240)
    finally:
        await r.close()
    return end, m


@pytest.mark.parametrize(("mode", "fault"), [
    ("answer-nul", AgentFault.ANSWER_HAS_NUL),
    ("answer-long", AgentFault.ANSWER_TOO_LONG),  # 99,000 x U+65E5: 297 KB, over Linux's 128 KiB
    ("answer-bytes", AgentFault.ANSWER_NOT_UTF8),
    ("answer-endless", AgentFault.ANSWER_TOO_LONG),  # stopped at 1 MiB, its process group killed
])
async def test_an_answer_that_breaks_its_contract_is_agent_failed(server_factory: Any, mode: str,
                                                                  fault: AgentFault) -> None:
    end, _ = await _task(server_factory, mode)
    assert end.error is None, end.error
    assert end.reason == protocol.TaskEndReason.AGENT_FAILED and end.fault == fault, end
    assert end.answer == ""  # withheld: no check is asked to carry it


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("mode", "expected"), [
    ("input-10mb", {413}),  # over the server's body limit, answered before it is read
    ("input-unknown-key", {200, 400}),  # an unknown event type or key: 400 (the key's refusal is the runner's)
    ("input-offscreen", {200, 400}),  # on the tablet's range: clamped to the screen; past it: 400
    ("input-100k-events", {400}),
    ("exec-nul-script", {400}),
    ("exec-nul-env", {400}),
    ("ask-nul", {400}),
    ("approval-flood", {200, 429}),
    ("screen-8-threads", {200, 429}),
])
async def test_the_machine_api_answers_hostile_requests_with_4xx(server_factory: Any, mode: str,
                                                                 expected: set[int]) -> None:
    end, m = await _task(server_factory, mode)
    assert end.error is None and end.reason == protocol.TaskEndReason.FINISHED, end
    statuses = {int(k) for k in json.loads(end.answer)["statuses"]}
    assert statuses <= expected, statuses
    for q in m.requests:  # nothing the guest cannot carry reached the runner
        assert "\x00" not in (q.script or "") and all("\x00" not in v for v in (q.env or {}).values())
        assert len(q.events or []) <= 100


async def test_exec_with_a_nul_never_reaches_the_runner(server_factory: Any) -> None:
    end, m = await _task(server_factory, "exec-nul-script")
    assert json.loads(end.answer)["statuses"] == {"400": 1} and m.requests == []


@pytest.mark.timeout(300)
async def test_an_ask_flood_is_answered_or_held_back_never_an_error(server_factory: Any) -> None:
    with serve(chat_reply("Yes, it works now.")) as (url, _seen):
        end, _ = await _task(server_factory, "ask-flood",
                             customer_model=ModelEndpoint(base_url=url + "/v1", model="cust"))
    assert end.error is None and end.reason == protocol.TaskEndReason.FINISHED, end
    statuses = json.loads(end.answer)["statuses"]
    assert set(statuses) <= {"200", "429"} and "200" in statuses, statuses


class KilledUnderItsExec(Machine):
    """A runner whose guest channel died under the agent's own exec while the guest runs on."""

    async def handle(self, msg: Any) -> bool:
        if isinstance(msg, protocol.MachineRequest) and msg.op == "exec":
            self.requests.append(msg)
            await self.r.send(protocol.MachineResponse(
                request_id=msg.request_id, ok=False, refusal=protocol.MachineRefusal.CHANNEL_LOST_IN_EXEC,
                error="the guest channel failed while this script ran; the guest still runs"))
            return True
        return await super().handle(msg)


async def test_an_agent_that_kills_the_channel_under_its_exec_then_gives_up_is_agent_failed(
        server_factory: Any) -> None:
    """Not the `502, then gave up` of a machine failing under the agent (ours): its own script did it."""
    with agent_dir() as d:
        server: GwServer = server_factory(agents=cmd_agent("exec-fail", Path(d) / "doc.json"))
        r = await connect(server)
        KilledUnderItsExec(r)
        try:
            await start_task(server, r, {}, "cmd")
            end = await r.expect("task_end", timeout=60)
        finally:
            await r.close()
    assert end.error is None, end.error
    assert end.reason == protocol.TaskEndReason.AGENT_FAILED and "exec answered 422" in (end.note or "")
