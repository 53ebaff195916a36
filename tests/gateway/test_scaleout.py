"""Several real gh-server processes on one PostgreSQL: any process answers any machine-API request
(grants are rows, machine requests are relayed through PostgreSQL to the process holding the runner)."""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gh_runner import protocol
from gh_server.settings import AgentConfig

from .conftest import DbRows
from .procs import ServerProc, admin_key, free_port
from .simrunner import SimRunner
from .test_agents import AGENT_CMD, Machine


@pytest.fixture
def pg_url(pg_cluster: Any) -> str:
    url: str = pg_cluster.url(pg_cluster.create_db())
    return url


@pytest.fixture
def rows(pg_url: str) -> Iterator[DbRows]:
    r = DbRows(pg_url)
    yield r
    r.engine.dispose()


async def test_agent_requests_to_the_other_process_reach_the_runner(pg_url: str, rows: DbRows) -> None:
    key = admin_key()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        out = Path(d) / "doc.json"
        b_port = free_port()
        agents = {"cmd": AgentConfig(id="cmd", kind="command", timeout=120,
                                     command=[sys.executable, str(AGENT_CMD), str(out), "work"])}
        # Process A holds the runner and runs the agent; the agent is told B's URL, as a load balancer
        # could send it anywhere: every one of its requests lands on the process without the runner.
        a = ServerProc(pg_url, key, name="a", agents=agents, public_url=f"http://127.0.0.1:{b_port}")
        b = ServerProc(pg_url, key, name="b", port=b_port)
        try:
            a.start()
            b.start()
            _, token = rows.add_runner("held-by-a")
            r = await SimRunner(a.ws_url, token, slots=1, images=["linux-tiny"]).connect()
            m = Machine(r)
            try:
                _, (aid,) = rows.add_run([{"limits": {"minutes": 5, "steps": 2}}], agents=["cmd"])
                lease = await r.expect("lease")
                assert lease.attempt_id == aid
                await r.send(protocol.LeaseAccept(attempt_id=aid))
                await r.status(aid, "preparing")
                await r.status(aid, "running", "task")
                end = await r.expect("task_end", timeout=60)
                assert end.error is None, end.error
                assert end.answer == "fixed: host-1 (exit 0)"
                assert end.steps == 2  # counted in the grants table by process B
                assert [q.op for q in m.requests] == ["screen", "input", "exec"]
                doc = json.loads(out.read_text())
                assert doc["machine"]["url"] == b.base_url + "/v1/agent/machine"
                # The token is dead on every process once the task is over.
                async with httpx.AsyncClient(timeout=30) as c:
                    for srv in (a, b):
                        resp = await c.get(srv.base_url + "/v1/agent/machine/screen",
                                           headers={"Authorization": f"Bearer {doc['machine']['token']}"})
                        assert resp.status_code == 401, (srv.name, resp.text)
            finally:
                await r.close()
        finally:
            a.close()
            b.close()
