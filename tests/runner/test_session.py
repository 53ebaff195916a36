"""The session against a real websocket peer: hello, heartbeats, dead peer, reconnect, revocation."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from kit.net import free_port
from structlog.testing import capture_logs

from gh_common.backoff import Backoff
from gh_runner import __version__
from gh_wire.protocol import CLOSE_REPLACED, CLOSE_TOKEN_REVOKED, PROTOCOL_VERSION, TaskEnd

from .doubles import FakeProvider
from .peer import Peer, make_lease


async def test_hello_says_who_the_runner_is(peer: Peer, start_daemon: Any) -> None:
    provider = FakeProvider(images=("linux-tiny", "win10-22h2"))
    provider.held = [("ss_abc", 3)]
    await start_daemon(peer.url, provider=provider, slots=3)
    hello = await peer.wait_type("hello")
    assert hello.protocol == PROTOCOL_VERSION
    assert hello.version == __version__
    assert hello.name == "test-runner"
    assert hello.labels == ["lab", "lenovo"]
    assert hello.slots == 3
    assert [(i.name, i.os, i.version) for i in hello.images] == [
        ("linux-tiny", "linux", "2026.11.1"), ("win10-22h2", "linux", "2026.11.1")]
    assert all(i.checksum.startswith("sha256:") for i in hello.images)
    assert [(s.start_state_id, s.version) for s in hello.start_states] == [("ss_abc", 3)]
    assert hello.in_flight == []
    assert peer.auth_headers[0] == f"Bearer {peer.token}"


async def test_hello_after_reconnect_lists_attempts_in_flight(peer: Peer, start_daemon: Any) -> None:
    await start_daemon(peer.url)
    await peer.wait_type("hello")
    await peer.send(make_lease("at_inflight1"))
    await peer.wait_type("lease_accept")
    await peer.close_current(1001, "restarting")
    hello2 = await peer.wait_for(lambda r: r.conn == 2 and r.msg.type == "hello")
    assert hello2.msg.in_flight == ["at_inflight1"]


async def test_heartbeats_both_ways_carry_busy(peer: Peer, start_daemon: Any) -> None:
    await start_daemon(peer.url)
    await peer.wait_type("hello")
    start = len(peer.received)
    await peer.wait_type("heartbeat", start=start)
    await peer.send(make_lease("at_hb1"))
    await peer.wait_type("lease_accept")
    hb = await peer.wait_type("heartbeat", where=lambda m: m.busy == 1)
    assert hb.slots == 2
    # Several in a row at about the interval the welcome asked for (0.2 s): not one-off.
    n0 = len(peer.of_type("heartbeat"))
    await peer.wait_until(lambda: len(peer.of_type("heartbeat")) >= n0 + 3, timeout=30)
    times = [r.at for r in peer.received if r.msg.type == "heartbeat"][-3:]
    assert times[-1] - times[0] >= 0.2  # paced, not a burst
    # The runner is still up after many server heartbeats (it reads them without answering errors).
    assert peer.connections == 1


async def test_silent_server_is_declared_dead_and_runner_reconnects(peer: Peer, start_daemon: Any) -> None:
    peer.dead_after = 1.0
    r = await start_daemon(peer.url)
    await peer.wait_type("hello")
    # Control: while the server's heartbeats flow, the session outlives the bound several times over
    # (the runner beats every 0.2 s, so 15 of its beats span about 3 s).
    await peer.wait_until(lambda: len(peer.of_type("heartbeat")) >= 15)
    assert peer.received[-1].at - peer.received[0].at > 2.0
    assert r.daemon.session.connections == 1
    peer.silent = True
    t0 = time.monotonic()
    await peer.wait_for(lambda r: r.conn == 2 and r.msg.type == "hello", timeout=30)
    elapsed = time.monotonic() - t0
    assert elapsed >= 1.0, "declared dead before the bound"
    assert elapsed < 20, "took far longer than the bound to notice"
    assert r.daemon.session.connections == 2


async def test_reconnects_after_server_closes(peer: Peer, start_daemon: Any) -> None:
    await start_daemon(peer.url)
    await peer.wait_type("hello")
    await peer.close_current(4004, "server shutting down")
    await peer.wait_for(lambda r: r.conn == 2 and r.msg.type == "hello")


async def test_reconnects_after_server_dies_and_comes_back(peer: Peer, start_daemon: Any) -> None:
    await start_daemon(peer.url)
    await peer.wait_type("hello")
    port = peer.port
    peer.kill()  # no close frame, no listener
    await asyncio.sleep(0)  # let the abort reach the runner before the new listener exists
    await peer.start(port)
    await peer.wait_for(lambda r: r.conn == 2 and r.msg.type == "hello", timeout=60)


def test_backoff_grows_is_capped_and_jittered() -> None:
    seq = iter([0.0, 1.0] * 50)
    b = Backoff(base=1.0, cap=30.0, jitter=True, rng=lambda: next(seq))
    delays = [b.next_delay() for _ in range(12)]
    # Ceilings 1, 2, 4, 8, 16, 30, 30...; jitter 0 gives half the ceiling, 1 the whole.
    assert delays[:6] == [0.5, 2.0, 2.0, 8.0, 8.0, 30.0]
    assert max(delays) == 30.0 and min(delays[5:]) == 15.0
    b.reset()
    assert b.next_delay() == 0.5


async def test_reconnect_delays_grow_and_cap_against_a_dead_address(start_daemon: Any) -> None:
    # Nothing listens on this port: every dial fails at once; record the waits instead of sleeping.
    port = free_port()
    delays: list[float] = []
    enough = asyncio.Event()

    async def fake_sleep(d: float) -> None:
        delays.append(d)
        if len(delays) >= 10:
            enough.set()
        await asyncio.sleep(0)

    r = await start_daemon(f"ws://127.0.0.1:{port}/v1/runners/connect", session_sleep=fake_sleep,
                           reconnect_min=1.0, reconnect_max=16.0)
    await asyncio.wait_for(enough.wait(), 30)
    ceilings = [1, 2, 4, 8, 16, 16, 16, 16, 16, 16]
    for d, c in zip(delays, ceilings, strict=False):
        assert c / 2 <= d <= c
    assert len(set(delays)) > 5, "no jitter"
    assert max(delays) <= 16.0
    assert r.daemon.session.connections == 0


async def test_revoked_token_stops_hot_retrying_and_says_so_once(peer: Peer, start_daemon: Any) -> None:
    peer.close_on_connect = CLOSE_TOKEN_REVOKED
    delays: list[float] = []
    third = asyncio.Event()

    async def fake_sleep(d: float) -> None:
        delays.append(d)
        if len(delays) >= 3:
            third.set()
        await asyncio.sleep(0)

    with capture_logs() as logs:
        await start_daemon(peer.url, session_sleep=fake_sleep, revoked_retry=900.0)
        await asyncio.wait_for(third.wait(), 30)
    assert delays[:3] == [900.0, 900.0, 900.0]
    lines = [e for e in logs if "revoked" in e["event"]]
    assert len(lines) == 1, lines
    assert lines[0]["log_level"] == "error"
    assert "issue a new runner token" in lines[0]["event"]
    assert peer.token not in str(logs)


async def test_http_401_at_handshake_counts_as_revoked(peer: Peer, start_daemon: Any) -> None:
    peer.http_status = 401
    delays: list[float] = []
    got = asyncio.Event()

    async def fake_sleep(d: float) -> None:
        delays.append(d)
        got.set()
        await asyncio.sleep(3600)

    with capture_logs() as logs:
        await start_daemon(peer.url, session_sleep=fake_sleep, revoked_retry=777.0)
        await asyncio.wait_for(got.wait(), 30)
    assert delays == [777.0]
    assert any("HTTP 401" in e["event"] for e in logs)


async def test_replaced_session_is_retried_with_backoff_not_slowly(peer: Peer, start_daemon: Any) -> None:
    peer.close_on_connect = CLOSE_REPLACED
    delays: list[float] = []
    got = asyncio.Event()

    async def fake_sleep(d: float) -> None:
        delays.append(d)
        if len(delays) >= 2:
            got.set()
        await asyncio.sleep(0)

    await start_daemon(peer.url, session_sleep=fake_sleep, reconnect_min=0.1, reconnect_max=1.0)
    await asyncio.wait_for(got.wait(), 30)
    assert all(d <= 1.0 for d in delays)


@pytest.mark.parametrize("scheme_url,insecure,ok", [
    ("ws://127.0.0.1:1/x", False, True),
    ("ws://localhost:1/x", False, True),
    ("ws://10.0.0.5:1/x", False, False),
    ("ws://10.0.0.5:1/x", True, True),
    ("wss://gh.example.com", False, True),
])
def test_cleartext_only_to_loopback_unless_insecure(tmp_path: Any, scheme_url: str, insecure: bool, ok: bool) -> None:
    from gh_runner.config import ConfigError

    from .conftest import runner_config

    cfg = runner_config(scheme_url, tmp_path, insecure=insecure)
    if ok:
        cfg.check_transport()
    else:
        with pytest.raises(ConfigError, match="--insecure"):
            cfg.check_transport()


async def test_a_failing_handler_costs_one_connection_not_the_session(peer: Peer) -> None:
    from gh_runner.session import Session
    from gh_wire.protocol import Heartbeat, Hello, Welcome

    class Handler:
        hellos = 0
        disconnects: list[str] = []

        async def make_hello(self) -> Hello:
            Handler.hellos += 1
            if Handler.hellos == 1:
                raise RuntimeError("inventory exploded")
            return Hello(version="t", name="h", slots=1)

        async def on_welcome(self, welcome: Welcome) -> None: ...
        async def on_message(self, msg: Any) -> None: ...

        def heartbeat(self) -> Heartbeat:
            return Heartbeat(at=datetime.now(UTC))

        def on_disconnected(self, reason: str) -> None:
            Handler.disconnects.append(reason)

        def on_reconnect_scheduled(self, failures: int, delay: float) -> None: ...

    session = Session(peer.url, peer.token, Handler(), backoff=Backoff(base=0.05, cap=0.1, jitter=True))
    task = asyncio.create_task(session.keep_connected())
    try:
        await peer.wait_type("hello")
        assert Handler.disconnects == ["runner error on the session: RuntimeError: inventory exploded"]
        assert session.connections == 2
    finally:
        session.stop()
        await asyncio.wait_for(task, 30)


async def test_images_that_fail_to_list_are_listed_again_when_a_lease_needs_one(peer: Peer, start_daemon: Any) -> None:
    class Flaky(FakeProvider):
        calls = 0

        async def list_images(self) -> list[Any]:
            Flaky.calls += 1
            if Flaky.calls <= 2:  # start-up and the first hello
                raise RuntimeError("images dir unreadable right now")
            return await super().list_images()

    await start_daemon(peer.url, provider=Flaky())
    hello = await peer.wait_type("hello")
    assert hello.images == []  # advertised none (and logged why) rather than failing the session
    await peer.send(make_lease("at_after_flaky"))
    await peer.wait_type("lease_accept")


async def test_a_runner_whose_server_dies_moves_to_the_next_and_its_attempt_goes_on(peer: Peer,
                                                                                      start_daemon: Any) -> None:
    other = Peer()
    await other.start()
    try:
        r = await start_daemon(f"{peer.url},{other.url}")
        await peer.wait_type("hello")
        await peer.send(make_lease("at_failover1"))
        await peer.wait_type("lease_accept")
        await peer.wait_type("attempt_status", where=lambda m: m.status == "running")
        peer.kill()  # the first gh-server process dies: no close frame
        hello = await other.wait_type("hello", timeout=10)  # reconnect_max is 0.4 s here
        assert hello.in_flight == ["at_failover1"]
        assert r.daemon.session.url == other.url
        await other.send(TaskEnd(attempt_id="at_failover1", answer="fixed"))
        await other.wait_until(lambda: "at_failover1" in other.applied)
        assert other.applied["at_failover1"].outcome == "passed"
        assert other.result_copies == {"at_failover1": 1} and peer.result_copies == {}
    finally:
        other.kill()
        await other.stop()
