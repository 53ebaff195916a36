"""Save points through the server (issue 51, docs/agents.md "Save points"): the lease carries the
case's `limits.save_point_minutes` (else the server's `save_point_minutes`) and `save_points_kept`; an
agent's `POST {machine.url}/save_point` reaches the runner and answers with the save point, spending no
step; the save points of the result are listed on the attempt."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from gh_wire import protocol

from .conftest import GwServer
from .simrunner import SimRunner
from .test_agents import Machine, agent_dir, cmd_agent, connect


class SavingMachine(Machine):
    async def handle(self, msg: Any) -> bool:
        if isinstance(msg, protocol.MachineRequest) and msg.op == "save_point":
            self.requests.append(msg)
            point = protocol.SavePoint(save_point_id=f"ss_{(msg.attempt_id or '')[3:]}p1", step=1,
                                       created_at=datetime(2026, 12, 5, 23, 0, tzinfo=UTC), bytes=123_456)
            await self.r.send(protocol.MachineResponse(request_id=msg.request_id, ok=True, save_point=point))
            return True
        return await super().handle(msg)


async def test_an_agent_asks_for_a_save_point_and_the_attempt_lists_it(server_factory: Any) -> None:
    with agent_dir() as d:
        server: GwServer = server_factory(agents=cmd_agent("save_point", Path(d) / "doc.json"),
                                          save_point_minutes=30, save_points_kept=2)
        r: SimRunner = await connect(server)
        m = SavingMachine(r)
        try:
            _, (aid,) = server.add_run([{"limits": {"minutes": 120, "save_point_minutes": 20}}], agents=["cmd"])
            lease = await r.expect("lease")
            assert lease.case.limits.save_point_minutes == 20 and lease.save_points_kept == 2  # the case's wins
            await r.send(protocol.LeaseAccept(attempt_id=aid))
            await r.status(aid, "preparing")
            await r.status(aid, "running", "task")
            end = await r.expect("task_end", timeout=60)
            assert end.error is None, end.error
            assert end.answer == f"save_point 200 ss_{aid[3:]}p1 step 1"
            assert [q.op for q in m.requests] == ["exec", "save_point"]
            assert end.steps == 1  # the save point spent none
            await r.status(aid, "checking")
            point = protocol.SavePoint(save_point_id=f"ss_{aid[3:]}p1", step=1,
                                       created_at=datetime(2026, 12, 5, 23, 0, tzinfo=UTC), bytes=123_456)
            await r.finish(aid, "passed", save_points=[point])
            assert server.attempt(aid).save_points == [
                {"save_point_id": f"ss_{aid[3:]}p1", "step": 1, "created_at": "2026-12-05T23:00:00Z", "bytes": 123_456,
                 "task_seconds": None, "registry_ref": None}]
            await fork_and_run_from_it(server, r, aid, f"ss_{aid[3:]}p1")
        finally:
            await r.close()


async def fork_and_run_from_it(server: GwServer, r: SimRunner, aid: str, sp_id: str) -> None:
    """POST .../save_points/{id}/start_state: a start state of the save point's id, ready at once at version
    1 on the attempt's runner; a case on it is leased there with that version (the runner starts the
    machine from the save point: tests/attempt/test_qemu_save_point.py)."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30,
                                 headers={"Authorization": f"Bearer {server.admin_key}"}) as c:
        assert (await c.post(f"/v1/attempts/{aid}/save_points/ss_nope/start_state")).status_code == 404
        assert (await c.post(f"/v1/attempts/at_nope/save_points/{sp_id}/start_state")).status_code == 404
        made = await c.post(f"/v1/attempts/{aid}/save_points/{sp_id}/start_state", json={"name": "at step 1"})
        assert made.status_code == 200, made.text
        ss = made.json()
        assert (ss["start_state_id"], ss["status"], ss["version"], ss["method"]) == (sp_id, "ready", 1, "save_point")
        assert ss["name"] == "at step 1" and ss["image"] == "linux-tiny" and ss["metadata"]["step"] == 1
        again = await c.post(f"/v1/attempts/{aid}/save_points/{sp_id}/start_state")
        assert again.status_code == 200 and again.json()["start_state_id"] == sp_id  # made once
        versions = (await c.get(f"/v1/start_states/{sp_id}/versions")).json()["data"]
        assert [(v["version"], v["size_bytes"]) for v in versions] == [(1, 123_456)]
        case = await c.post("/v1/test_cases", json={"name": "from step 1", "prompt": "p", "start_state": sp_id,
                                                    "success": {"check_script": "echo True"}})
        assert case.status_code == 200, case.text
        run = await c.post("/v1/test_runs", json={"test_case_ids": [case.json()["test_case_id"]], "agents": ["noop"]})
        assert run.status_code == 200, run.text
    lease = await r.expect("lease")
    assert (lease.start_state.kind, lease.start_state.start_state_id, lease.start_state.version) == ("state", sp_id, 1)


async def test_the_servers_save_point_minutes_is_the_default(server_factory: Any) -> None:
    server: GwServer = server_factory(save_point_minutes=30)
    r = await connect(server)
    try:
        server.add_run([{"limits": {"minutes": 120}}], agents=["noop"])
        lease = await r.expect("lease")
        assert lease.case.limits.save_point_minutes == 30 and lease.save_points_kept == 3
    finally:
        await r.close()


async def test_no_save_points_unless_asked(server: GwServer) -> None:
    r = await connect(server)
    try:
        server.add_run([{}], agents=["noop"])
        lease = await r.expect("lease")
        assert lease.case.limits.save_point_minutes is None and lease.save_points_kept == 3
    finally:
        await r.close()


def test_a_cases_save_point_minutes_is_stored_and_shown_only_when_set(server: GwServer) -> None:
    import httpx

    h = {"Authorization": f"Bearer {server.admin_key}"}
    body = {"name": "long", "prompt": "p", "start_state": "linux-tiny", "success": {"check_script": "echo True"}}
    with httpx.Client(base_url=server.base_url, headers=h, timeout=30) as c:
        made = c.post("/v1/test_cases", json={**body, "limits": {"minutes": 60, "save_point_minutes": 15}})
        assert made.status_code == 200, made.text
        assert made.json()["limits"] == {"minutes": 60, "steps": None, "save_point_minutes": 15}
        plain = c.post("/v1/test_cases", json=body).json()
        assert plain["limits"] == {"minutes": 10, "steps": None}
        bad = c.post("/v1/test_cases", json={**body, "limits": {"save_point_minutes": 0}})
        assert bad.status_code == 400 and "save_point_minutes" in bad.text


def test_gh_runner_local_takes_the_save_point_settings(tmp_path: Path) -> None:
    from gh_local.local import load_server_config

    cfg = tmp_path / "server.yaml"
    cfg.write_text("save_point_minutes: 30\nsave_points_kept: 5\n")
    assert load_server_config(cfg) == {"save_point_minutes": 30, "save_points_kept": 5}
    cfg.write_text("save_points_kept: 0\n")
    with pytest.raises(ValueError, match="save_points_kept"):
        load_server_config(cfg)
