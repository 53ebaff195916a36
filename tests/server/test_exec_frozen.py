"""An exec a takeover's hold froze tells the agent so: the machine API's answer carries `frozen`
(gh_server/agents/base.py, docs/agents.md "Takeover"); an exec never frozen carries null."""

from __future__ import annotations

from gh_server.agents.base import Machine
from gh_wire.protocol import ExecFrozen, MachineRequest, MachineResponse
from gh_wire.vocab import ExecFreeze


async def test_the_agent_is_told_its_exec_was_frozen_and_for_how_long() -> None:
    answers = [ExecFrozen(reason=ExecFreeze.TAKEOVER, seconds=12.5), None]

    async def relay(runner_id: str, req: MachineRequest, timeout: float) -> MachineResponse:
        return MachineResponse(request_id=req.request_id, ok=True, exit_code=0, stdout="ok", stderr="",
                               frozen=answers.pop(0))

    m = Machine(relay, "rn_test", "at_test")
    frozen = (await m.exec("sleep 30")).as_dict()
    assert frozen["frozen"] == {"reason": "takeover", "seconds": 12.5} and frozen["exit_code"] == 0
    assert (await m.exec("true")).as_dict()["frozen"] is None


def test_a_runner_before_freezing_answers_without_it() -> None:
    old = MachineResponse.model_validate({"type": "machine_response", "request_id": "r", "ok": True, "exit_code": 0})
    assert old.frozen is None
