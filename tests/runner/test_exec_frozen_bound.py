"""An agent's exec that a hold froze (gh_runner/machine_requests.py): our own bound past its timeout
moves on by the time frozen, so a long hold is never our channel failure; and its answer says how long
it stood still, only when it did."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

import pytest

from gh_runner import machine_requests
from gh_runner.config import Timeouts
from gh_runner.machine_requests import MachineRequests
from gh_wire.input import InputEvent
from gh_wire.protocol import MachineRequest
from gh_wire.vocab import ExecFreeze
from providers.base import DEFAULT_OUTPUT_CAP, Machine, SavedVersion, ScriptResult


class SlowGuest(Machine):
    """An exec that takes `seconds` of wall time; `agent_runs` counts the agent's execs."""

    machine_id = "m_test"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.agent_runs = 0

    async def wait_ready(self, timeout: float) -> None:
        return None

    async def run_script(self, script: str, *, env: Mapping[str, str] | None = None, timeout: float,
                         output_cap: int = DEFAULT_OUTPUT_CAP) -> ScriptResult:
        await asyncio.sleep(self.seconds)
        return ScriptResult(exit_code=0, stdout="done", stderr="")

    async def run_agent_script(self, script: str, *, env: Mapping[str, str] | None = None, timeout: float,
                               output_cap: int = DEFAULT_OUTPUT_CAP) -> ScriptResult:
        self.agent_runs += 1
        return await self.run_script(script, env=env, timeout=timeout, output_cap=output_cap)

    async def screenshot(self) -> bytes:
        raise AssertionError("not asked")

    async def send_input(self, events: Sequence[InputEvent]) -> None:
        raise AssertionError("not asked")

    async def save(self, start_state_id: str, version: int, *, with_memory: bool = True) -> SavedVersion:
        raise AssertionError("not asked")

    async def destroy(self) -> None:
        return None


TIMEOUTS = Timeouts(screen=5)


@pytest.fixture
def short_slack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine_requests, "SCRIPT_SLACK", 0.3)
    monkeypatch.setattr(machine_requests, "FROZEN_LOOK_S", 0.05)


async def test_a_frozen_exec_outlives_our_bound_by_the_time_frozen(short_slack: None) -> None:
    guest = SlowGuest(1.2)  # past its 0.2 s timeout + 0.3 s of slack, frozen all along
    began = time.monotonic()
    served = MachineRequests(guest, TIMEOUTS, frozen=lambda: time.monotonic() - began)
    resp = await served.serve(MachineRequest(request_id="r", op="exec", script="x", timeout=0.2))
    assert resp.ok and resp.stdout == "done", resp
    assert guest.agent_runs == 1  # an agent's exec runs in its group
    assert resp.frozen is not None and resp.frozen.reason is ExecFreeze.TAKEOVER and resp.frozen.seconds >= 1.0


async def test_an_unfrozen_exec_is_still_bound_and_never_said_frozen(short_slack: None) -> None:
    served = MachineRequests(SlowGuest(1.2), TIMEOUTS, frozen=lambda: 0.0)
    resp = await served.serve(MachineRequest(request_id="r", op="exec", script="x", timeout=0.2))
    assert not resp.ok and resp.frozen is None  # our bound passed: the channel failure is ours, refused

    quick = await MachineRequests(SlowGuest(0.0), TIMEOUTS, frozen=lambda: 0.0).serve(
        MachineRequest(request_id="q", op="exec", script="x", timeout=5))
    assert quick.ok and quick.frozen is None


async def test_a_persons_exec_on_a_start_state_is_not_an_agents() -> None:
    guest = SlowGuest(0.0)
    resp = await MachineRequests(guest, TIMEOUTS).serve(MachineRequest(request_id="r", op="exec", script="x"))
    assert resp.ok and resp.frozen is None and guest.agent_runs == 0
