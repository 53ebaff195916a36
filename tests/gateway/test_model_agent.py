"""The built-in model agent (`kind: model`) on a real gh-server, against a scripted model
server (tests/gateway/modelserver.py: replies built from the SDKs' own types) for each API and each
`output`; the runner is simulated (simrunner) and answers with an 800x600 screen. Each row of
docs/agents.md's model-agent outcomes has a test here; tests/e2e/test_model_agent.py drives a real guest.
"""

from __future__ import annotations

import base64
import io
import json
import logging
from typing import Any

import pytest
from openai.types.responses import computer_action as ca
from PIL import Image

from gh_server.agents.model import a11y
from gh_server.settings import ModelAgentConfig, ModelEndpoint
from gh_wire import protocol
from providers.qemu import atspi_tree as T

from .conftest import GwServer
from .fakehttp import chat_reply, serve
from .modelserver import (
    Reply,
    api_error,
    chat,
    claude,
    computer_call,
    function_call,
    member,
    model_server,
    response,
    said,
    sequence,
    text,
    tool,
)
from .test_agents import Machine, connect, start_task

KEY_ENV = "GH_TEST_MODEL_KEY"
KEY = "sk-test-0123456789abcdef-never-in-a-replay"
GUEST = (800, 600)


def png(size: tuple[int, int] = GUEST) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, (30, 60, 90)).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


class Guest(Machine):
    """A runner's machine with an 800x600 screen; its inputs fail with `input_refusal` when one is given."""

    def __init__(self, r: Any, input_refusal: protocol.MachineRefusal | None = None) -> None:
        super().__init__(r, input_ok=input_refusal is None, screen=png(), exec_stdout="fixed\n",
                         input_error="input event 1 of 1 (key) could not be delivered: unknown key 'HYPERDRIVE'",
                         input_refusal=input_refusal)

    def events(self) -> list[dict[str, Any]]:
        return [e.model_dump(exclude_none=True) for q in self.requests if q.op == "input" for e in q.events]


def agent(url: str, api: str, **kw: Any) -> dict[str, ModelAgentConfig]:
    base = {"id": "m", "kind": "model", "api": api, "model": "test-model", "base_url": url,
            "api_key_env": KEY_ENV, "screen": (400, 300), "retries": 1, "timeout": 20,
            "price": {"input": 3.0, "output": 15.0}}
    return {"m": ModelAgentConfig.model_validate({**base, **kw})}


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)


async def _run(server_factory: Any, agents: dict[str, ModelAgentConfig], case: dict[str, Any] | None = None,
               refusal: protocol.MachineRefusal | None = None, a11y: str | None = None,
               **server_kw: Any) -> tuple[protocol.TaskEnd, Guest]:
    # The simulated runner sends no heartbeats of its own: give it longer than a slow model call.
    server: GwServer = server_factory(agents=agents, dead_after=300.0, **server_kw)
    r = await connect(server)
    guest = Guest(r, refusal)
    guest.a11y = a11y
    try:
        await start_task(server, r, case or {}, "m")
        end = await r.expect("task_end", timeout=120)
    finally:
        await r.close()
    assert KEY not in end.model_dump_json()  # the key is never in what leaves gh-server
    assert all(KEY not in q.model_dump_json() for q in guest.requests)
    return end, guest


def _image_size(data_b64: str) -> tuple[int, int]:
    with Image.open(io.BytesIO(base64.b64decode(data_b64))) as im:
        return im.size


# -- each API and each output ------------------------------------------------------------------------

async def test_anthropic_toolset_acts_scaled_and_answers(server_factory: Any) -> None:
    script = sequence(
        claude(text("I'll click the terminal and type."), member("left_click", coordinate=[200, 150]),
               member("type", text="echo hi\n"), member("key", text="ctrl+l"), tokens=(1000, 50), cached=400),
        claude(text("All fixed: your app runs again."), tokens=(2000, 30)))
    with model_server(script) as (url, seen):
        end, guest = await _run(server_factory, agent(url, "anthropic"))
    assert end.error is None and end.reason == protocol.TaskEndReason.FINISHED
    assert end.answer == "All fixed: your app runs again." and end.steps == 2
    # The model's 400x300 coordinates land on the 800x600 guest.
    assert guest.events() == [{"type": "click", "x": 400, "y": 300, "button": "left"},
                              {"type": "type", "text": "echo hi\n"}, {"type": "key", "keys": ["ctrl", "l"]}]
    first = seen.bodies[0]
    assert first["tools"][0] == {"type": "computer_toolset_20260801"}
    assert _image_size(first["messages"][0]["content"][1]["source"]["data"]) == (400, 300)
    # The key from gh-server's environment, as the SDK sends it (this SDK version: a bearer token).
    assert all(KEY in (h.get("x-api-key"), h.get("authorization", "").removeprefix("Bearer "))
               for _, _, h, _ in seen.requests)
    # The step is on the replay: the screen the model saw, then its words and action on the first input.
    looks = [q.note for q in guest.requests if q.op == "screen"]
    assert looks[0] == {"agent": "model", "step": 0, "seen_by_model": True}
    inputs = [q.note for q in guest.requests if q.op == "input"]
    assert inputs[0] is not None and inputs[0]["text"] == "I'll click the terminal and type."
    assert inputs[0]["action"]["type"] == "click" and inputs[0]["step"] == 1 and "text" not in (inputs[1] or {})
    u = end.usage or {}
    assert (u["steps"], u["tokens_in"], u["tokens_out"], u["tokens_cached"]) == (2, 3400, 80, 400)
    # $3/M in, $15/M out: 3400*3 + 80*15 = 11400 micro-dollars = 1.14 cents, rounded up to 2.
    assert u["cost_cents"] == 2 and abs(u["cost_cents_exact"] - 1.14) < 1e-9
    assert u["coordinates"] == "pixels 400x300" and len(u["model_seconds"]) == 2


async def test_a_turns_words_reach_the_replay_when_it_looks_or_waits_first(server_factory: Any) -> None:
    # A wait sends the machine nothing, and a screenshot only the look that answers it: the words go on
    # the turn's first frame, an input or that look, never lost.
    script = sequence(
        claude(text("Let me look first."), member("wait", duration=0), member("screenshot"),
               member("key", text="ctrl+l")),
        claude(text("Only waiting."), member("wait", duration=0)),
        claude(text("Done.")))
    with model_server(script) as (url, _seen):
        end, guest = await _run(server_factory, agent(url, "anthropic"))
    assert end.error is None and end.answer == "Done."
    noted = [(q.op, (q.note or {}).get("step"), (q.note or {}).get("text")) for q in guest.requests
             if (q.note or {}).get("text")]
    assert noted == [("screen", 1, "Let me look first."), ("screen", 2, "Only waiting.")], guest.requests


async def test_anthropic_previous_tool_version(server_factory: Any) -> None:
    script = sequence(claude(tool("computer", action="double_click", coordinate=[100, 100])), claude(text("ok")))
    with model_server(script) as (url, seen):
        end, guest = await _run(server_factory, agent(url, "anthropic", tool_version="computer_20251124"))
    assert end.error is None and end.answer == "ok"
    assert guest.events() == [{"type": "double_click", "x": 200, "y": 200, "button": "left"}]
    assert seen.bodies[0]["tools"][0]["type"] == "computer_20251124"
    assert seen.requests[0][2].get("anthropic-beta") == "computer-use-2025-11-24"
    result = seen.bodies[1]["messages"][2]["content"][0]
    assert result["type"] == "tool_result" and not result.get("is_error")


async def test_responses_batch_and_safety_check_approved(server_factory: Any) -> None:
    call = computer_call(ca.Click(type="click", button="left", x=40, y=30), ca.Type(type="type", text="ls\n"),
                         checks=[("malicious_instructions", "The screen asks to disable the firewall.")])
    script = sequence(response(call), response(said("Done: the firewall stays on.")))
    with model_server(script) as (url, seen):
        end, guest = await _run(server_factory, agent(url, "openai-responses"),
                                case={"operator": {"approvals": "approve"}})
    assert end.error is None and end.answer == "Done: the firewall stays on." and end.approvals == 1
    assert guest.events() == [{"type": "click", "x": 80, "y": 60, "button": "left"},
                              {"type": "type", "text": "ls\n"}]
    assert seen.bodies[0]["tools"][0] == {"type": "computer"}
    out = next(i for i in seen.bodies[1]["input"] if i.get("type") == "computer_call_output")
    assert out["call_id"] == call.call_id and out["acknowledged_safety_checks"][0]["code"] == "malicious_instructions"
    assert out["output"]["image_url"].startswith("data:image/png;base64,")
    assert seen.requests[0][2].get("authorization") == f"Bearer {KEY}"


async def test_responses_safety_check_denied_does_nothing(server_factory: Any) -> None:
    call = computer_call(ca.Click(type="click", button="left", x=40, y=30), checks=[("sensitive_domain", "bank")])
    script = sequence(response(call), response(said("I could not do that.")))
    with model_server(script) as (url, seen):
        end, guest = await _run(server_factory, agent(url, "openai-responses", tool_version="computer_use_preview"),
                                case={"operator": {"approvals": "deny"}})
    assert end.error is None and end.approvals == 1 and guest.events() == []
    assert seen.bodies[0]["tools"][0]["type"] == "computer_use_preview"
    assert any("did not approve" in json.dumps(i) for i in seen.bodies[1]["input"])


async def test_chat_tool_calls(server_factory: Any) -> None:
    script = sequence(chat("Scrolling down.", ("computer", {"action": "scroll", "x": 100, "y": 100, "dy": 3}),
                           ("computer", {"action": "drag", "path": [[0, 0], [50, 50], [100, 0]]})),
                      chat("It works now."))
    with model_server(script) as (url, seen):
        end, guest = await _run(server_factory, agent(url, "openai-chat", output="tool_calls"))
    assert end.error is None and end.answer == "It works now."
    assert guest.events() == [
        {"type": "scroll", "x": 200, "y": 200, "dy": 3, "dx": 0},
        {"type": "mouse_down", "x": 0, "y": 0, "button": "left"}, {"type": "move", "x": 100, "y": 100},
        {"type": "move", "x": 200, "y": 0}, {"type": "mouse_up", "x": 200, "y": 0, "button": "left"}]
    assert seen.requests[0][0] == "/chat/completions"
    assert [t["function"]["name"] for t in seen.bodies[0]["tools"]] == ["computer", "ask_user", "request_approval",
                                                                         "infeasible"]


async def test_chat_pyautogui(server_factory: Any) -> None:
    code = "I'll fix it.\n```python\nimport pyautogui\npyautogui.click(10, 20)\npyautogui.hotkey('ctrl', 'c')\n```"
    script = sequence(chat(code), chat("DONE"))
    with model_server(script) as (url, _seen):
        end, guest = await _run(server_factory, agent(url, "openai-chat", output="pyautogui"))
    assert end.error is None and end.reason == protocol.TaskEndReason.FINISHED
    assert guest.events() == [{"type": "click", "x": 20, "y": 40, "button": "left"},
                              {"type": "key", "keys": ["ctrl", "c"]}]


async def test_chat_ui_tars_grid(server_factory: Any) -> None:
    line = "Thought: The terminal is in the middle.\nAction: click(start_box='<|box_start|>(500,500)<|box_end|>')"
    script = sequence(chat(line), chat("Thought: done.\nAction: finished(content='The app runs.')"))
    with model_server(script) as (url, _seen):
        end, guest = await _run(server_factory, agent(url, "openai-chat", output="ui-tars"))
    assert end.error is None and end.answer == "The app runs."
    assert guest.events() == [{"type": "click", "x": 400, "y": 300, "button": "left"}]  # 500/1000 of 800x600
    assert (end.usage or {})["coordinates"] == "grid 0-1000"


async def test_shell_only_when_configured(server_factory: Any) -> None:
    script = sequence(chat(None, ("shell", {"script": "printf ok"})), chat("Fixed with a script."))
    with model_server(script) as (url, seen):
        end, guest = await _run(server_factory, agent(url, "openai-chat", tools=["computer", "shell"]))
    assert end.error is None and end.answer == "Fixed with a script."
    (ex,) = [q for q in guest.requests if q.op == "exec"]
    assert ex.script == "printf ok" and ex.note is not None and ex.note["action"]["type"] == "shell"
    assert "exit code 0" in json.dumps(seen.bodies[1]["messages"])
    # Without shell in tools the same call is an invalid action, sent back and counted.
    script = sequence(chat(None, ("shell", {"script": "printf ok"})), chat("ok"))
    with model_server(script) as (url, seen):
        end, guest = await _run(server_factory, agent(url, "openai-chat"))
    assert not [q for q in guest.requests if q.op == "exec"] and (end.usage or {})["invalid"] == 1
    assert "there is no tool 'shell'" in json.dumps(seen.bodies[1]["messages"]) or \
        "not one of this agent's tools" in json.dumps(seen.bodies[1]["messages"])


# -- what ends a task (docs/agents.md) ---------------------------------------------------------------

async def test_unreachable_endpoint_is_our_error(server_factory: Any) -> None:
    end, _ = await _run(server_factory, agent("http://127.0.0.1:9", "anthropic"))
    assert end.error is not None and "could not be reached after 1 retries" in end.error


async def test_auth_error_is_our_error(server_factory: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, the SDKs' and httpx's included
    with model_server(sequence(api_error(401, "invalid x-api-key " + KEY))) as (url, seen):
        end, _ = await _run(server_factory, agent(url, "anthropic"))
    assert end.error is not None and "refused the API key from GH_TEST_MODEL_KEY (HTTP 401)" in end.error
    assert "•••" in end.error  # the server echoed the key: it is cut out of the reason
    assert len(seen.requests) == 1  # not retried
    assert caplog.records and KEY not in caplog.text


@pytest.mark.parametrize(("status", "reason", "tries"), [
    (503, "answered HTTP 503 after 1 retries", 2),
    (429, "answered HTTP 429 after 1 retries", 2),
    (400, "refused the request (HTTP 400)", 1),  # not retried: the same request fails again
])
async def test_5xx_or_429_after_the_retries_is_our_error(server_factory: Any, status: int, reason: str,
                                                        tries: int) -> None:
    with model_server(sequence(api_error(status, "overloaded", {"retry-after": "0"}))) as (url, seen):
        end, _ = await _run(server_factory, agent(url, "openai-chat"))
    assert end.error is not None and reason in end.error and "overloaded" in end.error, end.error
    assert len(seen.requests) == tries


async def test_429_is_retried_after_its_retry_after(server_factory: Any) -> None:
    script = sequence(api_error(429, "slow down", {"retry-after": "2"}), chat("All good."))
    with model_server(script) as (url, seen):
        end, _ = await _run(server_factory, agent(url, "openai-chat"))
    assert end.error is None and end.answer == "All good."
    (t0, t1) = [t for *_, t in seen.requests]
    assert t1 - t0 >= 1.9  # the SDK waited as the server asked


async def test_invalid_turns_in_a_row_are_the_agents_failure(server_factory: Any) -> None:
    bad = chat("```python\nos.system('rm -rf /')\n```")
    with model_server(sequence(bad)) as (url, seen):
        end, guest = await _run(server_factory, agent(url, "openai-chat", output="pyautogui", max_invalid=3))
    assert end.error is None and end.reason == protocol.TaskEndReason.AGENT_FAILED
    assert "3 invalid turns in a row" in (end.note or "") and end.steps == 3 and guest.events() == []
    assert "os.system() is not one of the pyautogui calls" in json.dumps(seen.bodies[1]["messages"])


async def test_invalid_action_is_sent_back_and_a_good_turn_resets_the_count(server_factory: Any) -> None:
    script = sequence(claude(member("left_click", coordinate=[1])), claude(member("key", text="HYPERDRIVE")),
                      claude(member("left_click", coordinate=[1, 1])), claude(member("left_click", coordinate=[1])),
                      claude(text("done")))
    with model_server(script) as (url, seen):
        end, _guest = await _run(server_factory, agent(url, "anthropic", max_invalid=3),
                                 refusal=None)
    assert end.error is None and end.reason == protocol.TaskEndReason.FINISHED and end.answer == "done"
    first_result = seen.bodies[1]["messages"][2]["content"][0]
    assert first_result["is_error"] is True and "coordinate" in json.dumps(first_result)
    assert (end.usage or {})["invalid"] == 2


async def test_an_unknown_key_is_the_models_mistake_not_ours(server_factory: Any) -> None:
    script = sequence(claude(member("key", text="HYPERDRIVE")))
    with model_server(script) as (url, _seen):
        end, _ = await _run(server_factory, agent(url, "anthropic", max_invalid=2),
                            refusal=protocol.MachineRefusal.INPUT_NOT_SUPPORTED)
    assert end.error is None and end.reason == protocol.TaskEndReason.AGENT_FAILED
    assert "unknown key" in (end.note or "")


async def test_a_turn_without_action_finishes_with_its_text(server_factory: Any) -> None:
    with model_server(sequence(response(said("Restart the app and it will work.")))) as (url, _):
        end, guest = await _run(server_factory, agent(url, "openai-responses"))
    assert end.error is None and end.reason == protocol.TaskEndReason.FINISHED
    assert end.answer == "Restart the app and it will work." and end.steps == 1 and guest.events() == []


async def test_each_calls_usage_is_kept_and_a_reply_without_usage_counts_as_unknown(server_factory: Any) -> None:
    """The account keeps every call's own tokens and cost beside the totals (the export's per-step metrics);
    an OpenAI-compatible server may leave `usage` out of a reply: that call's entry is None, never 0."""
    silent = chat("Scrolling.", ("computer", {"action": "scroll", "x": 100, "y": 100, "dy": 3}))
    del silent.body["usage"]
    script = sequence(chat("Clicking.", ("computer", {"action": "click", "x": 10, "y": 10}), tokens=(1000, 40),
                           cached=600), silent, chat("It works now.", tokens=(1500, 8)))
    with model_server(script) as (url, _seen):
        end, _guest = await _run(server_factory, agent(url, "openai-chat", output="tool_calls"))
    assert end.error is None and end.answer == "It works now."
    u = end.usage or {}
    # $3/M in, $15/M out: 1000*3 + 40*15 = 3600 micro-dollars (0.36 cents); 1500*3 + 8*15 = 4620 (0.462 cents).
    assert u["calls"] == [{"tokens_in": 1000, "tokens_out": 40, "tokens_cached": 600, "cost_cents_exact": 0.36},
                          None,
                          {"tokens_in": 1500, "tokens_out": 8, "tokens_cached": 0, "cost_cents_exact": 0.462}]
    assert (u["steps"], u["tokens_in"], u["tokens_out"], u["tokens_cached"]) == (3, 2500, 48, 600)


async def test_infeasible_answers_with_its_reason(server_factory: Any) -> None:
    with model_server(sequence(response(function_call("infeasible", reason="no network card")))) as (url, _):
        end, _guest = await _run(server_factory, agent(url, "openai-responses"))
    assert end.error is None and end.answer == "infeasible: no network card"


async def test_step_limit_counts_model_turns(server_factory: Any) -> None:
    with model_server(sequence(chat(None, ("computer", {"action": "click", "x": 1, "y": 1})))) as (url, seen):
        end, guest = await _run(server_factory, agent(url, "openai-chat", max_steps=50),
                                case={"limits": {"minutes": 5, "steps": 3}})
    assert end.error is None and end.reason == protocol.TaskEndReason.STEP_LIMIT
    assert end.steps == 3 and len(seen.requests) == 3 and len(guest.events()) == 3


async def test_max_steps_when_the_case_has_no_step_limit(server_factory: Any) -> None:
    with model_server(sequence(chat(None, ("computer", {"action": "wait", "seconds": 0})))) as (url, seen):
        end, _ = await _run(server_factory, agent(url, "openai-chat", max_steps=2))
    assert end.reason == protocol.TaskEndReason.STEP_LIMIT and end.steps == 2 and len(seen.requests) == 2


async def test_ask_user_goes_to_the_simulated_customer(server_factory: Any) -> None:
    script = sequence(claude(tool("ask_user", question="What is your Wi-Fi called?")), claude(text("Thanks!")))
    with serve(chat_reply("It's HomeNet, dear.")) as (cust_url, cust_seen), model_server(script) as (url, seen):
        end, _ = await _run(server_factory, agent(url, "anthropic"),
                            customer_model=ModelEndpoint(base_url=cust_url + "/v1", model="cust"),
                            case={"customer": {"persona": "Retired teacher", "facts": {"Wi-Fi network": "HomeNet"}}})
    assert end.error is None and end.questions == 1 and end.answer == "Thanks!"
    assert "The user answered: It's HomeNet, dear." in json.dumps(seen.bodies[1]["messages"])
    assert "What is your Wi-Fi called?" in json.dumps(cust_seen[0][1])
    # The evaluator's tokens are not the agent's: only the model agent's calls are on its usage.
    assert (end.usage or {})["tokens_in"] == 200


async def test_request_approval_follows_the_operator(server_factory: Any) -> None:
    script = sequence(chat(None, ("request_approval", {"what": "delete the old profile"})), chat("ok"))
    with model_server(script) as (url, seen):
        end, _ = await _run(server_factory, agent(url, "openai-chat"), case={"operator": {"approvals": "deny"}})
    assert end.approvals == 1 and "The operator's decision: deny" in json.dumps(seen.bodies[1]["messages"])


@pytest.mark.timeout(200)
async def test_time_limit_stops_a_model_call_in_flight(server_factory: Any) -> None:
    script = sequence(Reply(delay=150, body={}))  # the model never answers within the task's minute
    with model_server(script) as (url, seen):
        end, _ = await _run(server_factory, agent(url, "anthropic", timeout=600),
                            case={"limits": {"minutes": 1}})
    assert end.error is None and end.reason == protocol.TaskEndReason.TIME_LIMIT
    assert len(seen.requests) == 1 and (end.usage or {})["steps"] == 0


async def test_missing_key_is_our_error(server_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV)
    with model_server(sequence(chat("hi"))) as (url, seen):
        end, _ = await _run(server_factory, agent(url, "anthropic"))
    assert end.error is not None and "GH_TEST_MODEL_KEY (its API key) is not set" in end.error
    assert not seen.requests


async def test_zoom_and_hold_key_through_the_toolset(server_factory: Any) -> None:
    script = sequence(claude(member("zoom", region=[0, 0, 100, 50]), member("hold_key", text="shift", duration=1)),
                      claude(text("seen")))
    with model_server(script) as (url, seen):
        end, guest = await _run(server_factory, agent(url, "anthropic"))
    assert end.error is None and end.answer == "seen"
    assert guest.events() == [{"type": "key", "keys": ["shift"], "hold_ms": 1000}]
    zoomed = seen.bodies[1]["messages"][2]["content"][0]
    image = next(p for p in zoomed["content"] if p.get("type") == "image")
    assert _image_size(image["source"]["data"]) == (400, 200)  # 100x50 of the model's screen, scaled up to fit


@pytest.mark.parametrize("api", ["anthropic", "openai-chat", "openai-responses"])
async def test_keep_screens_bounds_the_screenshots_in_context(server_factory: Any, api: str) -> None:
    if api == "anthropic":
        act, last = claude(member("left_click", coordinate=[1, 1])), claude(text("ok"))
    elif api == "openai-chat":
        act, last = chat(None, ("computer", {"action": "click", "x": 1, "y": 1})), chat("ok")
    else:
        act, last = response(computer_call(ca.Click(type="click", button="left", x=1, y=1))), response(said("ok"))
    with model_server(sequence(act, act, act, act, last)) as (url, seen):
        end, _ = await _run(server_factory, agent(url, api, keep_screens=2))
    assert end.error is None and end.answer == "ok"
    final = json.dumps(seen.bodies[-1])
    if api == "openai-responses":  # every computer_call_output keeps an image: the older ones a placeholder
        outputs = [i["output"]["image_url"] for i in seen.bodies[-1]["input"]
                   if i.get("type") == "computer_call_output"]
        assert len(outputs) == 4 and len(set(outputs[:2])) == 1 and outputs[2] != outputs[0]
    else:
        assert final.count("an earlier screenshot, removed") == 3  # 5 screens seen, 2 kept


@pytest.mark.parametrize("api", ["openai-chat", "openai-responses"])
async def test_openai_bodies_are_the_sdks_own_without_its_per_call_transform(
        server_factory: Any, monkeypatch: pytest.MonkeyPatch, api: str) -> None:
    """The SDK's request transform walked the whole history on every call (20 ms a call growing past
    100 ms by step 30): bodies now go through `client.post` as they are. Each body must still be what
    the SDK's create() would have sent, and carry only the bearer key."""
    from openai._utils import async_transform
    from openai.resources.chat.completions import completions as chat_module
    from openai.resources.responses import responses as responses_module
    from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
    from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming

    walked: list[object] = []

    async def counting(data: object, expected_type: object) -> object:
        walked.append(expected_type)
        return await async_transform(data, expected_type)
    monkeypatch.setattr(chat_module, "async_maybe_transform", counting)
    monkeypatch.setattr(responses_module, "async_maybe_transform", counting)
    if api == "openai-chat":
        act, last = chat(None, ("computer", {"action": "click", "x": 1, "y": 1})), chat("ok")
        params: Any = CompletionCreateParamsNonStreaming
    else:
        act, last = response(computer_call(ca.Click(type="click", button="left", x=1, y=1))), response(said("ok"))
        params = ResponseCreateParamsNonStreaming
    with model_server(sequence(act, act, act, last)) as (_url, seen):
        end, _ = await _run(server_factory, agent(_url, api, keep_screens=2, temperature=0.0))
    assert end.error is None and end.answer == "ok"
    assert walked == []  # no call ran the transform
    assert len(seen.requests) == 4
    for path, body, headers, _ in seen.requests:
        assert path.endswith("/chat/completions" if api == "openai-chat" else "/responses")
        assert await async_transform(body, params) == body  # the transform would have sent the same
        assert body["model"] == "test-model" and body["temperature"] == 0.0
        assert headers["authorization"] == f"Bearer {KEY}"


# -- the accessibility tree as the observation (OSWorld's a11y_tree / screenshot_a11y_tree) -------------

TREE = T.to_xml([T.Node("application", "mousepad", children=[
    T.Node("push button", "Save", states=["showing", "visible", "enabled"], extents=(40, 60, 32, 32))])], 1 << 20)


def _user_parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for m in body["messages"] if m["role"] == "user" for p in m["content"]]


async def test_a11y_tree_shows_the_linearized_tree_and_no_screen(server_factory: Any) -> None:
    with model_server(sequence(chat("Nothing to do."))) as (url, seen):
        end, guest = await _run(server_factory, agent(url, "openai-chat", observation="a11y_tree"), a11y=TREE)
    assert end.error is None and end.answer == "Nothing to do."
    parts = _user_parts(seen.bodies[0])
    assert not [p for p in parts if p["type"] == "image_url"]
    trees = [p["text"] for p in parts if p["type"] == "text" and p["text"].startswith("The accessibility tree")]
    assert len(trees) == 1 and trees[0].endswith(f"{a11y.HEADER}\npush-button\tSave\t\"\"\t\t\t(40, 60)\t(32, 32)")
    assert [q.op for q in guest.requests][:2] == ["screen", "accessibility"]


async def test_screenshot_a11y_tree_on_a_machine_without_a_desktop_says_so_beside_the_screen(
        server_factory: Any) -> None:
    with model_server(sequence(chat("Nothing to do."))) as (url, seen):
        end, _guest = await _run(server_factory, agent(url, "openai-chat", observation="screenshot_a11y_tree",
                                                      a11y_max_chars=1000))
    assert end.error is None  # the refusal is told to the model, never our error or the agent's failure
    parts = _user_parts(seen.bodies[0])
    assert [p["type"] for p in parts] == ["text", "image_url", "text"]
    assert parts[2]["text"].startswith("The accessibility tree") and "no accessibility tree" in parts[2]["text"]


def test_a11y_observation_is_for_the_chat_api_only() -> None:
    with pytest.raises(ValueError, match="observation a11y_tree is for api openai-chat"):
        agent("http://127.0.0.1:1", "anthropic", observation="a11y_tree")
