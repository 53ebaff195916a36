"""On the server's side, the agent's failures end its task with a typed reason and no error (the check after
decides); our side's failures (the machine, the customer model) stay errors (docs/agents.md, "What ends a task,
and what is an error"). The runner is simulated (tests/gateway/simrunner.py); the agents are the real built-ins, a
real command agent process (agent_cmd.py) and a real HTTP server (fakehttp.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gh_server.serialize import attempt as shape
from gh_server.settings import AgentConfig
from gh_wire import protocol

from .conftest import GwServer, await_for
from .fakehttp import serve
from .simrunner import now
from .test_agents import Machine, _alive, agent_dir, cmd_agent, connect, start_task

LIMIT_REFUSAL = "stopped before it finished: the task reached its limit of 1 minute"


class StoppingMachine:
    """Answers every machine request the way the runner does once limits.minutes has stopped the task."""

    def __init__(self, r: Any, stopped: protocol.TaskEndReason | None) -> None:
        self.r, self.stopped = r, stopped
        r.on_message = self.handle

    async def handle(self, msg: Any) -> bool:
        if not isinstance(msg, protocol.MachineRequest):
            return False
        error = LIMIT_REFUSAL if self.stopped else "guest agent is not answering"
        await self.r.send(protocol.MachineResponse(request_id=msg.request_id, ok=False, error=error,
                                                   stopped=self.stopped))
        return True


async def test_reference_stopped_mid_exec_by_the_limit_ends_the_task(server: GwServer) -> None:
    r = await connect(server)
    StoppingMachine(r, protocol.TaskEndReason.TIME_LIMIT)
    try:
        _, aid = await start_task(server, r, {"metadata": {"reference_fix": "sleep 100"}}, "reference")
        end = await r.expect("task_end")
        assert end.attempt_id == aid and end.error is None
        assert end.reason == protocol.TaskEndReason.TIME_LIMIT and LIMIT_REFUSAL in (end.note or "")
    finally:
        await r.close()


async def test_step_limit_ends_the_task_and_stops_the_agent(server_factory: Any) -> None:
    with agent_dir() as d:
        out = Path(d) / "doc.json"
        server: GwServer = server_factory(agents=cmd_agent("steps", out))
        r = await connect(server)
        Machine(r)
        try:
            await start_task(server, r, {"limits": {"minutes": 5, "steps": 2}}, "cmd")
            end = await r.expect("task_end", timeout=60)
            assert end.error is None and end.reason == protocol.TaskEndReason.STEP_LIMIT
            assert end.steps == 2 and "step limit (2)" in (end.note or "")
            pid = json.loads(out.read_text())["pid"]
            await await_for(lambda: not _alive(pid), what="agent process stopped at the step limit")
        finally:
            await r.close()


async def test_agent_that_gives_up_after_the_machine_failed_is_our_error(server_factory: Any) -> None:
    with agent_dir() as d:
        server: GwServer = server_factory(agents=cmd_agent("exec-fail", Path(d) / "doc.json"))
        r = await connect(server)
        StoppingMachine(r, None)  # a refusal that is the machine's failure, not a stop
        try:
            await start_task(server, r, {}, "cmd")
            end = await r.expect("task_end", timeout=60)
            assert end.error is not None and "guest agent is not answering" in end.error
            assert "exited with code 4" in end.error
        finally:
            await r.close()


async def test_command_agent_stopped_mid_exec_is_not_an_error(server_factory: Any) -> None:
    with agent_dir() as d:
        server: GwServer = server_factory(agents=cmd_agent("exec-fail", Path(d) / "doc.json"))
        r = await connect(server)
        StoppingMachine(r, protocol.TaskEndReason.TIME_LIMIT)  # the machine API answers 409: the task is over
        try:
            await start_task(server, r, {}, "cmd")
            end = await r.expect("task_end", timeout=60)
            assert end.error is None and end.reason == protocol.TaskEndReason.AGENT_FAILED
            assert "exec answered 409" in (end.note or "")
        finally:
            await r.close()


async def test_http_agent_answering_500_is_its_failure(server_factory: Any) -> None:
    def reply(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 500, {"detail": "model overloaded"}

    with serve(reply) as (url, _seen):
        server: GwServer = server_factory(agents={"web": AgentConfig(id="web", kind="http", url=url + "/act")})
        r = await connect(server)
        try:
            await start_task(server, r, {}, "web")
            end = await r.expect("task_end", timeout=60)
            assert end.error is None and end.reason == protocol.TaskEndReason.AGENT_FAILED
            assert "answered HTTP 500" in (end.note or "")
        finally:
            await r.close()


async def test_result_notes_why_the_task_ended_and_is_not_retried(server: GwServer) -> None:
    r = await connect(server)
    try:
        run_id, aid = await start_task(server, r, {}, "noop")
        await r.expect("task_end")
        res = protocol.AttemptResult(
            attempt_id=aid, outcome="failed",
            check_before=protocol.CheckOutput(exit_code=0, stdout_tail="False", verdict="False"),
            check_after=protocol.CheckOutput(exit_code=0, stdout_tail="False", verdict="False"),
            task_limit_reached=True, task_end=protocol.TaskEndReason.TIME_LIMIT,
            task_note="exec on the machine failed: " + LIMIT_REFUSAL, started_at=now(), finished_at=now())
        await r.send(protocol.AttemptFinished(result=res))
        await r.expect("result_ack")
        await await_for(lambda: server.run(run_id).status == "completed", what="run completed")
        a = server.attempt(aid)
        assert a.outcome == "failed" and a.error is None
        assert a.metrics is not None and a.metrics["task_end"] == {"reason": "time_limit",
                                                                   "note": res.task_note}
        assert a.metrics["error_phase"] is None
        assert len(server.attempts_of(run_id)) == 1  # not retried
        assert shape(a, None, "http://x")["task_end"]["reason"] == "time_limit"
    finally:
        await r.close()
