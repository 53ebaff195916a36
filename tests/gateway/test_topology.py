"""The real topology, short: PostgreSQL, 3 gh-server processes behind HAProxy, simulated runners speaking
the real protocol through the proxy, and an agent whose machine-API requests the proxy spreads over the
processes. (bench/scale_out.py runs the long version, with processes and runners killed.)"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import httpx
from agentfiles import agent_command
from prometheus_client.parser import text_string_to_metric_families

from gh_server.settings import AgentConfig
from gh_wire import protocol

from .conftest import await_for
from .loadrunner import LoadRunner
from .rows import DbRows
from .simrunner import SimRunner
from .test_agents import AGENT_CMD, Machine
from .topology import Topology


def leases_of(base_url: str, key: str) -> float:
    text = httpx.get(base_url + "/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=30).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "gh_server_leases_total":
                return float(s.value)
    raise AssertionError("no gh_server_leases_total")


async def test_three_processes_behind_haproxy_share_a_run_and_answer_an_agent(pg_cluster: Any) -> None:
    url = pg_cluster.url(pg_cluster.create_db())
    rows = DbRows(url)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        os.chmod(d, 0o777)  # the agent runs with a uid of its own (gh_server.agents.sandbox)
        out = Path(d) / "doc.json"
        agents = {"cmd": AgentConfig(id="cmd", kind="command", timeout=120,
                                     command=agent_command(AGENT_CMD, str(out), "work"))}
        topo = await asyncio.to_thread(lambda: Topology(url, 3, agents=agents).start())
        runners: list[LoadRunner] = []
        try:
            for i in range(6):
                _, token = rows.add_runner(f"load-{i}")
                lr = LoadRunner(topo.proxy.ws_url, token, f"load-{i}", slots=4)
                lr.start()
                runners.append(lr)
            for lr in runners:
                await asyncio.wait_for(lr.connected.wait(), 30)
            run_id, ids = rows.add_run([{}] * 30, tries=10)  # 300 attempts
            await await_for(lambda: rows.run(run_id).status == "completed", timeout=240, what="run completed")
            attempts = rows.attempts_of(run_id)
            assert len(attempts) == 300 and all(a.outcome == "passed" for a in attempts)
            leased = sum((lr.leases for lr in runners), start=type(runners[0].leases)())
            assert sorted(leased) == sorted(ids) and set(leased.values()) == {1}  # each leased once
            acked = sum((lr.acked for lr in runners), start=type(runners[0].acked)())
            assert sorted(acked) == sorted(ids) and set(acked.values()) == {1}
            per_process = [leases_of(s.base_url, topo.key) for s in topo.servers]
            assert sum(per_process) == 300 and sum(1 for n in per_process if n) >= 2, per_process

            # An agent told the proxy's URL: its requests land on any process, the runner is on one.
            rid, token = rows.add_runner("with-agent")
            r = await SimRunner(topo.proxy.ws_url, token, slots=1, images=["linux-tiny"]).connect()
            m = Machine(r)
            try:
                _, (aid,) = rows.add_run([{}], agents=["cmd"], pin=rid)
                assert (await r.expect("lease", timeout=60)).attempt_id == aid
                await r.send(protocol.LeaseAccept(attempt_id=aid))
                await r.status(aid, "preparing")
                await r.status(aid, "running", "task")
                end = await r.expect("task_end", timeout=60)
                assert end.error is None and end.answer == "fixed: host-1 (exit 0)", end
                assert [q.op for q in m.requests] == ["screen", "input", "exec"]
                assert json.loads(out.read_text())["machine"]["url"] == topo.proxy.url + "/v1/agent/machine"
            finally:
                await r.close()
        finally:
            for lr in runners:
                await lr.kill()
            await asyncio.to_thread(topo.close)
            rows.engine.dispose()
