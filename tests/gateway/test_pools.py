"""Model calls run off the gateway's read loop: a slow rubric judge holds up only its own attempt's result,
never the runner's other slots (their statuses, machine requests and task ends)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from typing import Any

from gh_server.settings import ModelEndpoint
from gh_wire import protocol

from .conftest import GwServer
from .fakehttp import serve
from .simrunner import SimRunner, now
from .test_agents import Machine, agent_dir, cmd_agent, connect

JUDGE_SECONDS = 30.0


async def _beat(r: SimRunner) -> None:
    """Heartbeats, as gh-runner sends them, so the gateway's dead-peer bound does not close a quiet runner."""
    while True:
        await r.send(protocol.Heartbeat(at=now(), busy=2))
        await asyncio.sleep(0.5)


async def test_slow_judge_does_not_hold_up_another_slots_agent(server_factory: Any) -> None:
    called, replied, release = threading.Event(), threading.Event(), threading.Event()

    def judge(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        # An OpenAI-compatible endpoint that takes 30 s to answer (the boundary fake the tests may use),
        # unless the test releases it early.
        called.set()
        release.wait(JUDGE_SECONDS)
        replied.set()
        return 200, {"choices": [{"message": {"content": '{"passed": true, "reason": "Fixed."}'}}]}

    with agent_dir() as d, serve(judge) as (url, _):
        server: GwServer = server_factory(judge=ModelEndpoint(base_url=url + "/v1", model="judge"),
                                          agents=cmd_agent("many", Path(d) / "doc.json"))
        r = await connect(server, slots=2)
        m = Machine(r)
        beats = asyncio.create_task(_beat(r))
        try:
            _, (judged,) = server.add_run([{"success": {"check_script": "x", "rubric": "Polite."}}])
            lease = await r.expect("lease")
            assert lease.attempt_id == judged
            await r.send(protocol.LeaseAccept(attempt_id=judged))
            _, (busy,) = server.add_run([{}], agents=["cmd"])
            lease = await r.expect("lease")
            assert lease.attempt_id == busy
            await r.send(protocol.LeaseAccept(attempt_id=busy))

            res = protocol.AttemptResult(attempt_id=judged, outcome="passed", answer="done",
                                         check_after=protocol.CheckOutput(exit_code=0, stdout_tail="True",
                                                                          verdict="True"))
            await r.send(protocol.AttemptFinished(result=res))
            assert await asyncio.to_thread(called.wait, 30), "the judge was never asked"

            # While the judge thinks, the other slot's task runs: 50 exec requests through the machine API.
            await r.status(busy, "preparing")
            await r.status(busy, "running", "task")
            end = await r.expect("task_end", timeout=JUDGE_SECONDS - 5)
            assert not replied.is_set(), "the task ended only after the judge answered"
            assert end.attempt_id == busy and end.error is None, end.error
            assert end.answer == "50 answered" and end.steps == 50
            assert [q.op for q in m.requests] == ["exec"] * 50
            release.set()  # the point is made (all 50 answered while the judge held out); spare CI the rest

            # The judged attempt's result is acked (and applied, with the verdict) once the judge answers.
            await r.expect("result_ack", timeout=JUDGE_SECONDS + 30, where=lambda a: a.attempt_id == judged)
            assert replied.is_set()
            a = server.attempt(judged)
            verdict = dict(a.judge or {})
            # The verdict also names its judge and what judging it used.
            assert verdict.pop("judge_id") == "judge" and verdict.pop("usage")["calls"] == 1
            assert a.outcome == "passed" and verdict == {"passed": True, "reason": "Fixed."}
        finally:
            release.set()
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
            await r.close()
