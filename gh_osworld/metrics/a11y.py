"""Checks on the accessibility tree (a11y.py's XML)."""

from __future__ import annotations

from typing import Any

from lxml import etree

from gh_osworld import a11y
from gh_osworld.metrics.similarity import ratio
from gh_osworld.outcome import Fail
from gh_osworld.registry import metric
from gh_osworld.spec import SpecError


@metric("check_accessibility_tree")
def check_accessibility_tree(result: str | None, rules: list[dict[str, Any]]) -> float:
    """The product of every rule's score. A rule finds elements by `xpath`, else by CSS `selectors`
    (joined by ", "; lxml's cssselect, Debian's python3-cssselect), the prefixes st, attr, cp, val, act as
    a11y.py names them; none found scores 0. Without `text` a rule that finds scores 1; with it, the best
    over the elements found of: equality of its text (`exact`), else rapidfuzz's ratio / 100 (an element
    without text compares as none: 0), as desktop-env 1.0.2 scores it."""
    if result is None:
        return 0.0
    try:
        tree = etree.fromstring(result.encode("utf-8"))
    except etree.XMLSyntaxError as e:
        raise Fail(f"the accessibility tree is not XML: {e}") from None
    total = 1.0
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
        if "text" in r:
            texts = [getattr(el, "text", None) or "" for el in found]
            if r.get("exact", True):
                total *= float(any(t and t == r["text"] for t in texts))
            else:
                total *= max(ratio(r["text"], t) / 100.0 if t else 0.0 for t in texts)
    return total
