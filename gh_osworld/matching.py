"""OSWorld's value rules: `{"method": M, "ref": R}` said of a value, as its json, csv and table checks use
them.

    re / re.I / re.M...    R is a regular expression searched in the value (the flags after the dots)
    eq ne lt le gt ge      the comparison `value M R`
    approx:T               |float(value) - R| <= T (a value that is no number does not match)
    range.XY               R = [a, b]; X, Y each `t` (<) or `e` (<=): a X value Y b
    str_list_eq            the value, quotes stripped and split at commas, equals the list R
    str_set_eq             the same as sets
    spreadsheet_range      R = [inner, outer]: the value (cell ranges) holds inner and lies within outer
"""

from __future__ import annotations

import functools
import operator
import re
from typing import Any

from gh_osworld.spec import SpecError

_COMPARE = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
            "gt": operator.gt, "ge": operator.ge}


def matches_rule(value: Any, rule: dict[str, Any]) -> bool:
    method = rule.get("method")
    if not isinstance(method, str):
        raise SpecError(f"a value rule needs a method: {rule!r}"[:300])
    ref: Any = rule.get("ref")
    if method == "re" or method.startswith("re."):
        flags = functools.reduce(operator.or_, (getattr(re, f) for f in method.split(".")[1:]), re.RegexFlag(0))
        return isinstance(value, str) and re.search(ref, value, flags) is not None
    if method in _COMPARE:
        try:
            return bool(_COMPARE[method](value, ref))
        except TypeError:  # an ordering between a value the agent left and a number: no match
            return False
    if method.startswith("approx:"):
        try:
            return abs(float(value) - float(ref)) <= float(method.split(":", 1)[1])
        except (TypeError, ValueError):
            return False
    if method.startswith("range.") and len(method) == 8:
        low = operator.lt if method[6] == "t" else operator.le
        high = operator.lt if method[7] == "t" else operator.le
        try:
            return bool(low(ref[0], value) and high(value, ref[1]))
        except TypeError:
            return False
    if method in ("str_list_eq", "str_set_eq"):
        if not isinstance(value, str):
            return False
        parts = value.strip("\"'").split(",")
        return parts == list(ref) if method == "str_list_eq" else set(parts) == set(ref)
    if method == "spreadsheet_range":
        from openpyxl.worksheet.cell_range import MultiCellRange

        inner, outer = MultiCellRange(ref[0]), MultiCellRange(ref[1])
        return all(r in value for r in inner) and all(r in outer for r in value)
    raise SpecError(f"the value rule method {method!r} is not known")


def matches_record(pattern: dict[str, Any], record: dict[str, Any]) -> bool:
    """Every key of the pattern is in the record with an equal value."""
    return all(k in record and record[k] == v for k, v in pattern.items())
