"""A long try's model requests stay bounded (gh_server/agents/model/window.py): past keep_turns +
CONDENSE_EVERY turns the oldest are condensed to a line each in the first user message, whole turns
at a time, so every tool call the model sees still has its result. Each API's Conversation is driven
through its SDK client against the scripted model server (tests/gateway/modelserver.py)."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import anthropic
import openai
import pytest
from openai.types.responses import computer_action as ca
from PIL import Image

from gh_server.agents.model import actions as A
from gh_server.agents.model.actor import ActResult
from gh_server.agents.model.anthropic_api import AnthropicConversation
from gh_server.agents.model.chat_api import ChatConversation
from gh_server.agents.model.conversation import Conversation
from gh_server.agents.model.responses_api import ResponsesConversation
from gh_server.agents.model.screen import Scale, Shot
from gh_server.agents.model.window import CONDENSE_EVERY, NOTE_LINES, TurnWindow
from gh_server.settings import ModelAgentConfig, ModelApi, ModelTool

from .modelserver import (
    Reply,
    chat,
    claude,
    computer_call,
    function_call,
    member,
    model_server,
    response,
    said,
    text,
    tool,
)

SIZE = (640, 400)
KEEP = 2


def _shot() -> Shot:
    buf = io.BytesIO()
    Image.new("RGB", SIZE, (10, 20, 30)).save(buf, "PNG")
    return Shot(png=buf.getvalue(), scale=Scale(model=SIZE, guest=SIZE))


def _reply(api: ModelApi, n: int) -> Reply:
    """Turn n: words naming it, a click, and a shell call (a result of text)."""
    if api == ModelApi.ANTHROPIC:
        return claude(text(f"Turn {n} here."), member("left_click", coordinate=[10, 10]),
                      tool("shell", script=f"echo {n}"))
    if api == ModelApi.OPENAI_RESPONSES:
        return response(said(f"Turn {n} here."), computer_call(ca.Click(type="click", button="left", x=10, y=10)),
                        function_call("shell", script=f"echo {n}"))
    return chat(f"Turn {n} here.", ("computer", {"action": "click", "x": 10, "y": 10}),
                ("shell", {"script": f"echo {n}"}))


def _conversation(api: ModelApi, url: str) -> tuple[Conversation, Any]:
    cfg = ModelAgentConfig(id="w", kind="model", api=api, model="m", base_url=url, api_key_env="W_KEY",
                           tools=[ModelTool.COMPUTER, ModelTool.SHELL], keep_turns=KEEP)
    if api == ModelApi.ANTHROPIC:
        c = anthropic.AsyncAnthropic(api_key="k", base_url=url, max_retries=0)
        return AnthropicConversation(cfg, c, SIZE), c
    o = openai.AsyncOpenAI(api_key="k", base_url=url, max_retries=0)
    if api == ModelApi.OPENAI_RESPONSES:
        return ResponsesConversation(cfg, o, SIZE, "linux"), o
    return ChatConversation(cfg, o, Scale(model=SIZE, guest=SIZE)), o


def _calls_and_results(api: ModelApi, body: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The ids of the tool calls in a request, and of the results answering them."""
    calls: list[str] = []
    results: list[str] = []
    if api == ModelApi.ANTHROPIC:
        for m in body["messages"]:
            for p in m["content"] if isinstance(m["content"], list) else []:
                if p.get("type") == "tool_use":
                    calls.append(p["id"])
                elif p.get("type") == "tool_result":
                    results.append(p["tool_use_id"])
    elif api == ModelApi.OPENAI_RESPONSES:
        for item in body["input"]:
            if item.get("type") in ("computer_call", "function_call"):
                calls.append(item["call_id"])
            elif item.get("type") in ("computer_call_output", "function_call_output"):
                results.append(item["call_id"])
    else:
        for m in body["messages"]:
            calls += [tc["id"] for tc in m.get("tool_calls") or []]
            if m["role"] == "tool":
                results.append(m["tool_call_id"])
    return calls, results


def _first_user_text(api: ModelApi, body: dict[str, Any]) -> str:
    first = body["messages"][1] if api == ModelApi.OPENAI_CHAT else (
        body["messages"][0] if api == ModelApi.ANTHROPIC else body["input"][0])
    return "\n".join(p.get("text", "") for p in first["content"] if isinstance(p, dict))


@pytest.mark.parametrize("api", [ModelApi.ANTHROPIC, ModelApi.OPENAI_RESPONSES, ModelApi.OPENAI_CHAT])
async def test_old_turns_are_condensed_whole_and_the_request_stops_growing(api: ModelApi) -> None:
    shot = _shot()
    # The call that first condenses: its request would hold KEEP + CONDENSE_EVERY + 1 turns. The next
    # one condenses again CONDENSE_EVERY + 1 calls later.
    first = KEEP + CONDENSE_EVERY + 2
    second = first + CONDENSE_EVERY + 1
    total = second

    async def do(action: A.Action) -> ActResult:
        return ActResult("x" * 500 if isinstance(action, A.Shell) else "done")

    async def look() -> Shot:
        return shot

    n = iter(range(1, 10_000))
    with model_server(lambda _p, _b: _reply(api, next(n))) as (url, seen):
        conv, client = _conversation(api, url)
        try:
            conv.begin("Find the file.", shot)
            for _ in range(total):
                turn = await conv.call()
                await conv.act(turn, do, look)
        finally:
            await client.close()
    bodies = seen.bodies
    assert len(bodies) == total
    before = bodies[first - 2]  # the biggest request with every turn whole

    # Until then every turn went whole; at each cut KEEP turns are left, and each call has its result.
    assert len(_calls_and_results(api, before)[0]) == 2 * (first - 2)
    for body in (bodies[first - 1], bodies[second - 1]):
        calls, results = _calls_and_results(api, body)
        assert len(calls) == 2 * KEEP and sorted(calls) == sorted(results), (calls, results)
    # The condensed turns are lines in the first user message, after the prompt, with what was said.
    note = _first_user_text(api, bodies[first - 1])
    condensed = first - 1 - KEEP
    assert note.startswith("Find the file.") and f"({condensed} of them;" in note, note
    assert "\n1. Turn 1 here. | " in note and "shell" in note.split("\n1. ")[1].split("\n")[0], note
    assert f"Turn {condensed} here." in note and f"Turn {condensed + 1} here." not in note
    # Bounded: no later request is bigger than the last one with every turn whole, give or take the
    # note's new lines.
    grown = max(len(json.dumps(b)) for b in bodies[first - 1:]) - len(json.dumps(before))
    assert grown < (CONDENSE_EVERY + 1) * 200, grown

def test_the_note_keeps_only_the_newest_lines() -> None:
    w = TurnWindow(keep=1)
    for i in range(NOTE_LINES + 100):
        w.begin_turn(2 * i + 1, f"said {i}", [])
        if (span := w.cut()) is not None:
            assert span[0] == 1  # always from the first turn on: the prompt stays
    note = w.note().splitlines()
    assert len(note) == NOTE_LINES + 1 and note[1].startswith(f"{w.condensed - NOTE_LINES + 1}. said")
    assert note[-1].startswith(f"{w.condensed}. said {w.condensed - 1} | nothing")


def test_a_turns_line_is_cut_at_its_bound() -> None:
    w = TurnWindow(keep=1)
    w.begin_turn(1, "x" * 1000, [{"blob": base64.b64encode(b"y" * 500).decode()}])
    assert len(w.lines[0]) == 200 and w.lines[0].endswith("…")
