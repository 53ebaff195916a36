"""A takeover's human steps, read from the RFB input the holder's viewer sends (gh_server/live/rfb.py).

What is kept of a person's input is what the replay may show (docs/server-api.md, "Takeovers"): counts,
never content.
- a key press that types a character, whatever its keysym, is counted, never stored: one `typed` event per
  run of them, with how many. Typing is every keysym but the function keys' block (0xfd00-0xffff) and
  vendors' keys (0x10000000 and up): Latin-1, the legacy ranges (Cyrillic, Greek, the euro sign...),
  Unicode keysyms (0x01000000 and up), the keypad (its digits type digits; with the guest's Num Lock on its
  arrows do too: the guest, not the browser, decides), dead keys and Compose (they make a character);
- a key press of the closed list `HumanKey` (gh_wire/vocab.py: Return, Tab, Escape, arrows, F1-F12...) is
  stored by that name, with the modifiers held: `Return`, `shift+Tab`;
- a chord (ctrl, alt, super or meta held) is stored with its modifiers and its key: a listed name, a letter
  a-z, a digit 0-9 or `space` (`ctrl+c`, `ctrl+alt+t`: a shortcut, not text), else `other`;
- any other press (a media key, a function key past F12) is the key `other`: no keysym is ever stored;
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
from gh_wire.vocab import HumanKey

MAX_EVENTS = 200  # per hold; past this the counts go on and `events_dropped` says how many were not kept

_MODIFIERS = {
    0xFFE1: "shift", 0xFFE2: "shift", 0xFFE3: "ctrl", 0xFFE4: "ctrl", 0xFFE7: "meta", 0xFFE8: "meta",
    0xFFE9: "alt", 0xFFEA: "alt", 0xFE03: "altgr", 0xFF7E: "altgr", 0xFFEB: "super", 0xFFEC: "super",
    0xFFED: "super", 0xFFEE: "super",  # Hyper: what a super key is on some layouts
}
_MODIFIER_ORDER = ("ctrl", "alt", "altgr", "super", "meta", "shift")
_CHORD = frozenset({"ctrl", "alt", "super", "meta"})  # held, a key is a shortcut; shift and altgr type
_NAMED = {
    0xFF08: HumanKey.BACKSPACE, 0xFF09: HumanKey.TAB, 0xFE20: HumanKey.TAB,  # ISO_Left_Tab: shift+Tab
    0xFF0D: HumanKey.RETURN, 0xFF8D: HumanKey.KP_ENTER, 0xFF1B: HumanKey.ESCAPE, 0xFFFF: HumanKey.DELETE,
    0xFF63: HumanKey.INSERT, 0xFF50: HumanKey.HOME, 0xFF57: HumanKey.END, 0xFF55: HumanKey.PAGE_UP,
    0xFF56: HumanKey.PAGE_DOWN, 0xFF51: HumanKey.LEFT, 0xFF52: HumanKey.UP, 0xFF53: HumanKey.RIGHT,
    0xFF54: HumanKey.DOWN, 0xFF61: HumanKey.PRINT, 0xFF13: HumanKey.PAUSE, 0xFF14: HumanKey.SCROLL_LOCK,
    0xFFE5: HumanKey.CAPS_LOCK, 0xFF7F: HumanKey.NUM_LOCK, 0xFF67: HumanKey.MENU,
    **{0xFFBE + i: HumanKey(f"F{i + 1}") for i in range(12)},
}
_KEYPAD = range(0xFF80, 0xFFBE)  # KP_Space .. KP_9 and KP_Equal; KP_Enter is named before this is asked
_DEAD = range(0xFE50, 0xFE94)  # dead_grave .. dead_belowdot: the first half of a composed character
_COMPOSE = 0xFF20  # Multi_key
_FUNCTION_BLOCK = range(0xFD00, 0x10000)
_VENDOR = 0x10000000  # XF86 and other vendors' keys (volume, browser...): they type nothing
_BUTTONS = ((0x01, "left"), (0x02, "middle"), (0x04, "right"))  # RFB's button mask; 8/16 are the wheel


def types(keysym: int) -> bool:
    """A keysym whose press makes (or begins) a character in the guest."""
    if keysym in _NAMED or keysym in _MODIFIERS:
        return False
    if keysym in _KEYPAD or keysym in _DEAD or keysym == _COMPOSE:
        return True
    return keysym not in _FUNCTION_BLOCK and keysym < _VENDOR


def chord_key(keysym: int) -> str:
    """The name a chord shows for its key: a listed key, an ASCII letter or digit, `space`, else `other`."""
    if keysym in _NAMED:
        return _NAMED[keysym].value
    if 0x61 <= keysym <= 0x7A or 0x30 <= keysym <= 0x39:
        return chr(keysym)
    if 0x41 <= keysym <= 0x5A:
        return chr(keysym).lower()
    return "space" if keysym == 0x20 else HumanKey.OTHER.value


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
        elif msg.kind is Kind.CUT_TEXT:
            # A paste types its characters into the machine: counted as typed, one `paste` event with how
            # many (RFB's ClientCutText is Latin-1, a byte a character), never the text.
            (chars,) = struct.unpack_from(">I", msg.data, 4)
            self.typed += chars
            self._event({"at": ts(at), "kind": "paste", "count": chars})

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
        chord = bool(mods & _CHORD)
        if types(keysym) and not chord:
            self.typed += 1
            last = self.events[-1] if self.events else None
            if last is not None and last["kind"] == "typed" and not self.dropped:
                last["count"] += 1  # a run of characters is one event, at its first
            else:
                self._event({"at": ts(at), "kind": "typed", "count": 1})
            return
        self.keys += 1
        name = chord_key(keysym) if chord else _NAMED.get(keysym, HumanKey.OTHER).value
        held = [m for m in _MODIFIER_ORDER if m in mods]
        self._event({"at": ts(at), "kind": "key", "keys": "+".join([*held, name])})

    def _event(self, event: dict[str, Any]) -> None:
        if len(self.events) >= MAX_EVENTS:
            self.dropped += 1
        else:
            self.events.append(event)


__all__ = ["MAX_EVENTS", "HumanSteps", "chord_key", "types"]
