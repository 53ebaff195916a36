"""The one action set every model API maps to (docs/agents.md, "The model agent's actions").

A closed type: each wire format (Anthropic's computer toolset, OpenAI's computer tool, a chat model's
tool calls, pyautogui code or UI-TARS text) is parsed into these, and only these reach the machine.
Coordinates are in the model's screen (`screen` of the agent's config); `gh_server.agents.model.screen`
scales them to the guest's real size.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from gh_wire.answer import GuestText
from gh_wire.input import MAX_HOLD_MS, MAX_KEYS, MAX_TYPE_TEXT

Button = Literal["left", "right", "middle"]
COORD = Field(ge=0, le=16384)


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Click(_Action):
    type: Literal["click"] = "click"
    x: int = COORD
    y: int = COORD
    button: Button = "left"
    clicks: int = Field(default=1, ge=1, le=3)
    keys: list[str] = Field(default_factory=list, max_length=MAX_KEYS)  # modifiers held (not sent: see Actor)


class MouseDown(_Action):
    type: Literal["mouse_down"] = "mouse_down"
    x: int | None = None  # None: where the pointer is
    y: int | None = None
    button: Button = "left"


class MouseUp(_Action):
    type: Literal["mouse_up"] = "mouse_up"
    x: int | None = None
    y: int | None = None
    button: Button = "left"


class Move(_Action):
    type: Literal["move"] = "move"
    x: int = COORD
    y: int = COORD


class Drag(_Action):
    type: Literal["drag"] = "drag"
    path: list[tuple[int, int]] = Field(min_length=2, max_length=100)
    button: Button = "left"

    @field_validator("path")
    @classmethod
    def _on_screen(cls, v: list[tuple[int, int]]) -> list[tuple[int, int]]:
        if any(not (0 <= x <= 16384 and 0 <= y <= 16384) for x, y in v):
            raise ValueError("path points are pixels on the screen (0 or more)")
        return v


class Scroll(_Action):
    type: Literal["scroll"] = "scroll"
    x: int = COORD
    y: int = COORD
    dx: int = Field(default=0, ge=-100, le=100)  # notches; positive: right
    dy: int = Field(default=0, ge=-100, le=100)  # notches; positive: down


class Key(_Action):
    type: Literal["key"] = "key"
    keys: list[str] = Field(min_length=1, max_length=MAX_KEYS)  # one chord, e.g. ["ctrl", "s"]
    repeat: int = Field(default=1, ge=1, le=100)


class HoldKey(_Action):
    type: Literal["hold_key"] = "hold_key"
    keys: list[str] = Field(min_length=1, max_length=MAX_KEYS)
    seconds: float = Field(gt=0, le=MAX_HOLD_MS / 1000)


class Type(_Action):
    type: Literal["type"] = "type"
    text: GuestText = Field(min_length=1, max_length=MAX_TYPE_TEXT)


class Wait(_Action):
    type: Literal["wait"] = "wait"
    seconds: float = Field(default=1.0, ge=0, le=60)


class Screenshot(_Action):
    type: Literal["screenshot"] = "screenshot"


class Zoom(_Action):
    """A part of the screen, scaled up (Anthropic's zoom)."""

    type: Literal["zoom"] = "zoom"
    region: tuple[int, int, int, int]  # x0, y0, x1, y1 in the model's screen


class Done(_Action):
    type: Literal["done"] = "done"
    answer: str = Field(default="", max_length=100_000)


class Infeasible(_Action):
    """The task cannot be done; the answer becomes `infeasible: REASON`."""

    type: Literal["infeasible"] = "infeasible"
    reason: str = Field(default="", max_length=100_000)


class AskUser(_Action):
    """A question to the simulated customer (the machine API's /ask)."""

    type: Literal["ask_user"] = "ask_user"
    question: GuestText = Field(min_length=1, max_length=8_000)


class RequestApproval(_Action):
    """Leave to do something, decided by the case's operator.approvals (the machine API's /approval)."""

    type: Literal["request_approval"] = "request_approval"
    what: GuestText = Field(min_length=1, max_length=8_000)


class Shell(_Action):
    """A script on the machine (exec), only when the agent's tools include shell."""

    type: Literal["shell"] = "shell"
    script: GuestText = Field(min_length=1, max_length=100_000)
    timeout: float = Field(default=120.0, gt=0, le=3600)


Action = Annotated[
    Click | MouseDown | MouseUp | Move | Drag | Scroll | Key | HoldKey | Type | Wait | Screenshot | Zoom
    | Done | Infeasible | AskUser | RequestApproval | Shell,
    Field(discriminator="type"),
]
_adapter: TypeAdapter[Any] = TypeAdapter(Action)

# The kinds that end the task, and the ones that touch the machine (a step of the replay's trajectory).
ENDS = ("done", "infeasible")
GUI = ("click", "mouse_down", "mouse_up", "move", "drag", "scroll", "key", "hold_key", "type")
# The kinds that send the machine a request of their own (an input, a zoomed screen, an exec), so leave
# a replay frame to note the model's words on; a wait, a screenshot (the look that follows is the
# frame), an ask or an end do not.
REQUESTS = (*GUI, "zoom", "shell")


class InvalidAction(ValueError):
    """The model asked for something that is not one of our actions, or not well formed: sent back to it
    as an error result and counted against it (max_invalid in a row end the task as agent_failed)."""


def parse(data: Any) -> Action:
    """One action from its JSON form (our tool-call schema).

    Raises:
        InvalidAction: naming the field and what is wrong, for the model to read.
    """
    try:
        action: Action = _adapter.validate_python(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "action"
        raise InvalidAction(f"{where}: {first.get('msg')}") from None
    return action


def schema() -> dict[str, Any]:
    """The JSON schema of one action (the `computer` function tool of openai-chat's tool_calls)."""
    return _adapter.json_schema()


def describe(action: Action) -> dict[str, Any]:
    """The action as the replay and the logs show it (typed text is redacted later, by the runner)."""
    return action.model_dump(exclude_defaults=False)


def answer_of(action: Done | Infeasible) -> str:
    if isinstance(action, Infeasible):
        return f"infeasible: {action.reason}"
    return action.answer
