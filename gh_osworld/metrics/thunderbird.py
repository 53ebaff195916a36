"""Thunderbird's profile: prefs.js, message filter rules (msgFilterRules.dat), mail folders (mbox files)."""

from __future__ import annotations

import json
import re
from typing import Any

from gh_osworld.matching import matches_record, matches_rule
from gh_osworld.reading import agent_text, is_ours, ours_text
from gh_osworld.registry import metric

_PREF = re.compile(r'^user_pref\("(?P<key>(?:[^"]|\\")+)", (?P<value>.+)\);$')


def prefs(text: str) -> dict[str, Any]:
    """prefs.js's `user_pref("key", value);` lines, each value read as JSON (a string, number or bool)."""
    found: dict[str, Any] = {}
    for line in text.splitlines():
        m = _PREF.match(line.strip())
        if m is None:
            continue
        try:
            found[m.group("key")] = json.loads(m.group("value"))
        except ValueError:
            continue
    return found


@metric("check_thunderbird_prefs")
def check_thunderbird_prefs(result: str | None, rules: dict[str, Any]) -> float:
    """Each "expect" preference is set to a value matching its rule (matching.py), and no "unexpect"
    preference is set to a value matching its rule."""
    if result is None:
        return 0.0
    values = prefs(agent_text(result, what="prefs.js"))
    expect, unexpect = rules.get("expect", {}), rules.get("unexpect", {})
    return float(all(k in values and matches_rule(values[k], r) for k, r in expect.items())
                 and not any(k in values and matches_rule(values[k], r) for k, r in unexpect.items()))


def _unquote(value: str) -> str:
    return value.replace('\\"', '"').replace("\\\\", "\\")


_CONDITION = re.compile(r'\b(?:AND|OR) \((?:[\w ]+),(?:[\w \']+),(?:"(?:(?:[^"]|\")+)"|(?:[^)]+))\)|\bALL\b')


def filters(text: str) -> list[dict[str, Any]]:
    """msgFilterRules.dat's filters: name, enabled, type, action, actionValue (each `key="value"`) and
    condition, a list of its terms (`AND (subject,contains,x)` each, or `ALL`)."""
    found: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        if not sep or not raw.startswith('"') or not raw.endswith('"'):
            continue
        value = _unquote(raw[1:-1])
        if key == "name":
            current = {"name": value}
            found.append(current)
        elif current is not None and key in ("enabled", "type", "action", "actionValue"):
            current.setdefault(key, value)
        elif current is not None and key == "condition":
            current["condition"] = _CONDITION.findall(value)
    return found


@metric("check_thunderbird_filter")
def check_thunderbird_filter(result: str | None, rules: dict[str, Any]) -> float:
    """Each "expect" record matches some filter (every key equal) and no "unexpect" record matches any."""
    if result is None:
        return 0.0
    found = filters(agent_text(result, what="the message filters"))
    return float(all(any(matches_record(r, f) for f in found) for r in rules.get("expect", []))
                 and not any(matches_record(r, f) for r in rules.get("unexpect", []) for f in found))


def osworld_messages(text: str, options: dict[str, Any]) -> list[str]:
    """What desktop-env 1.0.2's check_thunderbird_folder compares of a folder (an mbox). It splits the text
    at "FROM - " in upper case and keeps only the parts that are blank, each as "FROM - "; Thunderbird
    starts each message with "From - ", so a folder with mail has no such part and an empty folder has
    one. `remove_duplicate` (default) keeps one of each. Kept as OSWorld scores it: two folders with any
    mail compare equal, an empty one equals only an empty one (docs/osworld.md)."""
    found = ["FROM - " for part in text.strip().split("FROM - ") if not part.strip()]
    if options.get("remove_duplicate", True):
        found = list(set(found))
    return sorted(found)


@metric("check_thunderbird_folder")
def check_thunderbird_folder(result: Any, expected: Any, **options: Any) -> float:
    """Each folder file compares to its gold file (a path, or lists of them) as osworld_messages reads them."""
    mine = result if isinstance(result, list) else [result]
    gold = expected if isinstance(expected, list) else [expected]
    for r, e in zip(mine, gold, strict=False):
        if r is None or e is None:
            return 0.0
        gold_text = ours_text(e) if is_ours(e) else agent_text(e, what="the folder")
        if osworld_messages(agent_text(r, what="the folder"), options) != osworld_messages(gold_text, options):
            return 0.0
    return 1.0
