"""The scale-out topology with the real runner: PostgreSQL, 3 gh-server processes behind HAProxy, one real
gh-runner with a linux-tiny guest dialing the proxy, and an external agent whose machine-API requests
the proxy spreads over the processes (most land on one that does not hold the runner's websocket and
are relayed through PostgreSQL)."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest
from agentfiles import agent_command
from gateway.topology import Topology
from guidinghand import Eager
from kit.libvirt import domains
from kit.scratch import traversable_tmpdir
from server.pg import start_cluster

from .procs import Runner

pytestmark = pytest.mark.timeout(900)

AGENT_CMD = Path(__file__).resolve().parents[1] / "gateway" / "agent_cmd.py"
CHECK = 'if [ "$GH_CHECK_PHASE" = before ]; then echo False; else echo True; fi'


def test_real_runner_behind_haproxy_serves_an_agent_spread_over_three_processes(images_dir: Path) -> None:
    cluster = start_cluster()
    work = traversable_tmpdir("gh-e2e-scale-")  # libvirt-qemu must traverse it to reach the overlays in the state dir
    state_dir = work / "runner-state"
    state_dir.mkdir(mode=0o755)
    name = "scale" + secrets.token_hex(3)
    topo: Topology | None = None
    runner: Runner | None = None
    out = work / "agent-out"
    out.mkdir()
    out.chmod(0o777)  # the agent runs with a uid of its own (gh_server.agents.sandbox)
    try:
        agents = {"cmd": {"id": "cmd", "kind": "command", "timeout": 300,
                          "command": agent_command(AGENT_CMD, str(out / "doc.json"), "work")}}
        topo = Topology(cluster.url(cluster.create_db()), 3, agents=agents, runner_grace_seconds=60).start()
        with Eager(api_key=topo.key, base_url=topo.proxy.url, timeout=60) as client:
            token = client.runners.create(name)["token"]
            runner = Runner(topo.proxy.url, token, name, images_dir, state_dir, slots=1)
            case = client.test_cases.create("Agent through the load balancer", "My hostname looks wrong",
                                            "linux-tiny", {"check_script": CHECK}, setup_script="true",
                                            limits={"minutes": 5})
            run = client.test_runs.create(test_case_ids=[case["test_case_id"]], agents=["cmd"], repeat=1)
            done = client.test_runs.wait(run["test_run_id"], timeout=600, poll_interval=2)
            assert done["status"] == "completed"
            (attempt,) = client.test_runs.list_all_attempts(run["test_run_id"])
            assert attempt["outcome"] == "passed", attempt.get("error")
            assert str(attempt["metrics"]["steps"]) == "2"  # input + exec, counted in the grants table
        relayed = sum(_relayed(s.base_url, topo.key) for s in topo.servers)
        assert relayed >= 1  # at least one of the agent's 3 requests crossed processes
    finally:
        if runner is not None:
            runner.stop(timeout=120)
        if topo is not None:
            topo.close()
        cluster.stop()
        deadline = time.monotonic() + 30
        while domains(f"gh-{name}-") and time.monotonic() < deadline:
            time.sleep(0.5)
        import shutil

        shutil.rmtree(work, ignore_errors=True)


def _relayed(base_url: str, key: str) -> float:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(base_url + "/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=30).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == "gh_server_machine_requests_relayed_total" and s.labels.get("direction") == "served")
