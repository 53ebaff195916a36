"""A machine request for an attempt whose lease is still pulling its version here is answered
`machine_away`, not as a failure. That lease is a lost runner's attempt going on here from a save point in
the registry: the server moved the attempt to this runner as it sent the lease, so its agent's requests
come here while the pull runs (seconds to minutes for a desktop's memory). Away, the server asks again
until the machine is made; a plain refusal ("not running on this runner") was a machine failure that the
agent was told (502) and that made its giving up our error."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from gh_wire.protocol import MachineRefusal, MachineRequest, StartStateRef

from .peer import Peer, make_lease


class HeldPull:
    """gh_runner.library.Library as the daemon uses it, with a pull that runs until the test lets it end."""

    prefix = "lab"
    auth_failed = False
    registry = SimpleNamespace(url="http://127.0.0.1:9", host="127.0.0.1:9")

    def __init__(self) -> None:
        self.pulling = asyncio.Event()
        self.pulled = asyncio.Event()

    async def check(self) -> str | None:
        return None

    async def acquire(self, start_state_id: str, version: int, image: str, image_checksum: str | None,
                      held: bool | None = None) -> float:
        self.pulling.set()
        await self.pulled.wait()
        return 1.0

    def release(self, start_state_id: str, version: int) -> None:
        pass

    async def close(self) -> None:
        pass


async def test_a_request_while_its_lease_pulls_the_save_point_is_away_not_failed(peer: Peer,
                                                                                  start_daemon: Any) -> None:
    library = HeldPull()
    await start_daemon(peer.url, library=library)
    await peer.wait_type("hello")
    lease = make_lease("at_moved")
    lease.start_state = StartStateRef(kind="state", image="linux-tiny", start_state_id="ss_movedp1", version=1)
    await peer.send(lease)
    await asyncio.wait_for(library.pulling.wait(), 10)

    await peer.send(MachineRequest(request_id="rq1", attempt_id="at_moved", op="exec", script="true", timeout=10))
    resp = await peer.wait_type("machine_response", where=lambda m: m.request_id == "rq1")
    assert not resp.ok and resp.refusal is MachineRefusal.AWAY, resp
    # Only the attempt being pulled for: any other is still not running here, a plain refusal.
    await peer.send(MachineRequest(request_id="rq2", attempt_id="at_elsewhere", op="screen"))
    resp = await peer.wait_type("machine_response", where=lambda m: m.request_id == "rq2")
    assert not resp.ok and resp.refusal is None and "not running on this runner" in str(resp.error), resp

    library.pulled.set()
    await peer.wait_type("lease_accept", where=lambda m: m.attempt_id == "at_moved")


async def test_a_request_for_an_attempt_not_here_is_typed_for_a_server_that_reads_it(peer: Peer,
                                                                                     start_daemon: Any) -> None:
    # A request can reach this runner before the lease of an attempt the server moved here: typed, the
    # server asks again while the attempt's row says it runs here (gh_server/agents/base.py).
    peer.not_here_refusals = True
    await start_daemon(peer.url)
    await peer.wait_type("hello")
    await peer.wait_type("heartbeat")  # sent once welcomed: the welcome's flag is read
    await peer.send(MachineRequest(request_id="rq3", attempt_id="at_on_its_way", op="exec", script="true",
                                   timeout=10))
    resp = await peer.wait_type("machine_response", where=lambda m: m.request_id == "rq3")
    assert not resp.ok and resp.refusal is MachineRefusal.NOT_HERE, resp
