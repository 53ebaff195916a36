"""Checks on the accessibility tree (a11y.py's XML)."""

from __future__ import annotations

from typing import Any

from lxml import etree

from gh_osworld import a11y
from gh_osworld.outcome import Fail
from gh_osworld.registry import metric
from gh_osworld.spec import SpecError


@metric("check_accessibility_tree")
def check_accessibility_tree(result: str | None, rules: list[dict[str, Any]]) -> float:
    """Every rule finds an element: by `xpath`, else by CSS `selectors` (joined by ", "; lxml's cssselect,
    Debian's python3-cssselect), the prefixes st, attr, cp, val, act as a11y.py names them. With `text`,
    some found element's text is it (`exact`, the default), or OSWorld's fuzzy score is taken: its full
    score is equality too."""
    if result is None:
        return 0.0
    try:
        tree = etree.fromstring(result.encode("utf-8"))
    except etree.XMLSyntaxError as e:
        raise Fail(f"the accessibility tree is not XML: {e}") from None
    for r in rules:
        if "xpath" in r:
            found = tree.xpath(r["xpath"], namespaces=a11y.NS)
        elif "selectors" in r:
            from lxml.cssselect import CSSSelector

            found = CSSSelector(", ".join(r["selectors"]), namespaces=a11y.NS)(tree)
        else:
            raise SpecError("check_accessibility_tree: a rule needs xpath or selectors")
        if not isinstance(found, list) or not found:
            return 0.0
        if "text" in r and not any(getattr(el, "text", None) == r["text"] for el in found):
            return 0.0
    return 1.0
