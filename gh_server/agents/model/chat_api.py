"""`api: openai-chat`: Chat Completions with images, on any OpenAI-compatible server (vLLM, SGLang,
llama.cpp's server, Ollama), through the `openai` SDK.

`output` says how the model writes its actions:
- `tool_calls`: a `computer` function tool whose arguments are one of our actions (pixels of the scaled
  screen), beside ask_user, request_approval, infeasible and (with tools: [computer, shell]) shell;
- `pyautogui`: pyautogui code in the reply (pixels), as OSWorld's baselines and OpenCUA emit;
- `ui-tars`: UI-TARS action lines (a 0-1000 grid).
No SDK ships a computer-use driver for Chat Completions, so the parsing here is ours
(gh_server.agents.model.textformats for the two text formats).
"""

from __future__ import annotations

import json
from typing import Any

from openai import AsyncOpenAI
from openai.types.chat import ChatCompletion

from gh_server.agents.model import actions as A
from gh_server.agents.model.conversation import (
    Acted,
    Conversation,
    Do,
    Look,
    Turn,
    extra_action,
    extra_tools,
    system_prompt,
)
from gh_server.agents.model.openai_post import post
from gh_server.agents.model.screen import Scale, Shot
from gh_server.agents.model.textformats import parse_pyautogui, parse_uitars
from gh_server.agents.model.usage import CallUsage
from gh_server.agents.model.window import TurnWindow
from gh_server.settings import ChatOutput, ModelAgentConfig, ModelObservation

REMOVED_SCREEN = "[an earlier screenshot, removed to save context]"
# The accessibility tree's part (observation a11y_tree / screenshot_a11y_tree), and what replaces an old one.
TREE_HEAD = "The accessibility tree (tab-separated: tag, name, text, class, description, position, size):\n"
REMOVED_TREE = "[an earlier accessibility tree, removed to save context]"

# The `computer` tool's arguments: one of our machine actions, flat (servers' tool-call parsers and
# small models handle a flat object better than a oneOf).
COMPUTER_TOOL = {
    "type": "function",
    "function": {
        "name": "computer",
        "description": "Act on the machine's screen: click, mouse_down, mouse_up, move, drag, scroll, key, "
                       "hold_key, type, wait, screenshot. Coordinates are pixels of the screenshot.",
        "parameters": {
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": [*A.GUI, "wait", "screenshot"]},
                "x": {"type": "integer"}, "y": {"type": "integer"},
                "button": {"type": "string", "enum": ["left", "right", "middle"]},
                "clicks": {"type": "integer", "minimum": 1, "maximum": 3},
                "path": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
                "dx": {"type": "integer"}, "dy": {"type": "integer", "description": "wheel notches, + is down"},
                "keys": {"type": "array", "items": {"type": "string"}, "description": 'one chord: ["ctrl", "s"]'},
                "seconds": {"type": "number"},
                "text": {"type": "string"},
            },
            "required": ["action"],
        },
    },
}

PYAUTOGUI_GUIDE = """Reply with your reasoning, then one ```python code block of pyautogui calls \
(click, doubleClick, rightClick, moveTo, dragTo, scroll, write, press, hotkey; time.sleep) in pixels of \
the screenshot. Reply DONE with your answer when the problem is solved, FAIL with the reason if it \
cannot be solved."""

UITARS_GUIDE = """Reply as:
Thought: ...
Action: one of click(start_box='(x,y)'), left_double(start_box='(x,y)'), right_single(start_box='(x,y)'), \
drag(start_box='(x1,y1)', end_box='(x2,y2)'), hotkey(key='ctrl c'), type(content='...'), \
scroll(start_box='(x,y)', direction='down'), wait(), finished(content='your answer'), call_user()
Coordinates are on a 0-1000 grid over the screenshot."""


def computer_action(args: Any) -> A.Action:
    """The `computer` tool's arguments as an action (nulls the model filled in are dropped)."""
    if not isinstance(args, dict):
        raise A.InvalidAction("computer: the arguments must be a JSON object")
    data = {k: v for k, v in args.items() if v is not None}
    kind = data.pop("action", None)
    if kind not in (*A.GUI, "wait", "screenshot"):
        raise A.InvalidAction(f"computer: action must be one of {', '.join((*A.GUI, 'wait', 'screenshot'))}")
    return A.parse({"type": kind, **data})


class ChatConversation(Conversation):
    def __init__(self, cfg: ModelAgentConfig, client: AsyncOpenAI, scale: Scale) -> None:
        self.cfg = cfg
        self.client = client
        self.scale = scale
        self.output = cfg.chat_output
        size = scale.model
        self.coordinates = "grid 0-1000" if self.output == ChatOutput.UI_TARS else f"pixels {size[0]}x{size[1]}"
        system = system_prompt(cfg, size)
        if self.output == ChatOutput.PYAUTOGUI:
            system += "\n\n" + PYAUTOGUI_GUIDE
        elif self.output == ChatOutput.UI_TARS:
            system += "\n\n" + UITARS_GUIDE
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        self.window = TurnWindow(cfg.keep_turns)
        self._note: dict[str, Any] | None = None  # the condensed earlier turns, in the first user message
        self.tools: list[dict[str, Any]] = []
        if self.output == ChatOutput.TOOL_CALLS:
            self.tools = [COMPUTER_TOOL] + [
                {"type": "function", "function": {"name": name, "description": desc, "parameters": schema}}
                for name, (desc, schema) in extra_tools(cfg).items()]

    def _seen(self, shot: Shot) -> list[dict[str, Any]]:
        """What the model sees of one look: the screen, the accessibility tree, or both (cfg.observation)."""
        parts: list[dict[str, Any]] = []
        if self.cfg.observation != ModelObservation.A11Y_TREE:
            parts.append({"type": "image_url", "image_url": {"url": shot.data_url}})
        if shot.tree is not None:
            parts.append({"type": "text", "text": TREE_HEAD + shot.tree})
        return parts

    def begin(self, prompt: str, shot: Shot) -> None:
        self.messages.append({"role": "user", "content": [{"type": "text", "text": prompt}, *self._seen(shot)]})

    async def call(self) -> Turn:
        self._fit_window()
        self._keep_screens()
        body: dict[str, Any] = {"model": self.cfg.model, "messages": self.messages, "max_tokens": self.cfg.max_tokens}
        if self.cfg.temperature is not None:
            body["temperature"] = self.cfg.temperature
        if self.tools:
            body["tools"] = self.tools
        resp = await post(self.client, "/chat/completions", body, ChatCompletion)
        usage: CallUsage | None = None  # an OpenAI-compatible server may send none
        if resp.usage is not None:
            details = resp.usage.prompt_tokens_details
            usage = CallUsage(resp.usage.prompt_tokens, resp.usage.completion_tokens,
                              (details.cached_tokens or 0) if details is not None else 0)
        if not resp.choices:
            return Turn(text="", usage=usage, problem="the reply has no choices")
        msg = resp.choices[0].message
        text = (msg.content or "").strip()
        entry: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
        if msg.tool_calls:
            entry["tool_calls"] = [tc.model_dump(exclude_none=True) for tc in msg.tool_calls]
        turn = self._turn(text, usage, msg.tool_calls)
        self.window.begin_turn(len(self.messages), turn.text, turn.calls)
        self.messages.append(entry)
        return turn

    def _turn(self, text: str, usage: CallUsage | None, tool_calls: Any) -> Turn:
        if self.output == ChatOutput.TOOL_CALLS:
            return Turn(text=text, usage=usage, calls=list(tool_calls or []))
        try:
            parsed = (parse_pyautogui(text) if self.output == ChatOutput.PYAUTOGUI
                      else parse_uitars(text, self.scale.from_grid))
        except A.InvalidAction as e:
            return Turn(text=text, usage=usage, problem=str(e))
        return Turn(text=parsed.text, usage=usage, calls=list(parsed.actions))

    def _fit_window(self) -> None:
        """Condense the oldest turns once there are too many (window.py); the note follows the prompt."""
        span = self.window.cut()
        if span is None:
            return
        del self.messages[span[0]:span[1]]
        if self._note is None:
            self._note = {"type": "text", "text": ""}
            self.messages[1]["content"].insert(1, self._note)  # [0] is the system message
        self._note["text"] = self.window.note()

    async def act(self, turn: Turn, do: Do, look: Look) -> Acted:
        acted = Acted()
        lines: list[str] = []
        if turn.problem is not None:
            acted.invalid.append(turn.problem)
            lines.append(f"Error: {turn.problem}. Nothing was done; try again.")
        for call in turn.calls:
            if self.output == ChatOutput.TOOL_CALLS:
                self.messages.append(await self._tool_call(call, do, acted))
                continue
            if acted.end is not None or acted.invalid:
                break  # text formats: a batch stops at its first mistake, as the SDK drivers do
            action: A.Action = call
            if isinstance(action, A.Done | A.Infeasible):
                acted.end = action
                break
            res = await do(action)
            if res.invalid:
                acted.invalid.append(res.text)
            else:
                acted.done += 1
            if res.error:
                lines.append(f"Error: {action.type}: {res.text}")
        if acted.end is None:
            shot = await look()
            content: list[dict[str, Any]] = [{"type": "text", "text": "\n".join([*lines, "The screen now:"])},
                                             *self._seen(shot)]
            self.messages.append({"role": "user", "content": content})
        return acted

    async def _tool_call(self, call: Any, do: Do, acted: Acted) -> dict[str, Any]:
        def answer(text: str) -> dict[str, Any]:
            return {"role": "tool", "tool_call_id": call.id, "content": text}

        if acted.end is not None:
            return answer("not executed: the task ended")
        try:
            args = json.loads(call.function.arguments or "{}")
            name = call.function.name
            action = computer_action(args) if name == "computer" else extra_action(name, args)
        except (ValueError, A.InvalidAction) as e:
            acted.invalid.append(str(e))
            return answer(f"Error: {e}")
        if isinstance(action, A.Done | A.Infeasible):
            acted.end = action
            return answer("noted")
        res = await do(action)
        if res.invalid:
            acted.invalid.append(res.text)
        else:
            acted.done += 1
        return answer(("Error: " if res.error else "") + res.text)

    def _keep_screens(self) -> None:
        images: list[tuple[list[Any], int]] = []
        for m in self.messages:
            if m["role"] == "user" and isinstance(m["content"], list):
                images += [(m["content"], i) for i, p in enumerate(m["content"]) if p.get("type") == "image_url"]
        for container, i in images[:-self.cfg.keep_screens]:
            container[i] = {"type": "text", "text": REMOVED_SCREEN}
        # The trees likewise: the last keep_screens looks' only.
        trees: list[tuple[list[Any], int]] = []
        for m in self.messages:
            if m["role"] == "user" and isinstance(m["content"], list):
                trees += [(m["content"], i) for i, p in enumerate(m["content"])
                          if p.get("type") == "text" and p.get("text", "").startswith(TREE_HEAD)]
        for container, i in trees[:-self.cfg.keep_screens]:
            container[i] = {"type": "text", "text": REMOVED_TREE}
