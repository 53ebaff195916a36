"""Input events: the shapes of the Evals API's `POST /v1/start_states/{id}/input` (docs/start-states.md),
one definition for the API, the runner <-> server protocol and the providers that deliver them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from gh_wire.answer import GuestText

# ---------------------------------------------------------------------------------------------

MAX_TYPE_TEXT = 10_000
MAX_KEYS = 8
MAX_HOLD_MS = 10_000


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClickEvent(_Event):
    type: Literal["click"] = "click"
    x: int = Field(ge=0, le=16384)
    y: int = Field(ge=0, le=16384)
    button: Literal["left", "right", "middle"] = "left"


class DoubleClickEvent(_Event):
    type: Literal["double_click"] = "double_click"
    x: int = Field(ge=0, le=16384)
    y: int = Field(ge=0, le=16384)
    button: Literal["left", "right", "middle"] = "left"


class MoveEvent(_Event):
    type: Literal["move"] = "move"
    x: int = Field(ge=0, le=16384)
    y: int = Field(ge=0, le=16384)


class MouseDownEvent(_Event):
    """Press a button at x,y and keep it pressed (a drag is a mouse_down, moves and a mouse_up)."""

    type: Literal["mouse_down"] = "mouse_down"
    x: int = Field(ge=0, le=16384)
    y: int = Field(ge=0, le=16384)
    button: Literal["left", "right", "middle"] = "left"


class MouseUpEvent(_Event):
    type: Literal["mouse_up"] = "mouse_up"
    x: int = Field(ge=0, le=16384)
    y: int = Field(ge=0, le=16384)
    button: Literal["left", "right", "middle"] = "left"


class ScrollEvent(_Event):
    type: Literal["scroll"] = "scroll"
    x: int = Field(ge=0, le=16384)
    y: int = Field(ge=0, le=16384)
    dy: int = Field(default=0, ge=-100, le=100, description="notches; positive scrolls down")
    dx: int = Field(default=0, ge=-100, le=100, description="notches; positive scrolls right")


class TypeEvent(_Event):
    type: Literal["type"] = "type"
    text: GuestText = Field(max_length=MAX_TYPE_TEXT)


class KeyEvent(_Event):
    type: Literal["key"] = "key"
    keys: list[str] = Field(min_length=1, max_length=MAX_KEYS, description='e.g. ["CTRL", "ALT", "DELETE"]')
    hold_ms: int | None = Field(default=None, ge=1, le=MAX_HOLD_MS,
                                description="hold the chord this long before releasing it (default: a tap)")

    @model_serializer(mode="wrap")
    def _tap_as_before(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A tap (no hold_ms) serialises as the API's key event always has: {"type": "key", "keys": [...]}.
        data: dict[str, Any] = handler(self)
        if data.get("hold_ms") is None:
            data.pop("hold_ms", None)
        return data


InputEvent = Annotated[
    ClickEvent | DoubleClickEvent | MouseDownEvent | MouseUpEvent | MoveEvent | ScrollEvent | TypeEvent | KeyEvent,
    Field(discriminator="type"),
]
