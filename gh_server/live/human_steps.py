"""A takeover's human steps, read from the RFB input the holder's viewer sends (gh_server/live/rfb.py).

What is kept of a person's input is what the replay may show (docs/server-api.md, "Takeovers"):
- printable characters typed (a key press whose keysym is in Latin-1's printable ranges, with no
  modifier but Shift held) are counted, never stored: one `typed` event per run of them, with how many;
- any other key press is stored by name, with the modifiers held: `Return`, `Tab`, `ctrl+c`,
  `ctrl+alt+t` (a chord shows its letter: a shortcut, not text);
- a mouse button pressed is a `click` at the pointer's x/y with its button (left, middle, right);
  the wheel and pointer moves are not steps.

Pure: `HumanSteps.add(message, at)` for each input message the relay forwards.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gh_server.live.rfb import Kind, Message
from gh_server.timestamps import ts

MAX_EVENTS = 200  # per hold; past this the counts go on and `events_dropped` says how many were not kept

_MODIFIERS = {
    0xFFE1: "shift", 0xFFE2: "shift", 0xFFE3: "ctrl", 0xFFE4: "ctrl", 0xFFE7: "meta", 0xFFE8: "meta",
    0xFFE9: "alt", 0xFFEA: "alt", 0xFE03: "altgr", 0xFFEB: "super", 0xFFEC: "super",
}
_MODIFIER_ORDER = ("ctrl", "alt", "altgr", "super", "meta", "shift")
_NAMED = {
    0xFF08: "BackSpace", 0xFF09: "Tab", 0xFF0D: "Return", 0xFF1B: "Escape", 0xFFFF: "Delete",
    0xFF50: "Home", 0xFF51: "Left", 0xFF52: "Up", 0xFF53: "Right", 0xFF54: "Down", 0xFF55: "Page_Up",
    0xFF56: "Page_Down", 0xFF57: "End", 0xFF63: "Insert", 0xFF8D: "KP_Enter", 0xFF61: "Print",
    0xFF13: "Pause", 0xFF14: "Scroll_Lock", 0xFFE5: "Caps_Lock", 0xFF7F: "Num_Lock", 0xFF67: "Menu",
    **{0xFFBE + i: f"F{i + 1}" for i in range(12)},
}
_BUTTONS = ((0x01, "left"), (0x02, "middle"), (0x04, "right"))  # RFB's button mask; 8/16 are the wheel


def printable(keysym: int) -> bool:
    """A keysym that types a character of Latin-1 (space included)."""
    return 0x20 <= keysym <= 0x7E or 0xA0 <= keysym <= 0xFF


def key_name(keysym: int) -> str:
    if printable(keysym):
        return "space" if keysym == 0x20 else chr(keysym).lower()
    return _NAMED.get(keysym, f"0x{keysym:04x}")


@dataclass
class HumanSteps:
    keys: int = 0
    clicks: int = 0
    typed: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    dropped: int = 0
    _held: dict[int, str] = field(default_factory=dict)  # modifier keysyms down now
    _buttons: int = 0

    def add(self, msg: Message, at: datetime) -> None:
        """One input message the holder sent (messages of other kinds are ignored)."""
        if msg.kind is Kind.KEY:
            (keysym,) = struct.unpack_from(">I", msg.data, 4)
            self._key(keysym, msg.key_down, at)
        elif msg.kind is Kind.QEMU_KEY:
            (keysym,) = struct.unpack_from(">I", msg.data, 4)
            self._key(keysym, msg.key_down, at)
        elif msg.kind is Kind.POINTER:
            mask, x, y = msg.data[1], *struct.unpack_from(">HH", msg.data, 2)
            pressed = mask & ~self._buttons
            self._buttons = mask
            for bit, button in _BUTTONS:
                if pressed & bit:
                    self.clicks += 1
                    self._event({"at": ts(at), "kind": "click", "x": x, "y": y, "button": button})

    def as_counts(self) -> dict[str, int]:
        return {"keys": self.keys, "clicks": self.clicks, "typed": self.typed}

    def _key(self, keysym: int, down: bool, at: datetime) -> None:
        if keysym in _MODIFIERS:
            if down:
                self._held[keysym] = _MODIFIERS[keysym]
            else:
                self._held.pop(keysym, None)
            return
        if not down:
            return
        mods = set(self._held.values())
        if printable(keysym) and mods <= {"shift", "altgr"}:
            self.typed += 1
            last = self.events[-1] if self.events else None
            if last is not None and last["kind"] == "typed" and not self.dropped:
                last["count"] += 1  # a run of characters is one event, at its first
            else:
                self._event({"at": ts(at), "kind": "typed", "count": 1})
            return
        self.keys += 1
        chord = [m for m in _MODIFIER_ORDER if m in mods and not (m == "shift" and printable(keysym))]
        self._event({"at": ts(at), "kind": "key", "keys": "+".join([*chord, key_name(keysym)])})

    def _event(self, event: dict[str, Any]) -> None:
        if len(self.events) >= MAX_EVENTS:
            self.dropped += 1
        else:
            self.events.append(event)


__all__ = ["MAX_EVENTS", "HumanSteps", "key_name", "printable"]
