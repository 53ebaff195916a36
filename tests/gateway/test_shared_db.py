"""Two gh-server instances on one database share the work: each leases only to its own runners, the
status-guarded UPDATEs keep any attempt from being leased twice, and liveness crosses processes."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update

from gh_server.models import Runner, WebhookDelivery
from gh_wire import protocol

from .conftest import GwServer, await_for
from .simrunner import SimRunner


@pytest.fixture(params=["sqlite", "postgres"])
def pair(request: pytest.FixtureRequest, server_factory: Any) -> tuple[GwServer, GwServer]:
    if request.param == "sqlite":
        first: GwServer = server_factory()
        second: GwServer = server_factory(data_dir=first.state.settings.data_dir,
                                          admin_api_key=first.state.settings.admin_api_key)
        return first, second
    cluster = request.getfixturevalue("pg_cluster")
    url = cluster.url(cluster.create_db())
    a: GwServer = server_factory(database_url=url)
    b: GwServer = server_factory(database_url=url, admin_api_key=a.state.settings.admin_api_key)
    return a, b


async def test_two_servers_share_one_run_without_double_leases(pair: tuple[GwServer, GwServer]) -> None:
    one, two = pair
    async with httpx.AsyncClient(timeout=30) as c:  # so completing the run enqueues its webhook
        resp = await c.put(one.base_url + "/v1/webhook", headers={"Authorization": f"Bearer {one.admin_key}"},
                           json={"url": "http://127.0.0.1:9/nowhere", "events": ["test_run.completed"]})
        assert resp.status_code == 200, resp.text
    leases: list[str] = []
    runners = []
    tasks: set[asyncio.Task[Any]] = set()  # held so they are not collected mid-flight
    for srv, name in ((one, "r1"), (one, "r2"), (two, "r3"), (two, "r4")):
        _, token = one.add_runner(name)
        r = SimRunner(srv.ws_url, token, name=name, slots=3, images=["linux-tiny"])

        def on(msg: Any, r: SimRunner = r) -> bool:
            if isinstance(msg, protocol.Lease):
                leases.append(msg.attempt_id)
                tasks.add(asyncio.create_task(r.finish(msg.attempt_id, "passed")))
                return True
            return False

        r.on_message = on
        runners.append(await r.connect())
    try:
        run_id, ids = one.add_run([{}] * 10, tries=4)  # 40 attempts; server two only hears of them by polling
        await await_for(lambda: one.run(run_id).status == "completed", timeout=120, what="run completed")
        assert sorted(leases) == sorted(ids)  # every attempt leased exactly once, across both servers
        rows = one.attempts_of(run_id)
        assert len(rows) == 40 and all(a.outcome == "passed" for a in rows)
        by_runner = {a.runner_id for a in rows}
        assert len(by_runner) >= 2
        # Both servers saw the run finish; one completed it and one webhook went out.
        with one.session() as s:
            events = s.scalars(select(WebhookDelivery).where(WebhookDelivery.event_type == "test_run.completed"))
            assert [e.payload["data"]["test_run"]["test_run_id"] for e in events] == [run_id]
    finally:
        for r in runners:
            await r.close()


async def test_connecting_to_another_server_replaces_the_session(pair: tuple[GwServer, GwServer]) -> None:
    one, two = pair
    rid, token = one.add_runner("hopper")
    a = await SimRunner(one.ws_url, token, name="hopper").connect()
    b = await SimRunner(two.ws_url, token, name="hopper").connect()
    try:
        # Server one learns of the takeover from the row at its next liveness write (every 0.5 s here).
        assert await a.wait_closed(timeout=15) == protocol.CLOSE_REPLACED
        await b.sync()
        assert not b.closed.is_set()
        assert one.runner_row(rid).session_id == two.gateway.conns[rid].session_id  # server two holds it
    finally:
        await a.close()
        await b.close()


async def test_runner_deleted_through_other_server_is_closed(pair: tuple[GwServer, GwServer]) -> None:
    one, two = pair
    rid, token = one.add_runner()
    r = await SimRunner(two.ws_url, token).connect()
    try:
        with one.session() as s:  # what DELETE /v1/runners/{id} on server one leaves in the shared rows
            s.execute(update(Runner).where(Runner.id == rid).values(revoked_at=protocol.datetime.now().astimezone()))
            s.commit()
        assert await r.wait_closed(timeout=15) == protocol.CLOSE_TOKEN_REVOKED
    finally:
        await r.close()
