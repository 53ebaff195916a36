"""`api: anthropic`: the Messages API (beta) with the computer-use tool, through the `anthropic` SDK.

The machine is the SDK's computer driver: `MachineToolset` subclasses the SDK's
`BetaAsyncAbstractComputerToolset20260801` (anthropic.tools), so the `tools[]` entry, the parsing and
checking of each member's input and the rendering of its result are the SDK's. Each member turns its
input into one of our actions and hands it to the loop's `do`. For the previous tool version
(`computer_20251124`, one `computer` tool with an `action` field) the same toolset serves the call
(`toolset.call(context, action, input)`): the member names are the same.

We do not use the SDK's tool runner (`client.beta.messages.tool_runner`): it runs until the model stops,
and the evaluation needs each turn in hand: counted against limits.steps, bounded by our timeouts,
the invalid ones counted in a row, every step recorded for the replay, and the ends and asks
(ask_user, request_approval, infeasible) decided by us. So the loop is ours and the driver is theirs.
"""

from __future__ import annotations

from typing import Any

from anthropic import AsyncAnthropic
from anthropic.lib.tools import ToolError
from anthropic.tools import (
    BetaAsyncAbstractComputerToolset20260801,
    BetaComputerCursorPositionResult,
    BetaScreenshotResult,
    BetaToolsetCallContext,
)
from anthropic.types.beta import BetaMessage, BetaToolUseBlock

from gh_server.agents.base import AgentError
from gh_server.agents.model import actions as A
from gh_server.agents.model.actor import ActResult
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
from gh_server.agents.model.screen import Shot
from gh_server.agents.model.usage import CallUsage
from gh_server.agents.model.window import TurnWindow
from gh_server.settings import ModelAgentConfig

TOOLSET = "computer_toolset_20260801"
PREVIOUS = "computer_20251124"
PREVIOUS_BETA = "computer-use-2025-11-24"
SCROLL = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}
REMOVED_SCREEN = "[an earlier screenshot, removed to save context]"


def _keys(text: str) -> list[str]:
    return [k for k in text.replace(" ", "").split("+") if k]


class MachineToolset(BetaAsyncAbstractComputerToolset20260801):
    """The attempt's machine as the SDK's computer driver. A member's action goes to the loop (`do`); what
    the model reads back is the SDK's acknowledgment plus our one line."""

    def __init__(self) -> None:
        # confirm: every type/key/hold_key runs (the agent's own job); the operator policy answers
        # request_approval, which the model calls itself.
        super().__init__(confirm=lambda _ctx: True)
        self.do: Do | None = None
        self.look: Look | None = None
        self.pointer = (0, 0)  # model pixels
        self.verdict: str | None = None  # "ok", "error", "invalid": what the last member call came to
        self.fatal: BaseException | None = None  # ours (machine, customer): re-raised after the SDK answers
        self.looked = False  # the last member call was a screenshot: the turn needs no screen after it

    async def _run(self, action: A.Action) -> str | None:
        assert self.do is not None
        try:
            res: ActResult = await self.do(action)
        except AgentError as e:  # the machine or the customer failed: ours, not a result for the model
            self.fatal = e
            raise ToolError("the machine could not carry this out") from None
        self.verdict = "invalid" if res.invalid else "error" if res.error else "ok"
        if res.error:
            raise ToolError(res.text)
        return res.text

    def _at(self, coordinate: list[int] | None) -> tuple[int, int]:
        if coordinate is not None:
            self.pointer = (coordinate[0], coordinate[1])
        return self.pointer

    async def _click(self, input: Any, button: str, clicks: int) -> str | None:
        x, y = self._at(input.coordinate)
        keys = _keys(input.text) if input.text else []
        return await self._run(A.Click(x=x, y=y, button=button, clicks=clicks, keys=keys))  # type: ignore[arg-type]

    async def left_click(self, context: BetaToolsetCallContext, input: Any) -> str | None:
        return await self._click(input, "left", 1)

    async def right_click(self, context: BetaToolsetCallContext, input: Any) -> str | None:
        return await self._click(input, "right", 1)

    async def middle_click(self, context: BetaToolsetCallContext, input: Any) -> str | None:
        return await self._click(input, "middle", 1)

    async def double_click(self, context: BetaToolsetCallContext, input: Any) -> str | None:
        return await self._click(input, "left", 2)

    async def triple_click(self, context: BetaToolsetCallContext, input: Any) -> str | None:
        return await self._click(input, "left", 3)

    async def mouse_move(self, context: BetaToolsetCallContext, input: Any) -> str | None:
        x, y = self._at(input.coordinate)
        return await self._run(A.Move(x=x, y=y))

    async def left_mouse_down(self, context: BetaToolsetCallContext, input: Any) -> str | None:
        return await self._run(A.MouseDown(x=self.pointer[0], y=self.pointer[1]))

    async def left_mouse_up(self, context: BetaToolsetCallContext, input: Any) -> str | None:
        return await self._run(A.MouseUp(x=self.pointer[0], y=self.pointer[1]))

    async def left_click_drag(self, context: BetaToolsetCallContext, input: Any) -> str | None:
        start = (input.start_coordinate[0], input.start_coordinate[1])
        end = self._at(input.coordinate)
        return await self._run(A.Drag(path=[start, end]))

    async def scroll(self, context: BetaToolsetCallContext, input: Any) -> str | None:
        x, y = self._at(input.coordinate)
        sx, sy = SCROLL[input.scroll_direction]
        n = input.scroll_amount
        return await self._run(A.Scroll(x=x, y=y, dx=sx * n, dy=sy * n))

    async def key(self, context: BetaToolsetCallContext, input: Any) -> str | None:
        return await self._run(A.Key(keys=_keys(input.text), repeat=input.repeat or 1))

    async def hold_key(self, context: BetaToolsetCallContext, input: Any) -> str | None:
        return await self._run(A.HoldKey(keys=_keys(input.text), seconds=input.duration))

    async def type(self, context: BetaToolsetCallContext, input: Any) -> str | None:
        return await self._run(A.Type(text=input.text))

    async def wait(self, context: BetaToolsetCallContext, input: Any) -> str | None:
        return await self._run(A.Wait(seconds=input.duration))

    async def cursor_position(self, context: BetaToolsetCallContext, input: Any) -> BetaComputerCursorPositionResult:
        self.verdict = "ok"
        return BetaComputerCursorPositionResult(x=self.pointer[0], y=self.pointer[1])

    async def screenshot(self, context: BetaToolsetCallContext, input: Any) -> BetaScreenshotResult:
        assert self.look is not None
        await self._run(A.Screenshot())
        try:
            shot = await self.look()
        except AgentError as e:
            self.fatal = e
            raise ToolError("the screen could not be read") from None
        self.looked = True
        return BetaScreenshotResult(data=shot.b64, media_type="image/png")

    async def zoom(self, context: BetaToolsetCallContext, input: Any) -> BetaScreenshotResult:
        assert self.do is not None
        try:
            res = await self.do(A.Zoom(region=tuple(input.region)))  # type: ignore[arg-type]
        except AgentError as e:
            self.fatal = e
            raise ToolError("the screen could not be read") from None
        self.verdict = "invalid" if res.invalid else "error" if res.error else "ok"
        if res.image is None:
            raise ToolError(res.text)
        return BetaScreenshotResult(data=res.image.b64, media_type="image/png")


class AnthropicConversation(Conversation):
    def __init__(self, cfg: ModelAgentConfig, client: AsyncAnthropic, size: tuple[int, int]) -> None:
        self.cfg = cfg
        self.client = client
        self.size = size
        self.coordinates = f"pixels {size[0]}x{size[1]}"
        self.toolset = MachineToolset()
        self.system = system_prompt(cfg, size)
        self.messages: list[dict[str, Any]] = []
        self.window = TurnWindow(cfg.keep_turns)
        self._note: dict[str, Any] | None = None  # the condensed earlier turns, in the first user message
        computer: dict[str, Any]
        if cfg.tool == TOOLSET:
            computer = dict(self.toolset.to_dict())
        else:
            computer = {"type": PREVIOUS, "name": "computer", "display_width_px": size[0],
                        "display_height_px": size[1], "enable_zoom": True}
        self.tools: list[dict[str, Any]] = [computer] + [
            {"name": name, "description": desc, "input_schema": schema}
            for name, (desc, schema) in extra_tools(cfg).items()]

    def begin(self, prompt: str, shot: Shot) -> None:
        self._note = None
        self.messages = [{"role": "user", "content": [
            {"type": "text", "text": prompt},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": shot.b64}},
        ]}]

    async def call(self) -> Turn:
        self._fit_window()
        self._keep_screens()
        kw: dict[str, Any] = {}
        if self.cfg.temperature is not None:
            kw["temperature"] = self.cfg.temperature
        if self.cfg.tool == PREVIOUS:
            kw["betas"] = [PREVIOUS_BETA]
        msg: BetaMessage = await self.client.beta.messages.create(
            model=self.cfg.model, max_tokens=self.cfg.max_tokens, system=self.system,
            messages=self.messages, tools=self.tools, **kw)  # type: ignore[arg-type]
        u = msg.usage
        cached = u.cache_read_input_tokens or 0
        usage = CallUsage(input=u.input_tokens + cached + (u.cache_creation_input_tokens or 0),
                          output=u.output_tokens, cached=cached)
        text = "\n".join(b.text for b in msg.content if b.type == "text").strip()
        calls = [b for b in msg.content if isinstance(b, BetaToolUseBlock)]
        self.window.begin_turn(len(self.messages), text, calls)
        self.messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
        return Turn(text=text, usage=usage, calls=calls)

    def _fit_window(self) -> None:
        """Condense the oldest turns once there are too many (window.py); the note follows the prompt."""
        span = self.window.cut()
        if span is None:
            return
        del self.messages[span[0]:span[1]]
        if self._note is None:
            self._note = {"type": "text", "text": ""}
            self.messages[0]["content"].insert(1, self._note)
        self._note["text"] = self.window.note()

    async def act(self, turn: Turn, do: Do, look: Look) -> Acted:
        acted = Acted()
        results: list[dict[str, Any]] = []
        self.toolset.do, self.toolset.look = do, look
        self.toolset.looked = False
        for block in turn.calls:
            if acted.end is not None:
                results.append({"type": "tool_result", "tool_use_id": block.id, "is_error": True,
                                "content": "not executed: the task ended"})
                continue
            self.toolset.looked = False
            result, invalid = await self._one(block, do, acted)
            results.append(result)
            if invalid:
                acted.invalid.append(invalid)
            elif acted.end is None:
                acted.done += 1
        content: list[dict[str, Any]] = list(results)
        if not self.toolset.looked:  # the screen after the turn, unless the model's last call just took it
            shot = await look()
            content += [{"type": "text", "text": "The screen now:"}, {
                "type": "image", "source": {"type": "base64", "media_type": "image/png", "data": shot.b64}}]
        self.messages.append({"role": "user", "content": content})
        return acted

    async def _one(self, block: BetaToolUseBlock, do: Do, acted: Acted) -> tuple[dict[str, Any], str | None]:
        """The tool_result for one tool_use, and the invalid reason when the model got it wrong."""
        if block.toolset_name == "computer" or (block.name == "computer" and self.cfg.tool == PREVIOUS):
            self.toolset.verdict, self.toolset.fatal, self.toolset.looked = None, None, False
            if block.toolset_name == "computer":
                result: dict[str, Any] = dict(await self.toolset.tool_result(block))
            else:
                result = await self._previous(block)
            if self.toolset.fatal is not None:
                raise self.toolset.fatal
            bad = result.get("is_error") and self.toolset.verdict in (None, "invalid")
            return result, (_text_of(result) or "invalid computer action") if bad else None
        try:
            action = extra_action(block.name, block.input)
        except A.InvalidAction as e:
            return {"type": "tool_result", "tool_use_id": block.id, "is_error": True, "content": str(e)}, str(e)
        if isinstance(action, A.Done | A.Infeasible):
            acted.end = action
            return {"type": "tool_result", "tool_use_id": block.id, "content": "noted"}, None
        res = await do(action)
        out: dict[str, Any] = {"type": "tool_result", "tool_use_id": block.id, "content": res.text}
        if res.error:
            out["is_error"] = True
        return out, res.text if res.invalid else None

    async def _previous(self, block: BetaToolUseBlock) -> dict[str, Any]:
        """computer_20251124: {"action": member, ...member input} served by the same toolset."""
        args = dict(block.input)
        member = str(args.pop("action", ""))
        try:
            content = await self.toolset.call(BetaToolsetCallContext(tool_use=None), member, args)
        except ToolError as e:
            return {"type": "tool_result", "tool_use_id": block.id, "is_error": True,
                    "content": e.content if isinstance(e.content, str) else list(e.content)}
        except Exception as e:  # the SDK's own refusals (unknown member, bad input)
            return {"type": "tool_result", "tool_use_id": block.id, "is_error": True, "content": str(e)[:2000]}
        return {"type": "tool_result", "tool_use_id": block.id,
                "content": content if isinstance(content, str) else list(content)}

    def _keep_screens(self) -> None:
        """Only the last keep_screens screenshots stay in the context; older ones become a line of text."""
        images: list[tuple[list[Any], int]] = []
        for m in self.messages:
            if m["role"] != "user" or not isinstance(m["content"], list):
                continue
            for j, part in enumerate(m["content"]):
                if part.get("type") == "image":
                    images.append((m["content"], j))
                elif part.get("type") == "tool_result" and isinstance(part.get("content"), list):
                    inner = part["content"]
                    images += [(inner, i) for i, p in enumerate(inner)
                               if isinstance(p, dict) and p.get("type") == "image"]
        for container, i in images[:-self.cfg.keep_screens]:
            container[i] = {"type": "text", "text": REMOVED_SCREEN}


def _text_of(result: dict[str, Any]) -> str:
    c = result.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return " ".join(str(p.get("text", "")) for p in c if isinstance(p, dict)).strip()
    return ""
