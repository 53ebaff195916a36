"""The desktop's accessibility tree, read with pyatspi (Debian's python3-pyatspi) as the session's user,
shaped by a11y.py; and the text of the focused terminal.

The walk is bounded: MAX_DEPTH levels, the first MAX_WIDTH children of a node, MAX_NODES in all, and a
deadline (an application that stops answering AT-SPI would otherwise hold the check); a spreadsheet's
table gives only its cells on the screen (it has millions).
"""

from __future__ import annotations

import time
from typing import Any

from lxml import etree

from gh_osworld import a11y
from gh_osworld.registry import getter

MAX_DEPTH = 50
MAX_WIDTH = 1024
MAX_NODES = 20000
DEADLINE_S = 60.0


class _Walk:
    def __init__(self, pyatspi: Any) -> None:
        self.pyatspi = pyatspi
        self.nodes = 0
        self.deadline = time.monotonic() + DEADLINE_S

    def exhausted(self) -> bool:
        return self.nodes >= MAX_NODES or time.monotonic() > self.deadline

    def read(self, acc: Any) -> a11y.Node:
        node = a11y.Node(role=_call(acc.getRoleName, ""), name=_call(lambda: acc.name, "") or "")
        state_set = _call(acc.getState, None)
        if state_set is not None:
            node.states = [state_name(self.pyatspi, s) for s in state_set.getStates()]
        node.attributes = dict(_call(acc.get_attributes, {}) or {})
        text = _call(acc.queryText, None)
        if text is not None:
            node.text = _call(lambda: text.getText(0, text.characterCount), "") or ""
        component = _call(acc.queryComponent, None)
        if component is not None:
            node.extents = _call(lambda: tuple(component.getExtents(self.pyatspi.XY_SCREEN)), None)
        node.image = _call(acc.queryImage, None) is not None
        node.selection = _call(acc.querySelection, None) is not None
        value = _call(acc.queryValue, None)
        if value is not None:
            for key, attr in (("value", "currentValue"), ("min", "minimumValue"), ("max", "maximumValue"),
                              ("step", "minimumIncrement")):
                got = _call(lambda attr=attr: getattr(value, attr), None)
                if got is not None:
                    node.value[key] = str(got)
        action = _call(acc.queryAction, None)
        if action is not None:
            for i in range(_call(lambda: action.nActions, 0)):
                node.actions.append((_call(lambda i=i: action.getName(i), ""),
                                     _call(lambda i=i: action.getDescription(i), ""),
                                     _call(lambda i=i: action.getKeyBinding(i), "")))
        return node

    def walk(self, acc: Any, depth: int, in_sheet: bool) -> etree._Element:
        self.nodes += 1
        node = self.read(acc)
        el = a11y.element(node)
        in_sheet = in_sheet or node.role == "document spreadsheet"
        if depth >= MAX_DEPTH:
            return el
        count = min(_call(lambda: acc.childCount, 0), MAX_WIDTH)
        for i in range(count):
            if self.exhausted():
                break
            child = _call(lambda i=i: acc.getChildAtIndex(i), None)
            if child is None:
                continue
            if in_sheet and node.role == "table":
                showing = _call(lambda c=child: c.getState().contains(self.pyatspi.STATE_SHOWING), False)
                if not showing:
                    continue
            el.append(self.walk(child, depth + 1, in_sheet))
        return el


def state_name(pyatspi: Any, state: Any) -> str:
    """A state as OSWorld's tree names it: STATE_MULTI_LINE is "multi_line"."""
    lookup = getattr(pyatspi.StateType, "_enum_lookup", None)
    if isinstance(lookup, dict) and state in lookup:
        return str(lookup[state]).split("_", 1)[1].lower()
    return str(getattr(state, "value_nick", state)).replace("-", "_")


def _call(f: Any, default: Any) -> Any:
    """One AT-SPI call: an accessible that lacks the interface, or went away, gives the default."""
    try:
        return f()
    except Exception:  # pyatspi raises NotImplementedError, GLib errors, LookupError for a gone object
        return default


def read_tree() -> etree._Element:
    import pyatspi  # the guest's python3-pyatspi; loaded only when a check reads the tree

    walk = _Walk(pyatspi)
    root = a11y.desktop()
    desktop = pyatspi.Registry.getDesktop(0)
    for i in range(min(desktop.childCount, MAX_WIDTH)):
        app = _call(lambda i=i: desktop.getChildAtIndex(i), None)
        if app is not None and not walk.exhausted():
            root.append(walk.walk(app, 1, False))
    return root


@getter("accessibility_tree")
def accessibility_tree(spec: dict[str, Any]) -> str:
    return a11y.to_string(read_tree())


def focused_terminal_text(root: etree._Element) -> str | None:
    """The text of the focused terminal in the active window, right-trimmed; None when no terminal has the
    focus there (OSWorld reads GNOME Terminal's; here any application's terminal)."""
    found = root.xpath('//frame[@st:active="true"]//terminal[@st:focused="true"]', namespaces=a11y.NS)
    if len(found) != 1:
        return None
    return (found[0].text or "").rstrip()


@getter("vm_terminal_output")
def vm_terminal_output(spec: dict[str, Any]) -> str | None:
    return focused_terminal_text(read_tree())
