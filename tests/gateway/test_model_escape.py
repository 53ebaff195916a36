"""No way out of the score for the model agent (docs/agents.md, "What counts against whom"): hostile model
replies from the scripted model server (tests/gateway/modelserver.py, built from the SDKs' own types), through
a real gh-server to a simulated runner. Each is a step the agent spent, or ends its task as `agent_failed`
with a typed fault; none is our `error`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gh_server.agents.model.loop import MAX_ACTIONS_PER_TURN
from gh_wire import protocol
from gh_wire.vocab import AgentFault

from .modelserver import chat, chat_raw, model_server, sequence
from .test_model_agent import KEY, KEY_ENV, _run, agent

CLICK = ("computer", {"action": "click", "x": 10, "y": 10})


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)


@pytest.mark.parametrize(("reply", "fault"), [
    (chat("fixed it\x00really"), AgentFault.ANSWER_HAS_NUL),
    (chat("x" * 10_000_000), AgentFault.ANSWER_TOO_LONG),  # a 10 MB reply: its text would be the answer
])
async def test_a_final_text_that_breaks_the_answers_contract_is_agent_failed(server_factory: Any, reply: Any,
                                                                             fault: AgentFault) -> None:
    with model_server(sequence(reply)) as (url, _):
        end, _guest = await _run(server_factory, agent(url, "openai-chat"))
    assert end.error is None and end.reason == protocol.TaskEndReason.AGENT_FAILED and end.fault == fault, end.note
    assert end.answer == "" and end.steps == 1


@pytest.mark.parametrize("reply", [
    chat_raw("computer", "{this is not json"),
    chat(None, ("computer", {"action": "teleport", "x": 1})),  # an action outside the schema
    chat(None, ("computer", {"action": "type", "text": "a\x00b"})),  # typed text with a NUL
    chat(None, ("ask_user", {"question": "why\x00"})),
])
async def test_a_reply_it_cannot_act_on_is_a_step_spent(server_factory: Any, reply: Any) -> None:
    with model_server(sequence(reply)) as (url, seen):
        end, guest = await _run(server_factory, agent(url, "openai-chat", max_invalid=2))
    assert end.error is None and end.reason == protocol.TaskEndReason.AGENT_FAILED, end
    assert end.steps == 2 and len(seen.requests) == 2 and guest.events() == []
    assert "2 invalid turns in a row" in (end.note or "")


async def test_a_thousand_actions_in_one_turn_are_cut_at_the_cap(server_factory: Any) -> None:
    with model_server(sequence(chat(None, *[CLICK] * 1000), chat("done"))) as (url, seen):
        end, guest = await _run(server_factory, agent(url, "openai-chat"))
    assert end.error is None and end.reason == protocol.TaskEndReason.FINISHED and end.answer == "done", end
    assert len(guest.events()) == MAX_ACTIONS_PER_TURN and (end.usage or {})["invalid"] == 1000 - MAX_ACTIONS_PER_TURN
    assert len(seen.requests) == 2  # every call got its result (the API requires it) and the model went on


@pytest.mark.timeout(120)
async def test_a_reply_that_never_ends_is_the_agents_stall(server_factory: Any) -> None:
    never = replace(chat("ok"), trickle=0.5)  # a byte every half second: the SDK's read timeout never fires
    with model_server(sequence(never)) as (url, _):
        end, _guest = await _run(server_factory, agent(url, "openai-chat", timeout=2, retries=0))
    assert end.error is None and end.reason == protocol.TaskEndReason.AGENT_FAILED, end
    assert end.fault == AgentFault.MODEL_STALLED
