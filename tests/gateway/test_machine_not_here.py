"""A runner that holds no such attempt answers `attempt_not_here`, and the server asks again while the
attempt's row still says it runs on that runner: the server moved a lost runner's attempt there (from a
save point) as it sent the lease, so an agent's request following the row can reach the runner before the
lease does (tests/e2e/test_resume.py met it under load: `502` before `machine_restored`). Once the attempt
runs nowhere (its row is no longer running), the refusal stands at once: no wait for a lease that will
not come."""

from __future__ import annotations

import pytest

from gh_server.agents import base
from gh_server.agents.base import Machine, MachineError
from gh_wire import protocol

OK = protocol.MachineResponse(request_id="", ok=True, exit_code=0, stdout="done\n")


class Runner:
    """The runner side of a relay: `not_here` answers `attempt_not_here`, then it answers."""

    def __init__(self, not_here: int) -> None:
        self.not_here = not_here
        self.asked: list[str] = []

    async def relay(self, runner_id: str, req: protocol.MachineRequest, timeout: float) -> protocol.MachineResponse:
        self.asked.append(runner_id)
        if len(self.asked) <= self.not_here:
            return protocol.MachineResponse(request_id=req.request_id, ok=False,
                                            refusal=protocol.MachineRefusal.NOT_HERE,
                                            error=f"attempt {req.attempt_id} is not running on this runner")
        return OK.model_copy(update={"request_id": req.request_id})


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "AWAY_POLL_S", 0.01)


async def test_a_request_that_reaches_the_runner_before_the_lease_is_asked_again() -> None:
    runner = Runner(not_here=2)

    async def runner_of(_aid: str) -> str | None:
        return "rn_b"  # the row already says the attempt runs there

    m = Machine(runner.relay, "rn_b", "at_x", away_wait=30.0, runner_of=runner_of)
    res = await m.exec("true")
    assert res.stdout == "done\n" and runner.asked == ["rn_b"] * 3


async def test_an_attempt_that_runs_nowhere_is_refused_at_once() -> None:
    runner = Runner(not_here=99)

    async def runner_of(_aid: str) -> str | None:
        return None  # ended: its row is no longer running

    m = Machine(runner.relay, "rn_b", "at_x", away_wait=30.0, runner_of=runner_of)
    with pytest.raises(MachineError) as e:
        await m.exec("true")
    assert e.value.refusal is protocol.MachineRefusal.NOT_HERE and runner.asked == ["rn_b"]
