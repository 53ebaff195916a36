"""OSWorld's computer_13 action space as our input events (gh_wire/input.py shapes, as JSON).

An action is `{"action_type": NAME, "parameters": {...}}` (OSWorld's desktop_env/actions.py lists the
names and parameters). Pointer actions without coordinates act where the pointer is, as pyautogui does;
`Pointer` remembers where that is (the screen's centre before any move: our input path has no "current
position", every event carries x,y). Key names go through as given: providers/qemu/keymap.py takes
pyautogui's (case-insensitive, with aliases such as ctrl, enter, esc).

Standard library only: this runs in the agent's process (gh_server/agents/osworld/loop.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ENDS = ("WAIT", "DONE", "FAIL")


class BadAction(ValueError):
    """An action that is not computer_13: the agent's error, reported back to it (never ours)."""


@dataclass
class Pointer:
    x: int
    y: int
    held_keys: list[str] = field(default_factory=list)  # KEY_DOWN ... KEY_UP: pressed with the next key
    used: bool = False  # a key was pressed with the held ones since the last KEY_DOWN


def _xy(p: dict[str, Any], ptr: Pointer) -> tuple[int, int]:
    if "x" in p and "y" in p:
        try:
            ptr.x, ptr.y = int(p["x"]), int(p["y"])
        except (TypeError, ValueError):
            raise BadAction(f"x and y must be numbers, not {p['x']!r}, {p['y']!r}") from None
    return ptr.x, ptr.y


def events(action: dict[str, Any], ptr: Pointer) -> list[dict[str, Any]]:
    """The input events for one computer_13 action ([] for one that sends none: KEY_DOWN, or a KEY_UP of
    a key pressed with another since). WAIT, DONE and FAIL are the loop's, not this function's."""
    kind = action.get("action_type")
    p = action.get("parameters") or {}
    if not isinstance(p, dict):
        raise BadAction("parameters must be an object")
    button = str(p.get("button", "left"))
    if kind == "MOVE_TO":
        x, y = _xy(p, ptr)
        return [{"type": "move", "x": x, "y": y}]
    if kind == "CLICK":
        x, y = _xy(p, ptr)
        n = int(p.get("num_clicks", 1))
        if n == 2:
            return [{"type": "double_click", "x": x, "y": y, "button": button}]
        return [{"type": "click", "x": x, "y": y, "button": button}] * max(n, 1)
    if kind == "RIGHT_CLICK":
        x, y = _xy(p, ptr)
        return [{"type": "click", "x": x, "y": y, "button": "right"}]
    if kind == "DOUBLE_CLICK":
        x, y = _xy(p, ptr)
        return [{"type": "double_click", "x": x, "y": y, "button": "left"}]
    if kind == "MOUSE_DOWN":
        return [{"type": "mouse_down", "x": ptr.x, "y": ptr.y, "button": button}]
    if kind == "MOUSE_UP":
        return [{"type": "mouse_up", "x": ptr.x, "y": ptr.y, "button": button}]
    if kind == "DRAG_TO":
        x0, y0 = ptr.x, ptr.y
        x, y = _xy(p, ptr)
        return [{"type": "mouse_down", "x": x0, "y": y0, "button": "left"}, {"type": "move", "x": x, "y": y},
                {"type": "mouse_up", "x": x, "y": y, "button": "left"}]
    if kind == "SCROLL":
        # pyautogui's scroll: positive is up; ours: positive dy is down. Horizontal: positive is right in both.
        dy, dx = -int(p.get("dy", 0)), int(p.get("dx", 0))
        return [{"type": "scroll", "x": ptr.x, "y": ptr.y, "dy": max(-100, min(100, dy)),
                 "dx": max(-100, min(100, dx))}] if dx or dy else []
    if kind == "TYPING":
        return [{"type": "type", "text": str(p.get("text", ""))}]
    if kind == "PRESS":
        ptr.used = True
        return [{"type": "key", "keys": [*ptr.held_keys, str(p.get("key", ""))]}]
    if kind == "HOTKEY":
        keys = p.get("keys")
        if not isinstance(keys, list) or not keys:
            raise BadAction("HOTKEY needs keys: a list of key names")
        return [{"type": "key", "keys": [str(k) for k in keys]}]
    if kind == "KEY_DOWN":
        ptr.held_keys.append(str(p.get("key", "")))
        ptr.used = False
        return []
    if kind == "KEY_UP":
        # Released with nothing pressed while it was down: a tap of what is held (KEY_DOWN a, KEY_UP a is `a`).
        key = str(p.get("key", ""))
        tap = [{"type": "key", "keys": list(ptr.held_keys)}] if key in ptr.held_keys and not ptr.used else []
        if key in ptr.held_keys:
            ptr.held_keys.remove(key)
        ptr.used = ptr.used and bool(ptr.held_keys)
        return tap
    raise BadAction(f"unknown computer_13 action_type {kind!r}")
