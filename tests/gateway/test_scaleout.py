"""Several real gh-server processes on one PostgreSQL: any process answers any machine-API request
(grants are rows, machine requests are relayed through PostgreSQL to the process holding the runner)."""

from __future__ import annotations

import json
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from agentfiles import agent_command
from kit.net import free_port
from sqlalchemy import select

from gh_server.models import WebhookDelivery
from gh_server.settings import AgentConfig
from gh_wire import protocol

from .conftest import await_for
from .fakehttp import serve
from .procs import ServerProc, admin_key
from .rows import DbRows
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
        os.chmod(d, 0o777)  # the agent runs with a uid of its own (gh_server.agents.sandbox)
        out = Path(d) / "doc.json"
        b_port = free_port()
        agents = {"cmd": AgentConfig(id="cmd", kind="command", timeout=120,
                                     command=agent_command(AGENT_CMD, str(out), "work"))}
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


async def test_step_limit_reached_on_the_other_process_ends_the_task(pg_url: str, rows: DbRows) -> None:
    """The step limit on several processes: the step past limits.steps is refused by process B (the agent's
    machine URL), and process A, which runs the agent, ends the task there with reason step_limit and
    stops the agent (it would otherwise carry on for ten minutes)."""
    key = admin_key()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        os.chmod(d, 0o777)  # the agent runs with a uid of its own (gh_server.agents.sandbox)
        out = Path(d) / "doc.json"
        b_port = free_port()
        agents = {"cmd": AgentConfig(id="cmd", kind="command", timeout=900,
                                     command=agent_command(AGENT_CMD, str(out), "steps"))}
        a = ServerProc(pg_url, key, name="a", agents=agents, public_url=f"http://127.0.0.1:{b_port}")
        b = ServerProc(pg_url, key, name="b", port=b_port)
        pid = 0
        try:
            a.start()
            b.start()
            _, token = rows.add_runner("limited")
            r = await SimRunner(a.ws_url, token, slots=1, images=["linux-tiny"]).connect()
            m = Machine(r)
            try:
                _, (aid,) = rows.add_run([{"limits": {"minutes": 10, "steps": 2}}], agents=["cmd"])
                assert (await r.expect("lease")).attempt_id == aid
                await r.send(protocol.LeaseAccept(attempt_id=aid))
                await r.status(aid, "preparing")
                await r.status(aid, "running", "task")
                end = await r.expect("task_end", timeout=60)
                assert end.attempt_id == aid and end.error is None, end.error
                assert end.reason == protocol.TaskEndReason.STEP_LIMIT and "step limit (2)" in (end.note or "")
                assert end.steps == 2 and [q.op for q in m.requests] == ["input", "input"]
                doc = json.loads(out.read_text())
                pid = doc["pid"]
                assert doc["machine"]["url"] == b.base_url + "/v1/agent/machine"
                await await_for(lambda: not _alive(pid), what="agent process stopped at the step limit")
            finally:
                await r.close()
        finally:
            if pid and _alive(pid):
                os.kill(pid, signal.SIGKILL)
            a.close()
            b.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_sigkilled_server_loses_nothing(pg_url: str, rows: DbRows) -> None:
    """A gh-server SIGKILLed mid-task: the runner moves to the other process, which ends the lost agent's
    task as an error (retried), completes the run, and delivers its webhook once."""
    key = admin_key()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d, serve(lambda p, b: (200, {})) as (hook_url, hooks):
        os.chmod(d, 0o777)  # the agent runs with a uid of its own (gh_server.agents.sandbox)
        out = Path(d) / "doc.json"
        agents = {"cmd": AgentConfig(id="cmd", kind="command", timeout=900,
                                     command=agent_command(AGENT_CMD, str(out), "hang-once"))}
        # A grace period the runner's move is sure to fit in on a loaded host: this is the path where it
        # comes back (the one where it does not is the scheduler's expire_disconnected, tested alone).
        a = ServerProc(pg_url, key, name="a", agents=agents, runner_grace_seconds=30)
        b = ServerProc(pg_url, key, name="b", agents=agents, runner_grace_seconds=30)
        first_agent = 0
        try:
            a.start()
            b.start()
            async with httpx.AsyncClient(timeout=30) as c:
                resp = await c.put(b.base_url + "/v1/webhook", headers={"Authorization": f"Bearer {key}"},
                                   json={"url": hook_url + "/hook", "events": ["test_run.completed"]})
                assert resp.status_code == 200, resp.text
            _, token = rows.add_runner("moves")
            r = await SimRunner(a.ws_url, token, slots=1, images=["linux-tiny"]).connect()
            run_id, (aid,) = rows.add_run([{}], agents=["cmd"])
            assert (await r.expect("lease")).attempt_id == aid
            await r.send(protocol.LeaseAccept(attempt_id=aid))
            await r.status(aid, "preparing")
            await r.status(aid, "running", "task")
            doc = await await_for(lambda: out.exists() and out.stat().st_size and json.loads(out.read_text()),
                                  what="agent started on a")
            first_agent = doc["pid"]

            a.kill()
            await r.wait_closed()
            # gh-runner's session dials the next server with the same hello (tests/runner: failover).
            r2 = await SimRunner(b.ws_url, token, slots=1, images=["linux-tiny"], in_flight=[aid]).connect()
            try:
                assert r2.welcome is not None and r2.welcome.resume == [aid]
                end = await r2.expect("task_end", where=lambda m: m.attempt_id == aid)
                assert "agent was lost" in (end.error or "")
                await r2.finish(aid, "error", error=end.error, check_after=None)
                retry = await r2.expect("lease")
                await r2.send(protocol.LeaseAccept(attempt_id=retry.attempt_id))
                await r2.status(retry.attempt_id, "preparing")
                await r2.status(retry.attempt_id, "running", "task")
                end2 = await r2.expect("task_end", where=lambda m: m.attempt_id == retry.attempt_id, timeout=60)
                assert end2.error is None and end2.answer == "done on the retry"
                await r2.finish(retry.attempt_id, "passed")
                await await_for(lambda: rows.run(run_id).status == "completed", what="run completed")
                attempts = rows.attempts_of(run_id)
                assert [(x.outcome, x.retry_of) for x in attempts] == [("error", None), ("passed", aid)]
                def recorded() -> list[tuple[str, int]]:  # written after the receiver answered
                    with rows.session() as s:
                        return [(w.id, w.attempts) for w in s.scalars(select(WebhookDelivery)
                                                                      .where(WebhookDelivery.delivered_at.is_not(None)))]

                delivered = await await_for(recorded, what="webhook delivered and recorded")
                assert [body["id"] for _, body in hooks] == [i for i, _ in delivered]  # once per event id
                assert [n for _, n in delivered] == [1]
            finally:
                await r2.close()
            await r.close()
        finally:
            if first_agent and _alive(first_agent):  # its server was killed, so nobody else reaps it
                os.kill(first_agent, signal.SIGKILL)
            a.close()
            b.close()
