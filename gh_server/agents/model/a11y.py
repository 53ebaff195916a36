"""An accessibility tree (GET {machine.url}/accessibility: providers/qemu/atspi_tree.py) as the text
OSWorld's agents give their model: the `a11y_tree` observation.

The rules are those of `linearize_accessibility_tree` and `filter_nodes` in OSWorld's published
`desktop-env` package (mm_agents), checked side by side by bench/a11y_read.py --fidelity:

- kept: a node whose tag starts with `document` or ends with one of KEPT_SUFFIXES or is one of
  KEPT_TAGS; that is showing and visible; enabled, editable, expandable or checkable; has a name
  or text; and sits on the screen (x, y >= 0, width and height > 0);
- one line per kept node, in document order, under HEADER: tag, name, text (`""` when empty; in
  double quotes with `"` doubled when it holds one), class, description, position and size as the
  tree writes them. Class and description are read where OSWorld's linearizer reads them on Ubuntu
  (its Windows attribute namespace, ATTR_NS), so on a Linux tree they are empty there as here;
- bounded: over `max_chars` the text is cut and ends in `[...]` (OSWorld cuts at a token count
  with its tokenizer; a character bound needs none).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

STATE_NS = "https://accessibility.ubuntu.example.org/ns/state"
COMPONENT_NS = "https://accessibility.ubuntu.example.org/ns/component"
ATTR_NS = "https://accessibility.windows.example.org/ns/attributes"
HEADER = "tag\tname\ttext\tclass\tdescription\tposition (top-left x&y)\tsize (w&h)"
KEPT_SUFFIXES = ("item", "button", "heading", "label", "scrollbar", "searchbox", "textbox", "link", "tabelement",
                 "textfield", "textarea", "menu")
KEPT_TAGS = frozenset({
    "alert", "canvas", "check-box", "combo-box", "entry", "icon", "image", "paragraph", "scroll-bar", "section",
    "slider", "static", "table-cell", "terminal", "text", "netuiribbontab", "start", "trayclockwclass",
    "traydummysearchcontrol", "uiimage", "uiproperty", "uiribboncommandbar",
})
USABLE_STATES = ("enabled", "editable", "expandable", "checkable")
CUT = "[...]\n"
_PAIR = re.compile(r"\(\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*\)")


class NotATree(ValueError):
    """The text is not XML."""


def _pair(value: str | None) -> tuple[float, float]:
    m = _PAIR.fullmatch(value.strip()) if value else None
    return (float(m.group(1)), float(m.group(2))) if m else (-1.0, -1.0)


def _state(node: ET.Element, name: str) -> bool:
    return node.get(f"{{{STATE_NS}}}{name}", "false") == "true"


def kept(node: ET.Element) -> bool:
    """Whether a node is a line of the linearized tree."""
    tag = node.tag
    if not (tag.startswith("document") or tag.endswith(KEPT_SUFFIXES) or tag in KEPT_TAGS):
        return False
    if not (_state(node, "showing") and _state(node, "visible")):
        return False
    if not any(_state(node, s) for s in USABLE_STATES):
        return False
    if not (node.get("name", "") or node.text):
        return False
    x, y = _pair(node.get(f"{{{COMPONENT_NS}}}screencoord"))
    w, h = _pair(node.get(f"{{{COMPONENT_NS}}}size"))
    return x >= 0 and y >= 0 and w > 0 and h > 0


def _text(node: ET.Element) -> str:
    if not node.text:
        return '""'
    return node.text if '"' not in node.text else '"' + node.text.replace('"', '""') + '"'


def linearize(xml: str, max_chars: int | None = None) -> str:
    """The tree as OSWorld's tab-separated table, cut at `max_chars` (None: whole).

    Raises:
        NotATree: `xml` does not parse.
    """
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as e:
        raise NotATree(f"the accessibility tree is not XML: {e}") from None
    lines = [HEADER]
    for node in root.iter():
        if kept(node):
            lines.append("\t".join((
                node.tag, node.get("name", ""), _text(node), node.get(f"{{{ATTR_NS}}}class", ""),
                node.get(f"{{{ATTR_NS}}}description", ""), node.get(f"{{{COMPONENT_NS}}}screencoord", ""),
                node.get(f"{{{COMPONENT_NS}}}size", ""))))
    text = "\n".join(lines)
    if max_chars is not None and len(text) > max_chars:
        text = text[:max_chars] + CUT
    return text
