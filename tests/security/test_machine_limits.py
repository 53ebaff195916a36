"""The machine API's limits hold before a request reaches the runner: exec env (64 entries, 64 KB),
input events (100), and requests in flight per token (429 past `machine_api_max_in_flight`)."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import httpx
from agentfiles import agent_command
from gateway.conftest import GwServer, await_for
from gateway.simrunner import SimRunner

from gh_server.settings import AgentConfig
from gh_wire import protocol

AGENT_CMD = Path(__file__).parent.parent / "gateway" / "agent_cmd.py"


class HeldMachine:
    """Answers screen at once and holds every exec until `release` is set; counts what reached it."""

    def __init__(self, r: SimRunner) -> None:
        self.r = r
        self.release = asyncio.Event()
        self.execs = 0
        self.inputs = 0
        self.tasks: list[asyncio.Task[None]] = []
        r.on_message = self.handle

    async def handle(self, msg: Any) -> bool:
        if not isinstance(msg, protocol.MachineRequest):
            return False
        if msg.op == "exec":
            self.execs += 1
            self.tasks.append(asyncio.create_task(self._answer_later(msg)))  # the reader must go on meanwhile
        else:
            self.inputs += msg.op == "input"
            await self.r.send(protocol.MachineResponse(request_id=msg.request_id, ok=True))
        return True

    async def _answer_later(self, msg: protocol.MachineRequest) -> None:
        await self.release.wait()
        await self.r.send(protocol.MachineResponse(request_id=msg.request_id, ok=True, exit_code=0, stdout="",
                                                   stderr=""))


async def _task_with_token(srv: GwServer, r: SimRunner, out: Path) -> tuple[str, str]:
    """A task whose command agent hangs (agent_cmd.py hang), so the test can use its machine token."""
    _, (aid,) = srv.add_run([{}], agents=["cmd"])
    lease = await r.expect("lease")
    await r.send(protocol.LeaseAccept(attempt_id=aid))
    await r.status(aid, "preparing")
    await r.status(aid, "running", "task")
    doc = await await_for(lambda: out.exists() and out.stat().st_size and json.loads(out.read_text()),
                          what="agent started")
    assert lease.attempt_id == aid
    return doc["machine"]["url"], doc["machine"]["token"]


async def test_machine_api_limits(server_factory: Any) -> None:
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o777)  # the agent runs as its own uid
        out = Path(d) / "doc.json"
        srv: GwServer = server_factory(machine_api_max_in_flight=2, agents={"cmd": AgentConfig(
            id="cmd", kind="command", command=agent_command(AGENT_CMD, str(out), "hang"), timeout=120)})
        _, token = srv.add_runner()
        r = await SimRunner(srv.ws_url, token, slots=1, images=["linux-tiny"]).connect()
        m = HeldMachine(r)
        try:
            url, tok = await _task_with_token(srv, r, out)
            auth = {"Authorization": f"Bearer {tok}"}
            async with httpx.AsyncClient(timeout=60, headers=auth) as c:
                # env: entries, then bytes; the 400 names the field and the limit; nothing reaches the runner
                resp = await c.post(url + "/exec", json={"script": "true", "env": {f"V{i}": "x" for i in range(65)}})
                assert resp.status_code == 400 and "env" in resp.json()["error"]["message"]
                assert "64" in resp.json()["error"]["message"]
                resp = await c.post(url + "/exec", json={"script": "true", "env": {"BIG": "x" * (64 * 1024)}})
                assert resp.status_code == 400 and "65,536" in resp.json()["error"]["message"]
                events = [{"type": "type", "text": "a"}] * 101
                resp = await c.post(url + "/input", json={"events": events})
                assert resp.status_code == 400 and "events" in resp.json()["error"]["message"]
                assert m.execs == 0 and m.inputs == 0
                # in flight: two held execs, the third is refused at once; once they finish, it works again
                held = [asyncio.create_task(c.post(url + "/exec", json={"script": "true", "timeout": 30}))
                        for _ in range(2)]
                await await_for(lambda: m.execs == 2, what="two execs at the runner")
                third = await c.post(url + "/exec", json={"script": "true", "timeout": 30})
                assert third.status_code == 429, third.text
                assert third.json()["error"]["type"] == "rate_limit" and third.headers["retry-after"] == "1"
                assert m.execs == 2
                m.release.set()
                assert [(await t).status_code for t in held] == [200, 200]
                again = await c.post(url + "/exec", json={"script": "true", "env": {f"V{i}": "x" for i in range(64)},
                                                          "timeout": 30})
                assert again.status_code == 200 and m.execs == 3
        finally:
            await r.close()
