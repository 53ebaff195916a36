"""Takeovers on a real gh-server with a simulated runner (docs/agents.md, "Takeover"): the model agent's
action that waited out a takeover is answered `taken_over` (not its mistake) and it looks again; the
runner's link dropping mid-takeover makes the attempt our error, still assisted; an HTTP agent's requests
served by another gh-server process (PostgreSQL) wait while held. tests/startstates/test_takeover.py
drives a real runner and guest.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from agentfiles import agent_command
from sqlalchemy import select

from gh_server.agents.base import TAKEN_OVER
from gh_server.models import MachineGrant
from gh_server.settings import AgentConfig, ModelAgentConfig
from gh_wire import protocol

from .conftest import GwServer, await_for
from .modelserver import Reply, claude, member, model_server, text
from .simrunner import SimRunner
from .test_agents import AGENT_CMD, start_task
from .test_model_agent import KEY_ENV, Guest, agent

pytestmark = pytest.mark.timeout(300)


async def connect(server: GwServer) -> SimRunner:
    """A simulated runner whose hello says it takes `task_hold`."""
    _, token = server.add_runner()
    r = SimRunner(server.ws_url, token, slots=1, images=["linux-tiny"])
    r.hello.task_holds = True
    return await r.connect()


async def post(server: GwServer, path: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as c:
        return await c.post(path, headers={"Authorization": f"Bearer {server.admin_key}"})


async def test_a_model_agents_action_held_by_a_takeover_is_not_done_and_it_looks_again(
        server_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test-takeover")
    taken = threading.Event()
    replies = [claude(text("Clicking OK."), member("left_click", coordinate=[200, 150])), claude(text("Done."))]

    def script(path: str, body: dict[str, Any]) -> Reply:
        if len(replies) == 2:
            taken.wait(60)  # the person takes the machine while the model thinks
        return replies.pop(0) if len(replies) > 1 else replies[0]

    with model_server(script) as (url, seen):
        agents: dict[str, ModelAgentConfig] = agent(url, "anthropic")
        server: GwServer = server_factory(agents=agents, dead_after=300.0)
        r = await connect(server)
        guest = Guest(r)
        holds: list[protocol.TaskHold] = []
        answer = guest.handle

        async def handle(msg: Any) -> bool:
            if isinstance(msg, protocol.TaskHold):
                holds.append(msg)
                return True
            return await answer(msg)

        r.on_message = handle
        try:
            _, aid = await start_task(server, r, {}, "m")
            await await_for(lambda: len(seen.requests) == 1, what="the model's first call")
            took = await post(server, f"/v1/attempts/{aid}/takeover")
            assert took.status_code == 200, took.text
            taken.set()
            desk = server.gateway.takeovers
            left = server.gateway.task_time_left(aid)
            assert left is not None and 0 < left <= 10 * 60  # the case's default limit, 10 minutes
            await await_for(lambda: desk.waiting[aid] == 1, what="the model's click held")
            assert [q.op for q in guest.requests] == ["screen"]  # the click did not reach the machine
            assert server.gateway.task_time_left(aid) == pytest.approx(left, abs=0.01)  # its clock stopped
            back = await post(server, f"/v1/attempts/{aid}/handback")
            assert back.status_code == 200 and back.json()["ended_by"] == "handed_back", back.text
            end = await r.expect("task_end", timeout=120)
        finally:
            await r.close()
    assert end.error is None and end.reason == protocol.TaskEndReason.FINISHED and end.answer == "Done."
    assert holds == [protocol.TaskHold(attempt_id=aid, held=True), protocol.TaskHold(attempt_id=aid, held=False)]
    # Never done, and the next look is the screen after the hand-back.
    assert [q.op for q in guest.requests] == ["screen", "screen"]
    results = [b for m in seen.bodies[1]["messages"] for b in (m["content"] if isinstance(m["content"], list) else [])
               if b.get("type") == "tool_result"]
    assert len(results) == 1 and results[0].get("is_error") is True and TAKEN_OVER in json.dumps(results[0])
    assert (end.usage or {}).get("invalid") == 0  # not the model's mistake


async def test_the_runners_link_dropping_mid_takeover_is_our_error_and_stays_assisted(server_factory: Any) -> None:
    server: GwServer = server_factory(agents={}, dead_after=300.0)
    r = await connect(server)
    Guest(r)
    _, aid = await start_task(server, r, {}, "noop")
    await r.expect("task_end")  # the agent is done; the simulated runner keeps the attempt in its task
    took = await post(server, f"/v1/attempts/{aid}/takeover")
    assert took.status_code == 200, took.text
    await r.close()  # the link drops
    await await_for(lambda: server.attempt(aid).outcome == "error", what="the attempt's error", timeout=120)
    a = server.attempt(aid)
    assert a.assisted is True and [t["ended_by"] for t in a.takeovers] == ["attempt_ended"], a.takeovers
    again = await post(server, f"/v1/attempts/{aid}/takeover")
    assert again.status_code == 409 and again.json()["error"]["code"] == "not_running", again.text
    assert again.json()["error"]["outcome"] == "error"


async def test_an_http_agents_requests_to_another_process_wait_while_held_and_are_answered_at_the_hand_back(
        server_factory: Any, pg_cluster: Any) -> None:
    """Two gh-server processes on one PostgreSQL: A holds the runner and runs the agent, whose machine-API
    requests (made here with its token, as it would) land on B. B sees A's hold on the attempt's row and
    holds them before relaying anything; at the hand-back the screen is fresh, the input and exec are
    `taken_over` and spend no step."""
    url = pg_cluster.url(pg_cluster.create_db())
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        os.chmod(d, 0o777)  # the agent runs with a uid of its own (gh_server.agents.sandbox)
        out = Path(d) / "doc.json"
        agents = {"cmd": AgentConfig(id="cmd", kind="command", timeout=900,
                                     command=agent_command(AGENT_CMD, str(out), "hang"))}
        a: GwServer = server_factory(database_url=url, agents=agents, dead_after=300.0)
        b: GwServer = server_factory(database_url=url, admin_api_key=a.admin_key, dead_after=300.0)
        r = await connect(a)
        guest = Guest(r)
        try:
            _, aid = await start_task(a, r, {}, "cmd")
            doc = await await_for(lambda: out.exists() and out.stat().st_size and json.loads(out.read_text()),
                                  what="the agent's request document")
            took = await post(a, f"/v1/attempts/{aid}/takeover")
            assert took.status_code == 200, took.text
            auth = {"Authorization": f"Bearer {doc['machine']['token']}"}
            async with httpx.AsyncClient(base_url=b.base_url + "/v1/agent/machine", headers=auth, timeout=120) as c:
                screen = asyncio.ensure_future(c.get("/screen"))
                act = asyncio.ensure_future(c.post("/input", json={"events": [{"type": "key", "keys": ["A"]}]}))
                run = asyncio.ensure_future(c.post("/exec", json={"script": "true", "timeout": 5}))
                await await_for(lambda: b.gateway.takeovers.waiting[aid] == 3, what="B holding the three requests")
                assert guest.requests == [] and not any(t.done() for t in (screen, act, run))
                for route in ("takeover", "handback"):  # served where the runner is, not here
                    elsewhere = await post(b, f"/v1/attempts/{aid}/{route}")
                    assert elsewhere.status_code == 409, elsewhere.text
                    assert elsewhere.json()["error"]["code"] == "not_connected", elsewhere.text
                back = await post(a, f"/v1/attempts/{aid}/handback")
                assert back.status_code == 200 and back.json()["ended_by"] == "handed_back", back.text
                looked, acted, ran = await asyncio.gather(screen, act, run)
            assert looked.status_code == 200 and looked.content.startswith(b"\x89PNG"), looked.text
            for resp in (acted, ran):
                assert resp.status_code == 409 and resp.json()["error"]["code"] == "taken_over", resp.text
            assert [q.op for q in guest.requests] == ["screen"]  # asked after the hand-back, and only it
            with a.session() as s:
                assert list(s.scalars(select(MachineGrant.steps).where(MachineGrant.attempt_id == aid))) == [0]
        finally:
            await r.close()
