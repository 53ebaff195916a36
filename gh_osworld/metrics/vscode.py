"""VS Code: its extensions (as `code --list-extensions` lists them) and its keybindings."""

from __future__ import annotations

import json
from typing import Any

from gh_osworld.registry import metric
from gh_osworld.spec import SpecError


@metric("is_extension_installed")
def is_extension_installed(result: str | None, rules: dict[str, Any]) -> float:
    """The command's output (the result getter's text) contains (`type: contain`) or does not contain
    (`type: not_contain`) the expected string."""
    kind = rules.get("type")
    if kind not in ("contain", "not_contain"):
        raise SpecError(f"is_extension_installed: type {kind!r} is not known")
    if result is None:
        return 0.0
    return float((rules["expected"] in result) == (kind == "contain"))


def _keybindings(path: str) -> list[Any] | None:
    """keybindings.json: a JSON list, possibly after VS Code's first comment line; None when neither."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return None
    for candidate in (text, text.split("\n", 1)[1] if "\n" in text else ""):
        try:
            data = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(data, list):
            return data
    return None


@metric("check_json_keybindings")
def check_json_keybindings(result: str | None, rules: dict[str, Any]) -> float:
    """The expected binding (an object: key, command, when) is one of keybindings.json's."""
    if result is None:
        return 0.0
    bindings = _keybindings(result)
    return float(bindings is not None and rules["expected"] in bindings)
