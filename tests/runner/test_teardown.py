"""Teardown off the critical path: a slot frees once the result is journaled, the
machine's destroy finishes in the background, and a crash in between is reaped at the next start.
Also what the hello says about the hot pool.

The real `Attempt` runs here (the daemon's default factory) on the provider double, whose destroy
waits on a gate so the test holds a machine "being destroyed" for as long as it needs.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from gh_runner.journal import Journal
from gh_runner.leases import default_attempt_factory
from gh_wire.protocol import TaskEnd
from providers.base import MachineSource

from .doubles import FakeProvider
from .peer import Peer, make_lease


async def test_slot_frees_before_the_destroy_ends_and_the_reaper_keeps_the_machine(
        peer: Peer, start_daemon: Any) -> None:
    provider = FakeProvider()
    provider.destroy_gate = asyncio.Event()
    r = await start_daemon(peer.url, provider=provider, slots=1, attempt_factory=default_attempt_factory,
                           reap_interval=0.2)
    await peer.wait_type("hello")
    await peer.send(make_lease("at_t1", GH_EXPECT="x"))
    await peer.wait_type("attempt_status", where=lambda m: m.phase == "task")
    await peer.send(TaskEnd(attempt_id="at_t1", answer="done"))
    res = (await peer.wait_type("attempt_result")).result
    assert res.attempt_id == "at_t1"
    # The result is out and the slot is free although the machine still exists (destroy gated).
    assert r.daemon.busy == 0 and provider.state["existing"] == ["at_t1"]
    await peer.send(make_lease("at_t2"))
    await peer.wait_type("lease_accept", where=lambda m: m.attempt_id == "at_t2")
    # The periodic reaper must not race the background destroy: the machine is still "live".
    n = len(provider.state["reap_calls"])
    await peer.wait_until(lambda: len(provider.state["reap_calls"]) > n + 1)
    assert "at_t1" in provider.state["reap_calls"][-1]["keep"]
    provider.destroy_gate.set()
    await peer.wait_until(lambda: "at_t1" in provider.state["destroyed"])
    await peer.send(TaskEnd(attempt_id="at_t2", answer="done"))
    await peer.wait_type("attempt_result", where=lambda m: m.result.attempt_id == "at_t2")
    assert await r.stop() == 0
    assert provider.state["existing"] == [] and sorted(provider.state["destroyed"]) == ["at_t1", "at_t2"]


async def test_drain_waits_for_background_destroys(peer: Peer, start_daemon: Any) -> None:
    provider = FakeProvider()
    provider.destroy_gate = asyncio.Event()
    r = await start_daemon(peer.url, provider=provider, attempt_factory=default_attempt_factory)
    await peer.wait_type("hello")
    await peer.send(make_lease("at_d1"))
    await peer.wait_type("attempt_status", where=lambda m: m.phase == "task")
    await peer.send(TaskEnd(attempt_id="at_d1", answer="done"))
    await peer.wait_type("attempt_result")
    r.daemon.request_stop()
    await asyncio.sleep(0)  # let the drain start; it must now wait on the gated destroy
    assert not r.task.done()
    provider.destroy_gate.set()
    assert await asyncio.wait_for(asyncio.shield(r.task), 30) == 0
    assert provider.state["existing"] == []


async def test_a_crash_between_result_and_destroy_is_reaped_at_start(
        peer: Peer, start_daemon: Any, tmp_path: Path) -> None:
    state = tmp_path / "state"
    provider_state = tmp_path / "provider.json"
    first = FakeProvider(state_file=provider_state)
    first.destroy_gate = asyncio.Event()  # never set: the process "dies" while destroying
    r = await start_daemon(peer.url, provider=first, state_dir=state, attempt_factory=default_attempt_factory)
    await peer.wait_type("hello")
    await peer.send(make_lease("at_c1"))
    await peer.wait_type("attempt_status", where=lambda m: m.phase == "task")
    await peer.send(TaskEnd(attempt_id="at_c1", answer="done"))
    await peer.wait_type("attempt_result")
    r.task.cancel()  # a crash: no drain, the destroy never ran
    await asyncio.gather(r.task, return_exceptions=True)
    assert json.loads(provider_state.read_text())["existing"] == ["at_c1"]

    start = len(peer.received)
    await start_daemon(peer.url, provider=FakeProvider(state_file=provider_state), state_dir=state)
    await peer.wait_type("hello", start=start)
    st = json.loads(provider_state.read_text())
    assert st["existing"] == [] and st["reap_calls"][-1] == {"keep": [], "reaped": ["at_c1"]}
    assert Journal(state).recover() == []  # the attempt had ended: nothing to report as interrupted


async def test_hello_advertises_the_sources_of_the_hot_pool(peer: Peer, start_daemon: Any) -> None:
    provider = FakeProvider(images=("linux-tiny", "other"))
    provider.held = [("ss_1", 1), ("ss_1", 2)]
    provider.pooled = [MachineSource(image="linux-tiny"),
                       MachineSource(image="linux-tiny", start_state_id="ss_1", version=2)]
    await start_daemon(peer.url, provider=provider)
    hello = await peer.wait_type("hello")
    assert {i.name: i.pooled for i in hello.images} == {"linux-tiny": True, "other": False}
    assert {(h.start_state_id, h.version): h.pooled for h in hello.start_states} == {
        ("ss_1", 1): False, ("ss_1", 2): True}
