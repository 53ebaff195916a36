"""Connecting: the token, hello -> the runner row, welcome, heartbeats, replacement, bad frames."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import websockets
from sqlalchemy import select

from gh_server.models import ReplayFrame as ReplayRow
from gh_wire import protocol

from .conftest import GwServer, await_for, stop_server
from .simrunner import SimRunner, now
from .test_agents import tiny_png


async def test_bad_token_is_closed_4001(server: GwServer) -> None:
    r = SimRunner(server.ws_url, "gh_rn_not-a-token")
    await r.connect(send_hello=False)
    assert await r.wait_closed() == protocol.CLOSE_TOKEN_REVOKED
    await r.close()


async def test_missing_token_is_closed_4001(server: GwServer) -> None:
    async with websockets.connect(server.ws_url, open_timeout=30) as ws:
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 30)
        assert ws.close_code == protocol.CLOSE_TOKEN_REVOKED


async def test_hello_updates_runner_row_and_welcome(server: GwServer) -> None:
    rid, token = server.add_runner("lab-1")
    r = await SimRunner(server.ws_url, token, name="lab-1", slots=4, labels=["lab", "lenovo"],
                        images=["linux-tiny"], held=[("ss_abc", 2)]).connect()
    try:
        assert r.welcome is not None
        assert r.welcome.runner_id == rid
        assert r.welcome.heartbeat_interval == 0.5 and r.welcome.dead_after == 3.0
        row = server.runner_row(rid)
        assert row.slots == 4 and row.labels == ["lab", "lenovo"] and row.version == "sim-1"
        assert [i["name"] for i in row.images] == ["linux-tiny"]
        assert row.held_versions == [{"start_state_id": "ss_abc", "version": 2}]
        assert row.session_id and row.connected_at and row.last_seen_at and row.disconnected_at is None
        # The server heartbeats on its own.
        hb = await r.expect("heartbeat", timeout=10)
        assert hb.at is not None
    finally:
        await r.close()
    await await_for(lambda: server.runner_row(rid).disconnected_at is not None, what="disconnect recorded")
    assert server.runner_row(rid).session_id is None


async def test_second_connection_replaces_first_with_4003(server: GwServer) -> None:
    _, token = server.add_runner()
    a = await SimRunner(server.ws_url, token).connect()
    b = await SimRunner(server.ws_url, token).connect()
    try:
        assert await a.wait_closed() == protocol.CLOSE_REPLACED
        await b.send(protocol.Heartbeat(at=now(), busy=0))
        await b.expect("heartbeat", timeout=10)
        assert not b.closed.is_set()
    finally:
        await a.close()
        await b.close()


async def test_frames_a_replaced_connection_had_received_are_all_handled(server: GwServer,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner that crashed and came back: what its old socket had already received is handled before the
    new hello is reconciled, though the old connection was still busy with the first of it when that came."""
    runner_id, token = server.add_runner()
    first = await SimRunner(server.ws_url, token, images=["linux-tiny"]).connect()
    second = SimRunner(server.ws_url, token, images=["linux-tiny"])
    gate = threading.Event()
    try:
        _, (aid,) = server.add_run([{}])
        await first.expect("lease")
        await first.send(protocol.LeaseAccept(attempt_id=aid))
        await first.status(aid, "preparing")
        await first.status(aid, "running", "task")
        await await_for(lambda: server.attempt(aid).status == "running", what="the attempt running")
        old = server.gateway.conns[runner_id]
        old_session = old.session_id
        dispatch = server.gateway._dispatch

        async def busy_with_the_first_frame(conn: Any, msg: Any) -> None:
            # A loaded server: the old connection is still on its first frame, the others wait in its socket.
            if conn.session_id == old_session and isinstance(msg, protocol.ReplayFrame) and msg.seq == 0:
                await asyncio.get_running_loop().run_in_executor(None, gate.wait, 30)
            await dispatch(conn, msg)
        monkeypatch.setattr(server.gateway, "_dispatch", busy_with_the_first_frame)
        for seq in range(3):
            await first.send(protocol.ReplayFrame(attempt_id=aid, seq=seq, at=now(), label="exec", png_b64=tiny_png()))
        second.hello.in_flight = [aid]
        back = asyncio.create_task(second.connect())
        # The new hello has come (code before the drain closed the old connection at once).
        await await_for(lambda: getattr(old, "replaced", False) or old.closed.is_set(), what="the new hello")
        gate.set()
        await back
        assert await first.wait_closed() == protocol.CLOSE_REPLACED

        def stored() -> list[int]:
            with server.session() as s:
                return list(s.scalars(select(ReplayRow.seq).where(ReplayRow.attempt_id == aid).order_by(ReplayRow.seq)))
        await await_for(lambda: stored() == [0, 1, 2], what="the three frames stored")
        assert server.attempt(aid).status == "running"  # the new connection goes on with it
    finally:
        gate.set()
        await first.close()
        await second.close()


async def test_silent_runner_is_closed_after_dead_after(server: GwServer) -> None:
    rid, token = server.add_runner()
    r = SimRunner(server.ws_url, token, answer_heartbeats=False)
    await r.connect()
    # We never send anything after hello: the server must give up after dead_after (3 s here).
    code = await r.wait_closed(timeout=30)
    assert code == protocol.CLOSE_HEARTBEAT_TIMEOUT
    await r.close()
    await await_for(lambda: server.runner_row(rid).session_id is None, what="session cleared")


async def test_malformed_frames_get_error_replies_and_session_survives(server: GwServer) -> None:
    _, token = server.add_runner()
    r = await SimRunner(server.ws_url, token).connect()
    try:
        await r.send_raw("{not json")
        e1 = await r.expect("error")
        assert e1.code == "bad_json"
        await r.send_raw('{"type": "teleport"}')
        e2 = await r.expect("error")
        assert e2.code == "unknown_type"
        await r.send_raw('{"type": "lease_accept"}')
        e3 = await r.expect("error")
        assert e3.code == "bad_message" and "attempt_id" in e3.message
        await r.send_raw(b"\x00\x01")
        e4 = await r.expect("error")
        assert e4.code == "bad_message"
        await r.send_raw("[1, 2]")
        assert (await r.expect("error")).code == "bad_message"
        # A second hello is refused, not a crash.
        await r.send(r.hello)
        assert (await r.expect("error")).ref_type == "hello"
        # Still alive: the server keeps heartbeating.
        await r.expect("heartbeat", timeout=10)
        assert not r.closed.is_set()
    finally:
        await r.close()


async def test_first_frame_must_be_hello(server: GwServer) -> None:
    _, token = server.add_runner()
    r = SimRunner(server.ws_url, token)
    await r.connect(send_hello=False)
    await r.send(protocol.LeaseAccept(attempt_id="at_x"))
    err = await r.expect("error")
    assert "hello" in err.message
    assert await r.wait_closed() == 1008
    await r.close()


async def test_unsupported_protocol_is_closed_4002(server: GwServer) -> None:
    _, token = server.add_runner()
    r = SimRunner(server.ws_url, token)
    r.hello = r.hello.model_copy(update={"protocol": 99})
    await r.connect(send_hello=False)
    await r.send(r.hello)
    assert await r.wait_closed() == protocol.CLOSE_PROTOCOL_UNSUPPORTED
    await r.close()


async def test_server_shutdown_closes_runners_and_marks_them_offline(server_factory: Any) -> None:
    server: GwServer = server_factory()
    rid, token = server.add_runner()
    r = await SimRunner(server.ws_url, token).connect()
    try:
        assert server.runner_row(rid).session_id
        await asyncio.to_thread(stop_server, server)
        # uvicorn may close the socket itself (1012) before the app's own 4004: both say "come back later".
        assert await r.wait_closed() in (1012, protocol.CLOSE_SERVER_SHUTDOWN)
        row = server.runner_row(rid)
        assert row.session_id is None and row.disconnected_at is not None
    finally:
        await r.close()


async def test_machine_request_timeout_and_disconnect(server: GwServer) -> None:
    rid, token = server.add_runner()
    r = await SimRunner(server.ws_url, token).connect()
    loop = server.state.extras["loop"]
    assert isinstance(loop, asyncio.AbstractEventLoop)

    def ask(timeout: float) -> Any:
        req = protocol.MachineRequest(request_id=f"rq_{timeout}", attempt_id="at_x", op="screen")
        return asyncio.run_coroutine_threadsafe(server.gateway.machine_request(rid, req, timeout), loop)

    try:
        resp = await asyncio.wrap_future(ask(0.5))
        assert not resp.ok and resp.timed_out and "did not answer within 0.5 s" in (resp.error or "")
        pending = ask(60.0)
        got = await r.expect("machine_request", where=lambda m: m.request_id == "rq_60.0")
        assert got.op == "screen"
        t0 = asyncio.get_running_loop().time()
        await r.close()
        resp = await asyncio.wrap_future(pending)
        assert not resp.ok and "disconnected before answering" in (resp.error or "")
        assert asyncio.get_running_loop().time() - t0 < 30
        resp = await asyncio.wrap_future(ask(5.0))
        assert not resp.ok and "not connected" in (resp.error or "")
    finally:
        await r.close()
