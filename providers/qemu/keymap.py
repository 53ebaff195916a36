"""Key names as agents write them, and printable ASCII, to Linux input keycodes (US layout)."""

from __future__ import annotations

from providers.errors import InputNotSupported

SHIFT = 42

_BASE: dict[str, int] = {
    "ESC": 1, "BACKSPACE": 14, "TAB": 15, "ENTER": 28, "LEFTCTRL": 29, "LEFTSHIFT": 42, "RIGHTSHIFT": 54,
    "LEFTALT": 56, "SPACE": 57, "CAPSLOCK": 58, "NUMLOCK": 69, "SCROLLLOCK": 70, "RIGHTCTRL": 97,
    "SYSRQ": 99, "RIGHTALT": 100, "HOME": 102, "UP": 103, "PAGEUP": 104, "LEFT": 105, "RIGHT": 106,
    "END": 107, "DOWN": 108, "PAGEDOWN": 109, "INSERT": 110, "DELETE": 111, "PAUSE": 119,
    "LEFTMETA": 125, "RIGHTMETA": 126, "COMPOSE": 127,
    "F1": 59, "F2": 60, "F3": 61, "F4": 62, "F5": 63, "F6": 64, "F7": 65, "F8": 66, "F9": 67, "F10": 68,
    "F11": 87, "F12": 88,
}

# Names agents use (xdotool, Playwright, pyautogui, Anthropic computer-use), compared after
# upper-casing and dropping "_", "-" and spaces.
_ALIASES: dict[str, str] = {
    "CTRL": "LEFTCTRL", "CONTROL": "LEFTCTRL", "LCTRL": "LEFTCTRL", "CONTROLLEFT": "LEFTCTRL",
    "CTRLL": "LEFTCTRL", "RCTRL": "RIGHTCTRL", "CONTROLRIGHT": "RIGHTCTRL", "CTRLR": "RIGHTCTRL",
    "ALT": "LEFTALT", "LALT": "LEFTALT", "OPTION": "LEFTALT", "ALTLEFT": "LEFTALT", "ALTL": "LEFTALT",
    "RALT": "RIGHTALT", "ALTGR": "RIGHTALT", "ALTRIGHT": "RIGHTALT", "ALTR": "RIGHTALT",
    "SHIFT": "LEFTSHIFT", "LSHIFT": "LEFTSHIFT", "SHIFTLEFT": "LEFTSHIFT", "SHIFTL": "LEFTSHIFT",
    "RSHIFT": "RIGHTSHIFT", "SHIFTRIGHT": "RIGHTSHIFT", "SHIFTR": "RIGHTSHIFT",
    "WIN": "LEFTMETA", "WINDOWS": "LEFTMETA", "SUPER": "LEFTMETA", "META": "LEFTMETA", "CMD": "LEFTMETA",
    "COMMAND": "LEFTMETA", "LWIN": "LEFTMETA", "SUPERL": "LEFTMETA", "METALEFT": "LEFTMETA", "OS": "LEFTMETA",
    "RWIN": "RIGHTMETA", "SUPERR": "RIGHTMETA", "METARIGHT": "RIGHTMETA",
    "RETURN": "ENTER", "KPENTER": "ENTER", "ESCAPE": "ESC", "DEL": "DELETE", "INS": "INSERT",
    "BKSP": "BACKSPACE", "BACK": "BACKSPACE", "PGUP": "PAGEUP", "PRIOR": "PAGEUP", "PGDN": "PAGEDOWN",
    "PAGEDN": "PAGEDOWN", "NEXT": "PAGEDOWN", "ARROWUP": "UP", "ARROWDOWN": "DOWN", "ARROWLEFT": "LEFT",
    "ARROWRIGHT": "RIGHT", "UPARROW": "UP", "DOWNARROW": "DOWN", "LEFTARROW": "LEFT", "RIGHTARROW": "RIGHT",
    "PRINTSCREEN": "SYSRQ", "PRINT": "SYSRQ", "PRTSC": "SYSRQ", "PRTSCN": "SYSRQ", "MENU": "COMPOSE",
    "APPS": "COMPOSE", "CONTEXTMENU": "COMPOSE", "CAPS": "CAPSLOCK", "SPACEBAR": "SPACE", "BREAK": "PAUSE",
    "NUMLK": "NUMLOCK", "SCROLL": "SCROLLLOCK",
}

_LETTERS = {
    "a": 30, "b": 48, "c": 46, "d": 32, "e": 18, "f": 33, "g": 34, "h": 35, "i": 23, "j": 36, "k": 37,
    "l": 38, "m": 50, "n": 49, "o": 24, "p": 25, "q": 16, "r": 19, "s": 31, "t": 20, "u": 22, "v": 47,
    "w": 17, "x": 45, "y": 21, "z": 44,
}
_PLAIN = {
    "1": 2, "2": 3, "3": 4, "4": 5, "5": 6, "6": 7, "7": 8, "8": 9, "9": 10, "0": 11, "-": 12, "=": 13,
    "[": 26, "]": 27, ";": 39, "'": 40, "`": 41, "\\": 43, ",": 51, ".": 52, "/": 53, " ": 57,
    "\n": 28, "\t": 15,
}
_SHIFTED = {
    "!": "1", "@": "2", "#": "3", "$": "4", "%": "5", "^": "6", "&": "7", "*": "8", "(": "9", ")": "0",
    "_": "-", "+": "=", "{": "[", "}": "]", ":": ";", '"': "'", "~": "`", "|": "\\", "<": ",", ">": ".",
    "?": "/",
}


def char_keys(ch: str) -> list[int]:
    """Keycodes to press together to type one character; InputNotSupported outside US-ASCII."""
    if ch in _LETTERS:
        return [_LETTERS[ch]]
    if ch.lower() in _LETTERS and ch.isupper():
        return [SHIFT, _LETTERS[ch.lower()]]
    if ch in _PLAIN:
        return [_PLAIN[ch]]
    if ch in _SHIFTED:
        return [SHIFT, _PLAIN[_SHIFTED[ch]]]
    if ch == "\r":
        return [_PLAIN["\n"]]
    raise InputNotSupported(
        f"cannot type {ch!r} (U+{ord(ch):04X}): the keymap covers printable US-ASCII, newline and tab"
    )


def text_keys(text: str) -> list[list[int]]:
    """Validate a whole text before anything is sent, so a bad character types nothing."""
    return [char_keys(c) for c in text.replace("\r\n", "\n")]


def key_name(name: str) -> list[int]:
    """Keycodes for one key name (a modifier, a named key, or a single character)."""
    raw = name.strip()
    if len(raw) == 1:
        return char_keys(raw.lower() if raw.isalpha() else raw)
    norm = raw.upper().replace("_", "").replace("-", "").replace(" ", "")
    if norm.startswith("KEY") and len(norm) > 3:
        norm = norm[3:]
    norm = _ALIASES.get(norm, norm)
    if norm in _BASE:
        return [_BASE[norm]]
    if len(norm) == 1:
        return char_keys(norm.lower())
    raise InputNotSupported(f"unknown key name {name!r}")


def combo_keys(keys: list[str]) -> list[int]:
    """A chord such as ["CTRL", "ALT", "DELETE"] or ["ctrl+c"]: keycodes pressed together, in order."""
    names: list[str] = []
    for k in keys:
        if len(k) > 1 and "+" in k.strip("+"):
            names.extend(p for p in k.split("+") if p)
        else:
            names.append(k)
    if not names:
        raise InputNotSupported("empty key combination")
    codes: list[int] = []
    for n in names:
        for c in key_name(n):
            if c not in codes:
                codes.append(c)
    if len(codes) > 16:
        raise InputNotSupported("too many keys pressed at once (at most 16)")
    return codes
