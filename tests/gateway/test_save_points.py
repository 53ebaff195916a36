"""Save points through the server (issue 51, docs/agents.md "Save points"): the lease carries the
case's `limits.save_point_minutes` (else the server's `save_point_minutes`) and `save_points_kept`; an
agent's `POST {machine.url}/save_point` reaches the runner and answers with the save point, spending no
step; the save points of the result are listed on the attempt."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gh_wire import protocol

from .conftest import GwServer
from .simrunner import SimRunner
from .test_agents import Machine, agent_dir, cmd_agent, connect


class SavingMachine(Machine):
    async def handle(self, msg: Any) -> bool:
        if isinstance(msg, protocol.MachineRequest) and msg.op == "save_point":
            self.requests.append(msg)
            point = protocol.SavePoint(save_point_id=f"sp-{msg.attempt_id}-1", step=1,
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
            assert end.answer == f"save_point 200 sp-{aid}-1 step 1"
            assert [q.op for q in m.requests] == ["exec", "save_point"]
            assert end.steps == 1  # the save point spent none
            await r.status(aid, "checking")
            point = protocol.SavePoint(save_point_id=f"sp-{aid}-1", step=1,
                                       created_at=datetime(2026, 12, 5, 23, 0, tzinfo=UTC), bytes=123_456)
            await r.finish(aid, "passed", save_points=[point])
            assert server.attempt(aid).save_points == [
                {"save_point_id": f"sp-{aid}-1", "step": 1, "created_at": "2026-12-05T23:00:00Z", "bytes": 123_456}]
        finally:
            await r.close()


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
