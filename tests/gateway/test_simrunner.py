"""The simulated runner measures the protocol, not the host's load: it keeps itself alive from a loop
of its own while the test's loop is busy, as a live gh-runner does from its own process."""

from __future__ import annotations

import asyncio
import threading
import time

from gh_wire import protocol

from .conftest import GwServer
from .simrunner import SimRunner, now


async def test_a_busy_test_loop_does_not_silence_the_simulated_runner(server: GwServer) -> None:
    # CI met it: a test's synchronous database write on a loaded host held the test's loop past the
    # dead-peer bound (3 s here), and the server closed the runner 4008 in a test about cancels.
    _, token = server.add_runner()
    r = await SimRunner(server.ws_url, token, slots=1).connect()
    try:
        assert r.welcome is not None
        time.sleep(r.welcome.dead_after + 1.5)  # noqa: ASYNC251 (the point: the test's loop blocked, as by a slow synchronous call)
        await r.sync()  # the session is still up: a round trip is answered
        assert not r.closed.is_set()
    finally:
        await r.close()


async def test_a_runner_that_does_not_answer_is_still_closed_at_the_bound(server: GwServer) -> None:
    _, token = server.add_runner()
    r = await SimRunner(server.ws_url, token, slots=1, answer_heartbeats=False).connect()
    try:
        assert await r.wait_closed(timeout=30) == protocol.CLOSE_HEARTBEAT_TIMEOUT
    finally:
        await r.close()



async def test_a_frame_that_arrived_while_the_servers_loop_was_held_is_not_silence(server: GwServer) -> None:
    # The server's own side of the same load: its loop held past the bound runs the dead-peer timer and
    # the runner's frame in one pass. The timer used to win and close a live runner 4008.
    _, token = server.add_runner()
    r = await SimRunner(server.ws_url, token, slots=1, answer_heartbeats=False).connect()
    try:
        assert r.welcome is not None
        loop = server.state.extras["loop"]
        held = threading.Event()
        loop.call_soon_threadsafe(lambda: (held.set(), time.sleep(r.welcome.dead_after + 1.0)))
        assert await asyncio.to_thread(held.wait, 10)
        await r.send(protocol.Heartbeat(at=now(), slots=1))  # arrives while the server's loop is held
        await r.sync()
        assert not r.closed.is_set()
    finally:
        await r.close()
