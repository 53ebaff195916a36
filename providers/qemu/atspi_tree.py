"""The signed-in session's AT-SPI accessibility tree as XML in OSWorld's form. Runs IN THE GUEST.

The runner sends this file's source as the program of `python3 -` (`reader_script` below), as the
session's user in the session's environment (providers/qemu/desktop.py), and relays what it prints
(gh_runner/machine_requests.py, docs/desktop-guests.md). It imports only the standard library at the
top, so the host's tests build XML with it from recorded nodes; the guest's AT-SPI binding
(gir1.2-atspi-2.0, from python3-pyatspi in the image) is imported by `main` alone.

The form is the one OSWorld's agents parse (mm_agents' `linearize_accessibility_tree` and
`filter_nodes` in the `desktop-env` package): a root `desktop-frame`; one element per accessible
named by its role (spaces as `-`); the attribute `name`; each state as `st:NAME="true"`; the
toolkit's attributes as `attr:KEY`; on a visible, showing node `cp:screencoord="(x, y)"` and
`cp:size="(w, h)"`; the text interface's content as the element's text; `image`/`selection`
="true" where the node has those interfaces; `val:value|min|max|step`; actions as
`act:NAME_desc` and `act:NAME_kb`. The namespaces are OSWorld's Ubuntu ones (NS). At most
MAX_DEPTH levels and MAX_WIDTH children of a node, as OSWorld reads.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

NS = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "doc": "https://accessibility.ubuntu.example.org/ns/document",
    "docattr": "https://accessibility.ubuntu.example.org/ns/document/attributes",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
    "act": "https://accessibility.ubuntu.example.org/ns/action",
}
ROOT = "desktop-frame"
MAX_DEPTH = 50
MAX_WIDTH = 1024
# Exit codes the runner reads (providers/qemu/machine.py: accessibility_tree).
TOO_LARGE_EXIT = 3  # the tree is over the byte cap given as argv[1]
NO_BUS_EXIT = 4  # no AT-SPI registry answers in this session
NO_READER_EXIT = 5  # the guest has no AT-SPI binding (an image without python3-pyatspi)
PER_CALL_TIMEOUT_MS = 2000  # one AT-SPI call to an application that stopped answering
# Characters XML 1.0 cannot carry (an application's text may hold them), and the object-replacement
# and replacement characters OSWorld drops from text too.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff\ufffc\ufffd]")


class TooLarge(Exception):
    """The tree's XML is over the cap."""


@dataclass
class Node:
    """One accessible as read: plain data, so XML is built (and tested) without a session."""

    role: str
    name: str = ""
    states: list[str] = field(default_factory=list)  # e.g. "showing", "multi_line"
    attributes: dict[str, str] = field(default_factory=dict)
    extents: tuple[int, int, int, int] | None = None  # x, y, width, height on the screen
    text: str = ""
    image: bool = False
    selection: bool = False
    value: dict[str, float] = field(default_factory=dict)  # value, min, max, step
    actions: list[tuple[str, str, str]] = field(default_factory=list)  # name, description, key binding
    children: list[Node] = field(default_factory=list)


def clean(s: str) -> str:
    return _NOT_XML.sub("", s)


def _q(prefix: str, local: str) -> str:
    return f"{{{NS[prefix]}}}{local}"


def tag_of(role: str) -> str:
    """The element name of a role: its words joined by `-` ("push button" -> push-button); a role
    that is not a valid name becomes "unknown"."""
    tag = "-".join(role.split()) or "unknown"
    return tag if re.fullmatch(r"[A-Za-z_][\w.-]*", tag) else "unknown"


def element(node: Node) -> ET.Element:
    """The element of one node (without its children)."""
    attrib = {"name": clean(node.name)}
    for s in node.states:
        if s:
            attrib[_q("st", s)] = "true"
    for k, v in node.attributes.items():
        if k and re.fullmatch(r"[A-Za-z_][\w.-]*", k):
            attrib[_q("attr", k)] = clean(v)
    showing = "showing" in node.states and "visible" in node.states
    if showing and node.extents is not None:
        x, y, w, h = node.extents
        attrib[_q("cp", "screencoord")] = f"({x}, {y})"
        attrib[_q("cp", "size")] = f"({w}, {h})"
    if node.image:
        attrib["image"] = "true"
    if node.selection:
        attrib["selection"] = "true"
    for k, num in node.value.items():
        attrib[_q("val", k)] = str(num)
    for name, desc, kb in node.actions:
        act = "-".join(name.split())
        if act and re.fullmatch(r"[A-Za-z_][\w.-]*", act):
            attrib[_q("act", f"{act}_desc")] = clean(desc)
            attrib[_q("act", f"{act}_kb")] = clean(kb)
    el = ET.Element(tag_of(node.role), attrib)
    text = clean(node.text)
    if text:
        el.text = text
    return el


def tree_element(apps: list[Node]) -> ET.Element:
    """The whole tree: `desktop-frame` holding each application's subtree."""
    root = ET.Element(ROOT)

    def add(parent: ET.Element, node: Node, depth: int) -> None:
        el = element(node)
        parent.append(el)
        if depth < MAX_DEPTH:
            for child in node.children[:MAX_WIDTH]:
                add(el, child, depth + 1)

    for app in apps:
        add(root, app, 1)
    return root


def to_xml(apps: list[Node], max_bytes: int) -> str:
    """The tree as XML text (UTF-8 within `max_bytes`).

    Raises:
        TooLarge: the XML is over `max_bytes`.
    """
    for prefix, uri in NS.items():
        ET.register_namespace(prefix, uri)
    xml = ET.tostring(tree_element(apps), encoding="unicode")  # the namespaces used, declared on the root
    size = len(xml.encode())
    if size > max_bytes:
        raise TooLarge(f"{size} bytes")
    return xml


# -- the guest's side: reading the live tree ------------------------------------------------------


class _Budget:
    """Stops a walk whose text is already over the cap, before the rest of the tree is read."""

    def __init__(self, max_bytes: int) -> None:
        self.left = max_bytes

    def spend(self, node: Node) -> None:
        self.left -= 64 + len(node.name) + len(node.text) + 70 * len(node.states) + 90 * len(node.actions)
        self.left -= sum(len(k) + len(v) + 60 for k, v in node.attributes.items())
        if self.left < 0:
            raise TooLarge("over the cap while reading")


def _read(acc: Any, atspi: Any, depth: int, budget: _Budget) -> Node:  # pragma: no cover - runs in the guest
    def tried(fn: Any, default: Any) -> Any:
        try:
            return fn()
        except Exception:
            return default

    node = Node(role=tried(acc.get_role_name, "") or "unknown", name=tried(acc.get_name, "") or "")
    sset = tried(acc.get_state_set, None)
    if sset is not None:
        for st in sset.get_states():
            node.states.append(st.value_name.removeprefix("ATSPI_STATE_").lower())
    node.attributes = {str(k): str(v) for k, v in (tried(acc.get_attributes, None) or {}).items()}
    # Each interface's methods are called unbound on the accessible (Atspi.Text.get_text(acc, ...)): the
    # Accessible class has deprecated methods of the same names (get_text, get_action) that shadow them.
    ifaces = set(tried(acc.get_interfaces, None) or [])
    if "showing" in node.states and "visible" in node.states and "Component" in ifaces:
        r = tried(lambda: atspi.Component.get_extents(acc, atspi.CoordType.SCREEN), None)
        if r is not None:
            node.extents = (r.x, r.y, r.width, r.height)
    if "Text" in ifaces:
        node.text = tried(lambda: atspi.Text.get_text(acc, 0, atspi.Text.get_character_count(acc)), "") or ""
    node.image = "Image" in ifaces
    node.selection = "Selection" in ifaces
    if "Value" in ifaces:
        for key, getter in (("value", "get_current_value"), ("min", "get_minimum_value"),
                            ("max", "get_maximum_value"), ("step", "get_minimum_increment")):
            got = tried(lambda getter=getter: getattr(atspi.Value, getter)(acc), None)
            if got is not None:
                node.value[key] = float(got)
    if "Action" in ifaces:
        act = atspi.Action
        for i in range(tried(lambda: act.get_n_actions(acc), 0)):
            node.actions.append((tried(lambda i=i: act.get_action_name(acc, i), "") or "",
                                 tried(lambda i=i: act.get_action_description(acc, i), "") or "",
                                 tried(lambda i=i: act.get_key_binding(acc, i), "") or ""))
    budget.spend(node)
    if depth < MAX_DEPTH:
        for i in range(min(tried(acc.get_child_count, 0), MAX_WIDTH)):
            child = tried(lambda i=i: acc.get_child_at_index(i), None)
            if child is not None:
                node.children.append(_read(child, atspi, depth + 1, budget))
    return node


def main(argv: list[str]) -> int:  # pragma: no cover - runs in the guest
    max_bytes = int(argv[1])
    try:
        import gi

        gi.require_version("Atspi", "2.0")
        from gi.repository import Atspi
    except (ImportError, ValueError) as e:
        print(f"no AT-SPI binding in this guest: {e}", file=sys.stderr)
        return NO_READER_EXIT
    if Atspi.init() not in (0, 1):  # 1: already initialised
        print("AT-SPI did not initialise", file=sys.stderr)
        return NO_BUS_EXIT
    Atspi.set_timeout(PER_CALL_TIMEOUT_MS, -1)
    desktop = Atspi.get_desktop(0)
    if desktop is None:
        print("no AT-SPI registry answers in this session", file=sys.stderr)
        return NO_BUS_EXIT
    budget = _Budget(max_bytes)
    try:
        apps = [_read(desktop.get_child_at_index(i), Atspi, 1, budget)
                for i in range(min(desktop.get_child_count(), MAX_WIDTH))]
        sys.stdout.write(to_xml([a for a in apps if a is not None], max_bytes))
    except TooLarge as e:
        print(f"the accessibility tree is over {max_bytes} bytes ({e})", file=sys.stderr)
        return TOO_LARGE_EXIT
    return 0


def reader_script(max_bytes: int, seconds: float) -> str:
    """The sh script that runs this reader in the guest: this file as `python3 -`'s program, stopped
    by `timeout` at `seconds` (exit 124)."""
    from pathlib import Path

    source = Path(__file__).read_text()
    marker = "GH_ATSPI_TREE_EOF"  # on a line of its own only at the end (the quoted here-document's end)
    return (f"exec timeout -k 2 {max(1, int(seconds))} python3 - {int(max_bytes)} <<'{marker}'\n"
            f"{source}\n{marker}\n")


if __name__ == "__main__":  # pragma: no cover - runs in the guest
    sys.exit(main(sys.argv))
