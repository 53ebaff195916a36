"""GIMP's configuration files (gimprc, sessionrc, action-history): lines of `(key ... value)`."""

from __future__ import annotations

from typing import Any

from gh_osworld.reading import agent_text
from gh_osworld.registry import metric


@metric("check_config_status")
def check_config_status(result: str | None, rules: dict[str, Any]) -> float:
    """Some line `(key ... value)` has the key (a word, or two words for a list of two) and ends with the
    value (`(undo-levels 100)`, `(history-item "filters-vignette" 1)`)."""
    if result is None:
        return 0.0
    key, value = rules["key"], rules["value"]
    for line in agent_text(result, what="GIMP's configuration").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        items = line.strip().lstrip("(").rstrip(")").split()
        if not items:
            continue
        if isinstance(key, str) and items[0] == key and items[-1] == value:
            return 1.0
        if isinstance(key, list) and len(key) == 2 and items[:2] == key and items[-1] == value:
            return 1.0
    return 0.0
