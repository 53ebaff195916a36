"""The accessibility tree as XML, shaped as OSWorld's checks select in it.

Each accessible is an element named for its role (spaces as dashes: `push-button`, `page-tab-list`),
with attributes: `name`; every state true as `st:<state>="true"` (`st:focused`, `st:showing`, ...); the
toolkit's object attributes as `attr:<key>` (`attr:id`, `attr:class`); on a visible, showing component
`cp:screencoord="(x, y)"` and `cp:size="(w, h)"`; a value as `val:value|min|max|step`; actions as
`act:<name>_desc` and `act:<name>_kb`; `image` and `selection` set to "true" when the accessible has those
interfaces. Its text, if any, is the element's text. The root is `desktop-frame`, its children the
applications.

Reading the live tree (pyatspi) is getters/a11y.py; this module only shapes what was read, so it is
tested without a desktop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lxml import etree

# OSWorld's namespaces for an Ubuntu desktop's tree, as its check_accessibility_tree selects in it (desktop-env
# 1.0.2's `_accessibility_ns_map["ubuntu"]`) and as the machine API serves the tree to agents
# (providers/qemu/atspi_tree.py): a rule with `st:` or `cp:` in it finds what OSWorld's finds.
_BASE = "https://accessibility.ubuntu.example.org/ns/"
NS = {"st": _BASE + "state", "attr": _BASE + "attributes", "cp": _BASE + "component", "doc": _BASE + "document",
      "docattr": _BASE + "document/attributes", "txt": _BASE + "text", "val": _BASE + "value",
      "act": _BASE + "action"}


@dataclass
class Node:
    """What was read of one accessible."""

    role: str
    name: str = ""
    states: list[str] = field(default_factory=list)
    attributes: dict[str, str] = field(default_factory=dict)
    text: str = ""
    extents: tuple[int, int, int, int] | None = None  # x, y, width, height on the screen
    value: dict[str, str] = field(default_factory=dict)  # value, min, max, step
    actions: list[tuple[str, str, str]] = field(default_factory=list)  # name, description, key binding
    image: bool = False
    selection: bool = False


def _q(prefix: str, local: str) -> str:
    return f"{{{NS[prefix]}}}{local}"


def _safe_local(name: str) -> str | None:
    """An attribute's local name as XML allows it (toolkits give keys like "xml-roles"), None when none."""
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)
    return cleaned if cleaned and (cleaned[0].isalpha() or cleaned[0] == "_") else None


def element(node: Node) -> etree._Element:
    attrib: dict[str, str] = {"name": node.name}
    for state in node.states:
        local = _safe_local(state)
        if local:
            attrib[_q("st", local)] = "true"
    for key, value in node.attributes.items():
        local = _safe_local(key)
        if local:
            attrib[_q("attr", local)] = value
    if node.extents is not None and "visible" in node.states and "showing" in node.states:
        x, y, w, h = node.extents
        attrib[_q("cp", "screencoord")] = str((x, y))
        attrib[_q("cp", "size")] = str((w, h))
    if node.image:
        attrib["image"] = "true"
    if node.selection:
        attrib["selection"] = "true"
    for key, value in node.value.items():
        attrib[_q("val", key)] = value
    for name, description, binding in node.actions:
        local = _safe_local(name.replace(" ", "-"))
        if local:
            attrib[_q("act", f"{local}_desc")] = description
            attrib[_q("act", f"{local}_kb")] = binding
    tag = _safe_local((node.role.strip() or "unknown").replace(" ", "-")) or "unknown"
    el = etree.Element(tag, attrib=attrib, nsmap=NS)  # type: ignore[arg-type]
    text = node.text.replace("\ufffc", "").replace("\ufffd", "")
    if text:
        el.text = _xml_text(text)
    return el


def _xml_text(text: str) -> str:
    """The text without the characters XML 1.0 cannot hold (control characters a terminal shows)."""
    return "".join(c for c in text if c in "\t\n\r" or ord(c) >= 0x20)


def desktop() -> etree._Element:
    return etree.Element("desktop-frame", nsmap=NS)  # type: ignore[arg-type]


def to_string(root: etree._Element) -> str:
    return etree.tostring(root, encoding="unicode")
