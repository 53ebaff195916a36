"""`api: openai-responses`: the Responses API's computer tool (GA `computer`, or `computer_use_preview`),
through the `openai` SDK.

The machine is the SDK's computer driver: `MachineDriver` implements `openai.lib.computer`'s
`AsyncComputerDriver`, and each `computer_call` (a batch of actions) is carried out by the SDK's
`AsyncComputerToolset.execute`, which checks every action, asks `approve_safety_checks` about pending
safety checks (decided here by the case's operator.approvals, as /approval), runs the batch through the
driver and takes the screenshot that answers the call.

We do not use `AsyncComputerToolset.run`: it ends the run with an exception at the first invalid action,
refused approval or max_steps, where the evaluation must send the model its mistake and count it, stop
at limits.steps with its own reason, bound each call by our timeouts and record each turn for the
replay; and it does not serve the function tools (ask_user, request_approval, infeasible, shell). So
the loop is ours and the driver and the checks of each call are the SDK's.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

from openai import AsyncOpenAI
from openai.lib.computer import AsyncComputerToolset, ComputerUseError, Screenshot
from openai.types.responses import Response, ResponseComputerToolCall, ResponseFunctionToolCall
from PIL import Image

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
from gh_server.agents.model.screen import Shot
from gh_server.agents.model.usage import CallUsage
from gh_server.agents.model.window import TurnWindow
from gh_server.settings import ModelAgentConfig

PREVIEW = "computer_use_preview"
BUTTONS = {"left": "left", "right": "right", "wheel": "middle"}


def _placeholder() -> str:
    """A small grey image for a screenshot dropped from the context (a computer_call_output needs one)."""
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (128, 128, 128)).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


PLACEHOLDER = _placeholder()


class ActionFailed(Exception):
    """An action came back as an error result: the SDK stops the batch, we tell the model."""

    def __init__(self, text: str, invalid: bool) -> None:
        super().__init__(text)
        self.invalid = invalid


class MachineDriver:
    """The attempt's machine as openai's AsyncComputerDriver: each action goes to the loop's `do`."""

    def __init__(self) -> None:
        self.do: Do | None = None
        self.look: Look | None = None
        self.done = 0

    async def _run(self, action: A.Action) -> None:
        assert self.do is not None
        res = await self.do(action)  # AgentError (ours) goes through the SDK untouched
        if res.error:
            raise ActionFailed(res.text, res.invalid)
        self.done += 1

    async def click(self, action: Any) -> None:
        button = BUTTONS.get(action.button)
        if button is None:
            raise ActionFailed(f"the {action.button} button is not available on this machine", True)
        await self._run(A.Click(x=action.x, y=action.y, button=button, keys=action.keys or []))  # type: ignore[arg-type]

    async def double_click(self, action: Any) -> None:
        await self._run(A.Click(x=action.x, y=action.y, clicks=2, keys=action.keys or []))

    async def drag(self, action: Any) -> None:
        try:
            drag = A.Drag(path=[(p.x, p.y) for p in action.path])
        except ValueError as e:
            raise ActionFailed(f"drag: {e}", True) from None
        await self._run(drag)

    async def keypress(self, action: Any) -> None:
        await self._run(A.Key(keys=list(action.keys)))

    async def move(self, action: Any) -> None:
        await self._run(A.Move(x=action.x, y=action.y))

    async def scroll(self, action: Any) -> None:
        # The API's scroll_x/scroll_y are pixels; a wheel notch is about 100 of them.
        dx, dy = _notches(action.scroll_x), _notches(action.scroll_y)
        await self._run(A.Scroll(x=action.x, y=action.y, dx=dx, dy=dy))

    async def type(self, action: Any) -> None:
        await self._run(A.Type(text=action.text))

    async def wait(self, action: Any) -> None:
        await self._run(A.Wait(seconds=2.0))

    async def screenshot(self) -> Screenshot:
        assert self.look is not None
        shot = await self.look()
        return {"type": "computer_screenshot", "image_url": shot.data_url}


def _notches(pixels: int) -> int:
    if pixels == 0:
        return 0
    n = max(1, min(100, round(abs(pixels) / 100)))
    return n if pixels > 0 else -n


class ResponsesConversation(Conversation):
    def __init__(self, cfg: ModelAgentConfig, client: AsyncOpenAI, size: tuple[int, int], environment: str) -> None:
        self.cfg = cfg
        self.client = client
        self.size = size
        self.coordinates = f"pixels {size[0]}x{size[1]}"
        self.driver = MachineDriver()
        self.toolset = AsyncComputerToolset(self.driver)  # type: ignore[arg-type]
        self.instructions = system_prompt(cfg, size)
        computer: dict[str, Any] = {"type": "computer"}
        if cfg.tool == PREVIEW:
            computer = {"type": PREVIEW, "display_width": size[0], "display_height": size[1],
                        "environment": environment}
        self.tools: list[dict[str, Any]] = [computer] + [
            {"type": "function", "name": name, "description": desc, "parameters": schema, "strict": False}
            for name, (desc, schema) in extra_tools(cfg).items()]
        self.history: list[dict[str, Any]] = []
        self.window = TurnWindow(cfg.keep_turns)
        self._note: dict[str, Any] | None = None  # the condensed earlier turns, in the first user message

    def begin(self, prompt: str, shot: Shot) -> None:
        self._note = None
        self.history = [{"role": "user", "content": [{"type": "input_text", "text": prompt},
                                                     {"type": "input_image", "image_url": shot.data_url}]}]

    async def call(self) -> Turn:
        self._fit_window()
        self._keep_screens()
        body: dict[str, Any] = {"model": self.cfg.model, "input": self.history, "tools": self.tools,
                                "instructions": self.instructions, "max_output_tokens": self.cfg.max_tokens,
                                "truncation": "auto"}
        if self.cfg.temperature is not None:
            body["temperature"] = self.cfg.temperature
        resp = await post(self.client, "/responses", body, Response)
        usage: CallUsage | None = None  # an OpenAI-compatible server may send none
        if resp.usage is not None:
            details = resp.usage.input_tokens_details
            usage = CallUsage(resp.usage.input_tokens, resp.usage.output_tokens,
                              details.cached_tokens if details is not None else 0)
        calls = [i for i in resp.output if i.type in ("computer_call", "function_call")]
        text = "\n".join(c.text for i in resp.output if i.type == "message" for c in i.content
                         if c.type == "output_text").strip()
        self.window.begin_turn(len(self.history), text, calls)
        for item in resp.output:
            data = item.to_dict(mode="json")
            data.pop("created_by", None)
            data.pop("parsed_arguments", None)
            self.history.append(data)
        problem = None
        if resp.status not in ("completed", None) and not calls:
            problem = f"the reply was {resp.status}"
        return Turn(text=text, usage=usage, calls=calls, problem=problem)

    async def act(self, turn: Turn, do: Do, look: Look) -> Acted:
        acted = Acted()
        self.driver.do, self.driver.look = do, look
        notes: list[str] = []
        if turn.problem is not None and not turn.calls:
            acted.invalid.append(turn.problem)
            self.history.append({"role": "user", "content": f"Error: {turn.problem}. Try again."})
            return acted
        for call in turn.calls:
            if isinstance(call, ResponseFunctionToolCall):
                self.history.append(await self._function(call, do, acted))
                continue
            assert isinstance(call, ResponseComputerToolCall)
            if acted.end is not None:
                self.history.append(await self._screenshot_only(call, look))
                continue
            self.driver.done = 0
            output: dict[str, Any]
            try:
                output = dict(await self.toolset.execute(call, approve_safety_checks=self._approver(do)))
            except ActionFailed as e:
                if e.invalid:
                    acted.invalid.append(str(e))
                notes.append(f"Error: {e}")
                output = await self._screenshot_only(call, look)
            except ComputerUseError as e:  # the SDK's checks: an invalid action, refused safety checks
                refused = "approval" in str(e)
                if not refused:
                    acted.invalid.append(str(e))
                notes.append("The operator did not approve this; nothing was done." if refused else f"Error: {e}")
                output = await self._screenshot_only(call, look)
            acted.done += self.driver.done
            self.history.append(output)
        if notes:
            self.history.append({"role": "user", "content": "\n".join(notes)})
        return acted

    def _approver(self, do: Do) -> Any:
        async def approve(call: ResponseComputerToolCall) -> bool:
            """Pending safety checks, decided by the case's operator.approvals (as /approval)."""
            for check in call.pending_safety_checks or []:
                res = await do(A.RequestApproval(what=f"safety check {check.code or check.id}: "
                                                      f"{check.message or 'no message'}"))
                if res.error:
                    return False
            return True
        return approve

    async def _screenshot_only(self, call: ResponseComputerToolCall, look: Look) -> dict[str, Any]:
        shot = await look()
        return {"type": "computer_call_output", "call_id": call.call_id,
                "output": {"type": "computer_screenshot", "image_url": shot.data_url}}

    async def _function(self, call: ResponseFunctionToolCall, do: Do, acted: Acted) -> dict[str, Any]:
        try:
            args = json.loads(call.arguments or "{}")
            action = extra_action(call.name, args)
        except (ValueError, A.InvalidAction) as e:
            acted.invalid.append(str(e))
            return {"type": "function_call_output", "call_id": call.call_id, "output": f"Error: {e}"}
        if isinstance(action, A.Done | A.Infeasible):
            acted.end = action
            return {"type": "function_call_output", "call_id": call.call_id, "output": "noted"}
        res = await do(action)
        if res.invalid:
            acted.invalid.append(res.text)
        else:
            acted.done += 1
        return {"type": "function_call_output", "call_id": call.call_id,
                "output": ("Error: " if res.error else "") + res.text}

    def _fit_window(self) -> None:
        """Condense the oldest turns once there are too many (window.py); the note follows the prompt."""
        span = self.window.cut()
        if span is None:
            return
        del self.history[span[0]:span[1]]
        if self._note is None:
            self._note = {"type": "input_text", "text": ""}
            self.history[0]["content"].insert(1, self._note)
        self._note["text"] = self.window.note()

    def _keep_screens(self) -> None:
        """Only the last keep_screens screenshots stay; older ones become a small grey placeholder (the API
        needs an image in every computer_call_output)."""
        images: list[dict[str, Any]] = []
        for item in self.history:
            if item.get("type") == "computer_call_output":
                images.append(item["output"])
            elif item.get("role") == "user" and isinstance(item.get("content"), list):
                images += [p for p in item["content"] if p.get("type") == "input_image"]
        for image in images[:-self.cfg.keep_screens]:
            image["image_url"] = PLACEHOLDER
