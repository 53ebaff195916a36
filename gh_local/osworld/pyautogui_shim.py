"""pyautogui for imported OSWorld tasks: the calls their setups make, done with xdotool.

Shipped into the guest by the setup (gh_local/osworld/shims.py) as `pyautogui.py` on PYTHONPATH when the
real package is not installed there, so a task's own `python -c "import pyautogui; ..."` keeps its
meaning: the guest has xdotool and no network to install pyautogui from. It runs in the guest's python3
with the standard library only. What it does not offer raises NotImplementedError naming the call, so a
setup that needs it fails loudly instead of doing half of what it says.
"""

import subprocess
import time

FAILSAFE = False
PAUSE = 0.1
MINIMUM_DURATION = 0.1

_KEYS = {
    "enter": "Return", "return": "Return", "\n": "Return", "esc": "Escape", "escape": "Escape",
    "tab": "Tab", "\t": "Tab", "backspace": "BackSpace", "delete": "Delete", "del": "Delete",
    "space": "space", " ": "space", "ctrl": "ctrl", "ctrlleft": "Control_L", "ctrlright": "Control_R",
    "control": "ctrl", "shift": "shift", "shiftleft": "Shift_L", "shiftright": "Shift_R", "alt": "alt",
    "altleft": "Alt_L", "altright": "Alt_R", "win": "super", "winleft": "Super_L", "winright": "Super_R",
    "super": "super", "command": "super", "cmd": "super", "option": "alt", "up": "Up", "down": "Down",
    "left": "Left", "right": "Right", "home": "Home", "end": "End", "pageup": "Prior", "pgup": "Prior",
    "pagedown": "Next", "pgdn": "Next", "insert": "Insert", "capslock": "Caps_Lock", "numlock": "Num_Lock",
    "printscreen": "Print", "prtsc": "Print", "prtscr": "Print", "menu": "Menu", "apps": "Menu",
    ",": "comma", ".": "period", "/": "slash", "\\": "backslash", "-": "minus", "=": "equal",
    "+": "plus", ";": "semicolon", ":": "colon", "'": "apostrophe", '"': "quotedbl", "[": "bracketleft",
    "]": "bracketright", "{": "braceleft", "}": "braceright", "`": "grave", "~": "asciitilde",
    "!": "exclam", "@": "at", "#": "numbersign", "$": "dollar", "%": "percent", "^": "asciicircum",
    "&": "ampersand", "*": "asterisk", "(": "parenleft", ")": "parenright", "_": "underscore",
    "<": "less", ">": "greater", "?": "question", "|": "bar",
}
_KEYS.update({f"f{i}": f"F{i}" for i in range(1, 25)})
_BUTTONS = {"left": "1", "middle": "2", "right": "3", "primary": "1", "secondary": "3"}


def _key(name):
    if not isinstance(name, str) or not name:
        raise ValueError(f"pyautogui shim: {name!r} is not a key name")
    return _KEYS.get(name.lower(), name)


def _x(*args):
    subprocess.run(["xdotool", *[str(a) for a in args]], check=True, timeout=60)


def _pause():
    if PAUSE:
        time.sleep(PAUSE)


def _xy(x, y):
    if isinstance(x, (tuple, list)):
        x, y = x[0], x[1]
    return x, y


def size():
    out = subprocess.run(["xdotool", "getdisplaygeometry"], check=True, timeout=60,
                         capture_output=True, text=True).stdout.split()
    return int(out[0]), int(out[1])


def position():
    out = subprocess.run(["xdotool", "getmouselocation", "--shell"], check=True, timeout=60,
                         capture_output=True, text=True).stdout
    vals = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return int(vals["X"]), int(vals["Y"])


def moveTo(x=None, y=None, duration=0.0, *args, **kwargs):
    x, y = _xy(x, y)
    if x is not None and y is not None:
        _x("mousemove", "--sync", int(x), int(y))
    _pause()


def moveRel(xOffset=0, yOffset=0, duration=0.0, *args, **kwargs):
    _x("mousemove_relative", "--sync", "--", int(xOffset or 0), int(yOffset or 0))
    _pause()


move = moveRel


def click(x=None, y=None, clicks=1, interval=0.0, button="left", duration=0.0, *args, **kwargs):
    x, y = _xy(x, y)
    if x is not None and y is not None:
        _x("mousemove", "--sync", int(x), int(y))
    _x("click", "--repeat", int(clicks), "--delay", int(float(interval) * 1000) or 1,
       _BUTTONS.get(str(button).lower(), "1"))
    _pause()


def doubleClick(x=None, y=None, interval=0.0, button="left", *args, **kwargs):
    click(x, y, clicks=2, interval=interval, button=button)


def tripleClick(x=None, y=None, interval=0.0, button="left", *args, **kwargs):
    click(x, y, clicks=3, interval=interval, button=button)


def rightClick(x=None, y=None, *args, **kwargs):
    click(x, y, button="right")


def middleClick(x=None, y=None, *args, **kwargs):
    click(x, y, button="middle")


def mouseDown(x=None, y=None, button="left", *args, **kwargs):
    moveTo(x, y)
    _x("mousedown", _BUTTONS.get(str(button).lower(), "1"))
    _pause()


def mouseUp(x=None, y=None, button="left", *args, **kwargs):
    moveTo(x, y)
    _x("mouseup", _BUTTONS.get(str(button).lower(), "1"))
    _pause()


def dragTo(x=None, y=None, duration=0.0, button="left", *args, **kwargs):
    x, y = _xy(x, y)
    mouseDown(button=button)
    moveTo(x, y)
    mouseUp(button=button)


def scroll(clicks, x=None, y=None, *args, **kwargs):
    moveTo(x, y)
    if int(clicks):
        _x("click", "--repeat", abs(int(clicks)), "--delay", 20, "4" if int(clicks) > 0 else "5")
    _pause()


def typewrite(message, interval=0.0, *args, **kwargs):
    if isinstance(message, (list, tuple)):  # pyautogui: a list is key names, pressed in turn
        for k in message:
            press(k, interval=interval)
        return
    _x("type", "--delay", int(float(interval) * 1000) or 12, "--", str(message))
    _pause()


write = typewrite


def press(keys, presses=1, interval=0.0, *args, **kwargs):
    names = keys if isinstance(keys, (list, tuple)) else [keys]
    for _ in range(int(presses)):
        for k in names:
            _x("key", "--", _key(k))
            if interval:
                time.sleep(float(interval))
    _pause()


def keyDown(key, *args, **kwargs):
    _x("keydown", "--", _key(key))
    _pause()


def keyUp(key, *args, **kwargs):
    _x("keyup", "--", _key(key))
    _pause()


def hotkey(*keys, **kwargs):
    if len(keys) == 1 and isinstance(keys[0], (list, tuple)):
        keys = tuple(keys[0])
    _x("key", "--", "+".join(_key(k) for k in keys))
    _pause()


def sleep(seconds):
    time.sleep(seconds)


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args, **kwargs):
        raise NotImplementedError(f"pyautogui.{name} is not offered by gh-runner's pyautogui shim (xdotool)")

    return missing
