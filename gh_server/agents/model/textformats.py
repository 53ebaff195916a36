"""Actions written as text by open models on Chat Completions: pyautogui code (OSWorld's baselines,
OpenCUA) and UI-TARS action lines. Read with Python's `ast` (never evaluated): only the calls below,
with literal arguments, are actions; anything else makes the reply invalid (sent back to the model).

pyautogui coordinates are pixels of the scaled screen; UI-TARS's are on a 0-1000 grid (`Scale.from_grid`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gh_server.agents.model import actions as A

CODE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)
# OSWorld's special replies: the task is done, cannot be done, or the agent waits.
SPECIAL = {"DONE", "FAIL", "WAIT"}


@dataclass
class Parsed:
    text: str  # the reply's words outside the code or action lines
    actions: list[A.Action]


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        raise A.InvalidAction(f"arguments must be literal values, not {ast.unparse(node)!r}") from None


def _call_parts(node: ast.AST) -> tuple[str, list[Any], dict[str, Any]]:
    if not isinstance(node, ast.Expr) or not isinstance(node.value, ast.Call):
        raise A.InvalidAction(f"not a call: {ast.unparse(node)[:200]!r}")
    call = node.value
    name = ast.unparse(call.func)
    return name, [_literal(a) for a in call.args], {k.arg or "": _literal(k.value) for k in call.keywords}


def _pyautogui(name: str, args: list[Any], kw: dict[str, Any]) -> list[A.Action]:
    def xy() -> tuple[int, int]:
        x = kw.get("x", args[0] if args else None)
        y = kw.get("y", args[1] if len(args) > 1 else None)
        if x is None or y is None:
            raise A.InvalidAction(f"{name} needs x and y (the pointer position is not tracked in pyautogui mode)")
        return round(float(x)), round(float(y))

    short = name.removeprefix("pyautogui.")
    if short in ("click", "doubleClick", "tripleClick", "rightClick", "middleClick"):
        x, y = xy()
        clicks = {"doubleClick": 2, "tripleClick": 3}.get(short, int(kw.get("clicks", 1)))
        button = {"rightClick": "right", "middleClick": "middle"}.get(short, str(kw.get("button", "left")))
        return [A.Click(x=x, y=y, clicks=clicks, button=button)]  # type: ignore[arg-type]
    if short == "moveTo":
        x, y = xy()
        return [A.Move(x=x, y=y)]
    if short == "dragTo":
        raise A.InvalidAction("dragTo needs a start: use pyautogui.moveTo(x0, y0) then pyautogui.dragTo(x1, y1)")
    if short in ("scroll", "hscroll"):
        clicks = int(kw.get("clicks", args[0] if args else 0))
        x, y = round(float(kw.get("x", args[1] if len(args) > 1 else 0))), round(float(kw.get("y", 0)))
        # pyautogui: positive scrolls up (and right for hscroll); our dy is positive down.
        return [A.Scroll(x=x, y=y, dy=-clicks)] if short == "scroll" else [A.Scroll(x=x, y=y, dx=clicks)]
    if short in ("write", "typewrite"):
        text = kw.get("message", args[0] if args else "")
        if isinstance(text, list):
            return [A.Key(keys=[str(k)]) for k in text]
        return [A.Type(text=str(text))]
    if short == "press":
        keys = kw.get("keys", args[0] if args else "")
        presses = int(kw.get("presses", 1))
        names = keys if isinstance(keys, list) else [keys]
        return [A.Key(keys=[str(k)], repeat=presses) for k in names]
    if short == "hotkey":
        return [A.Key(keys=[str(k) for k in args])]
    if name == "time.sleep":
        return [A.Wait(seconds=float(args[0] if args else kw.get("secs", 1)))]
    raise A.InvalidAction(f"{name}() is not one of the pyautogui calls this agent runs")


def parse_pyautogui(reply: str) -> Parsed:
    """The actions in a pyautogui reply: code blocks, or a bare DONE / FAIL / WAIT.

    Raises:
        InvalidAction: code that does not parse or calls something else.
    """
    blocks = CODE.findall(reply)
    text = CODE.sub("", reply).strip()
    stripped = reply.strip()
    if not blocks and stripped in SPECIAL:
        blocks = [stripped]
        text = ""
    actions: list[A.Action] = []
    last_move: tuple[int, int] | None = None
    for block in blocks:
        if block.strip() in SPECIAL:
            word = block.strip()
            actions.append(A.Done(answer=text) if word == "DONE" else A.Infeasible(reason=text)
                           if word == "FAIL" else A.Wait(seconds=2.0))
            continue
        try:
            tree = ast.parse(block)
        except SyntaxError as e:
            raise A.InvalidAction(f"the code does not parse: {e.msg} (line {e.lineno})") from None
        for node in tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                continue  # `import pyautogui, time` is harmless and usual
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Name) and node.value.id in SPECIAL:
                word = node.value.id
                actions.append(A.Done(answer=text) if word == "DONE" else A.Infeasible(reason=text)
                               if word == "FAIL" else A.Wait(seconds=2.0))
                continue
            name, args, kw = _call_parts(node)
            if name == "pyautogui.dragTo":
                if last_move is None:
                    raise A.InvalidAction("dragTo needs a start: pyautogui.moveTo(x0, y0) first")
                x, y = round(float(kw.get("x", args[0]))), round(float(kw.get("y", args[1])))
                if actions and isinstance(actions[-1], A.Move):
                    actions.pop()
                actions.append(A.Drag(path=[last_move, (x, y)]))
                last_move = (x, y)
                continue
            try:
                got = _pyautogui(name, args, kw)
            except (ValueError, TypeError, IndexError) as e:
                raise A.InvalidAction(f"{name}: {e}") from None
            for a in got:
                if isinstance(a, A.Move | A.Click):
                    last_move = (a.x, a.y)
            actions += got
    return Parsed(text=text, actions=actions)


UITARS_ACTION = re.compile(r"^\s*Action:\s*(.*)$", re.S | re.M)
_NUM = r"\s*(-?\d+(?:\.\d+)?)\s*"
BOX = re.compile(rf"\(?{_NUM},{_NUM}(?:,{_NUM},{_NUM})?\)?")


def _box(value: Any, grid: Callable[[int, int], tuple[int, int]]) -> tuple[int, int]:
    s = re.sub(r"<\|?/?box_(start|end)\|?>|<\|?/?point\|?>|<point>|</point>", "", str(value))
    m = BOX.search(s)
    if m is None:
        raise A.InvalidAction(f"not a point or box: {value!r}")
    nums = [float(g) for g in m.groups() if g is not None]
    if len(nums) == 4:
        x, y = (nums[0] + nums[2]) / 2, (nums[1] + nums[3]) / 2
    else:
        x, y = nums[0], nums[1]
    if not (0 <= x <= 1000 and 0 <= y <= 1000):
        raise A.InvalidAction(f"coordinates are on a 0-1000 grid: {value!r}")
    return grid(round(x), round(y))


def parse_uitars(reply: str, grid: Callable[[int, int], tuple[int, int]]) -> Parsed:
    """UI-TARS's `Thought: ...` then `Action: name(arg='...')` lines (several separated by blank lines).

    Raises:
        InvalidAction: an action line that does not parse or names an unknown action.
    """
    m = UITARS_ACTION.search(reply)
    if m is None:
        return Parsed(text=reply.strip(), actions=[])
    thought = reply[:m.start()].strip()
    thought = re.sub(r"^\s*(Thought|Reflection|Action_Summary):\s*", "", thought, flags=re.M).strip()
    actions: list[A.Action] = []
    for line in [s.strip() for s in re.split(r"\n\s*\n|\n(?=\w+\()", m.group(1)) if s.strip()]:
        try:
            tree = ast.parse(line)
        except SyntaxError:
            raise A.InvalidAction(f"the action does not parse: {line[:200]!r}") from None
        if len(tree.body) != 1:
            raise A.InvalidAction(f"one action per line: {line[:200]!r}")
        name, args, kw = _call_parts(tree.body[0])
        actions.append(_uitars(name, args, kw, grid, thought))
    return Parsed(text=thought, actions=actions)


def _uitars(name: str, args: list[Any], kw: dict[str, Any], grid: Callable[[int, int], tuple[int, int]],
            thought: str) -> A.Action:
    def point(key: str = "start_box") -> tuple[int, int]:
        v = kw.get(key) or kw.get(key.replace("box", "point")) or kw.get("point") or (args[0] if args else None)
        if v is None:
            raise A.InvalidAction(f"{name} needs {key}")
        return _box(v, grid)

    if name in ("click", "left_single"):
        x, y = point()
        return A.Click(x=x, y=y)
    if name == "left_double":
        x, y = point()
        return A.Click(x=x, y=y, clicks=2)
    if name == "right_single":
        x, y = point()
        return A.Click(x=x, y=y, button="right")
    if name in ("drag", "select"):
        return A.Drag(path=[point("start_box"), point("end_box")])
    if name == "hotkey":
        keys = str(kw.get("key", args[0] if args else "")).split()
        if not keys:
            raise A.InvalidAction("hotkey needs key='ctrl c'")
        return A.Key(keys=keys)
    if name == "type":
        return A.Type(text=str(kw.get("content", args[0] if args else "")).replace("\\n", "\n"))
    if name == "scroll":
        x, y = point()
        direction = str(kw.get("direction", "down"))
        dx, dy = {"up": (0, -5), "down": (0, 5), "left": (-5, 0), "right": (5, 0)}.get(direction, (0, 5))
        return A.Scroll(x=x, y=y, dx=dx, dy=dy)
    if name == "wait":
        return A.Wait(seconds=5.0)
    if name == "finished":
        return A.Done(answer=str(kw.get("content", args[0] if args else "")) or thought)
    if name == "call_user":
        return A.AskUser(question=thought or "I need your help to continue.")
    raise A.InvalidAction(f"{name}() is not a UI-TARS action this agent runs")
