"""Frames over the websocket limit are refused to their sender, never sent.

A real gh-server and a real gh-runner daemon (its session, its websocket client with
`max_size=MAX_FRAME_BYTES`) with the provider double behind it. Before the limit was checked on
send, a 20 MB `env` made the runner's websockets client close the connection with 1009 (its
`max_size`), and a too-large answer made uvicorn (`ws_max_size`) do the same: every pending
request of every attempt on that runner failed with "disconnected before answering".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from agentfiles import agent_command
from pydantic import SecretStr
from runner.doubles import FakeProvider, ScriptedAttempt

from gh_runner.config import RunnerConfig
from gh_runner.daemon import Daemon
from gh_wire import protocol

from .conftest import AgentConfig, GwServer, await_for

AGENT_CMD = Path(__file__).with_name("agent_cmd.py")


@dataclass
class Stack:
    server: GwServer
    runner_id: str
    daemon: Daemon
    provider: FakeProvider
    docs: dict[str, Path]  # agent id -> the request document its command agent got

    def attempts(self) -> dict[str, ScriptedAttempt]:
        runs = dict(self.daemon.leases.running)
        return {aid: run.attempt for aid, run in runs.items()}  # type: ignore[misc]

    def machine_api(self, agent: str) -> tuple[str, str, str]:
        doc = json.loads(self.docs[agent].read_text())
        return doc["machine"]["url"], doc["machine"]["token"], doc["attempt_id"]

    async def relay(self, req: protocol.MachineRequest, timeout: float = 30.0) -> protocol.MachineResponse:
        loop = self.server.state.extras["loop"]
        fut = asyncio.run_coroutine_threadsafe(self.server.gateway.machine_request(self.runner_id, req, timeout), loop)
        return await asyncio.wrap_future(fut)


@pytest.fixture
async def stack(server_factory: Any) -> AsyncIterator[Stack]:
    """Two attempts in their task phase on one runner, each with a command agent that waits (so
    the test drives the machine API with the agents' own tokens)."""
    # The agents run with uids of their own (gh_server.agents.sandbox): a dir they may write to.
    writable = Path(tempfile.mkdtemp(prefix="gh-frames-docs-"))
    os.chmod(writable, 0o777)
    docs = {a: writable / f"{a}.json" for a in ("one", "two")}
    agents = {a: AgentConfig(id=a, kind="command", command=agent_command(AGENT_CMD, str(p), "hang"),
                             timeout=300) for a, p in docs.items()}
    server: GwServer = server_factory(agents=agents)
    rid, token = server.add_runner("frames")
    provider = FakeProvider()
    with tempfile.TemporaryDirectory(prefix="gh-frames-", dir="/var/tmp") as d:
        cfg = RunnerConfig(server=server.ws_url, token=SecretStr(token), name="frames", slots=2,
                           state_dir=Path(d) / "state", images_dir=Path(d) / "images", reconnect_min=0.05,
                           reconnect_max=0.4, result_resend=0.5, reap_interval=3600, drain_grace=5)
        daemon = Daemon(cfg, provider, attempt_factory=ScriptedAttempt)
        task = asyncio.create_task(daemon.run())
        try:
            server.add_run([{"name": "frames"}], agents=["one", "two"])
            st = Stack(server, rid, daemon, provider, docs)
            await await_for(lambda: all(p.is_file() and p.stat().st_size for p in docs.values()), 60,
                            "both agents started")
            await await_for(lambda: len(st.attempts()) == 2 and all(a.machine for a in st.attempts().values()),
                            30, "both attempts in their task")
            yield st
        finally:
            daemon.force_stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 60)
            shutil.rmtree(writable, ignore_errors=True)


async def test_oversized_request_is_refused_and_the_runner_connection_survives(stack: Stack) -> None:
    (aid_one, _), (aid_two, _) = sorted((aid, a) for aid, a in stack.attempts().items())
    assert stack.daemon.session.connections == 1
    # A pending request of the other attempt, in flight while the oversized one is refused.
    stack.provider.delay = 1.5
    pending = asyncio.create_task(stack.relay(protocol.MachineRequest(
        request_id="rq-pending", attempt_id=aid_two, op="exec", script="echo ok", timeout=30)))
    await await_for(lambda: any(r.request_id == "rq-pending" for r in stack.attempts()[aid_two].requests), 10,
                    "the pending request reached the runner")
    huge = protocol.MachineRequest(request_id="rq-huge", attempt_id=aid_one, op="exec", script="env",
                                   env={"BIG": "x" * (20 * 1024 * 1024)}, timeout=30)
    refused = await stack.relay(huge)
    assert not refused.ok and refused.refusal == protocol.MachineRefusal.REQUEST_TOO_LARGE
    assert "over the runner frame limit" in (refused.error or "")
    answered = await pending
    assert answered.ok and answered.stdout == "ok\n", answered.error
    stack.provider.delay = 0.0
    again = await stack.relay(protocol.MachineRequest(request_id="rq-again", attempt_id=aid_one, op="exec",
                                                      script="echo ok", timeout=30))
    assert again.ok, again.error
    assert not any(r.request_id == "rq-huge" for r in stack.attempts()[aid_one].requests)
    assert stack.daemon.session.connections == 1 and stack.daemon.session.connected


async def test_oversized_answer_is_refused_to_its_agent_and_others_keep_working(stack: Stack) -> None:
    url_one, token_one, _ = stack.machine_api("one")
    url_two, token_two, _ = stack.machine_api("two")
    async with httpx.AsyncClient(timeout=60) as http:
        # A "screenshot" whose base64 answer (and replay frame) is over the 16 MiB frame limit.
        small_png = stack.provider.png
        stack.provider.png = small_png + b"\0" * (13 * 1024 * 1024)
        stack.provider.delay = 1.5
        pending = asyncio.create_task(http.post(url_two + "/exec", json={"script": "echo ok", "timeout": 30},
                                                headers={"Authorization": f"Bearer {token_two}"}))
        big = await http.get(url_one + "/screen", headers={"Authorization": f"Bearer {token_one}"})
        assert big.status_code == 413, big.text
        assert "over the runner-server frame limit" in big.json()["error"]["message"]
        ok = await pending
        assert ok.status_code == 200 and ok.json()["stdout"] == "ok\n", ok.text
        stack.provider.png, stack.provider.delay = small_png, 0.0
        shot = await http.get(url_one + "/screen", headers={"Authorization": f"Bearer {token_one}"})
        assert shot.status_code == 200 and shot.content == small_png
    assert stack.daemon.session.connections == 1 and stack.daemon.session.connected
