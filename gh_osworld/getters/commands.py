"""Commands run in the guest, and values the task states itself.

`vm_command_line` / `vm_command_error`: the command's standard output / error as OSWorld's server
returns them: `command` a list, or a string (split as a shell would unless `shell` is true, then given
to /bin/sh), each argument starting with `~/` expanded, the output decoded as text with universal
newlines (`\\r\\n` and `\\r` read as `\\n`). A command that cannot start or outlives its timeout gives
None, as OSWorld's getter gives when its server answers an error.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from calendar import monthrange
from datetime import datetime, timedelta
from typing import Any

from gh_osworld.registry import getter
from gh_osworld.spec import SpecError

COMMAND_TIMEOUT_S = 120  # OSWorld's server gives a command 120 s


def run(spec: dict[str, Any]) -> subprocess.CompletedProcess[str] | None:
    shell = bool(spec.get("shell", False))
    command = spec.get("command", "" if shell else [])
    if isinstance(command, str) and not shell:
        command = shlex.split(command)
    if isinstance(command, list):
        if not all(isinstance(a, str) for a in command):
            raise SpecError(f"{spec['type']}: command arguments are strings")
        command = [os.path.expanduser(a) if a.startswith("~/") else a for a in command]
    elif not isinstance(command, str):
        raise SpecError(f"{spec['type']}: command is a string or a list")
    try:
        return subprocess.run(command, shell=shell, capture_output=True, text=True, errors="replace",
                              timeout=spec.get("timeout", COMMAND_TIMEOUT_S), stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None


@getter("vm_command_line")
def vm_command_line(spec: dict[str, Any]) -> str | None:
    done = run(spec)
    return None if done is None else done.stdout


@getter("vm_command_error")
def vm_command_error(spec: dict[str, Any]) -> str | None:
    done = run(spec)
    return None if done is None else done.stderr


@getter("rule")
def rule(spec: dict[str, Any]) -> Any:
    return spec["rules"]


@getter("time_diff_range")
def time_diff_range(spec: dict[str, Any]) -> Any:
    return spec.get("diff_range_in_minutes")


# rule_relativeTime: the task states a date relative to the day the check runs ("tomorrow", "next
# Monday", ...) and a format with placeholders; the getter gives the rules with the date written in.

_DOW = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December"]


def _nth_next_month(now: datetime, day: int) -> datetime:
    year, month = (now.year + 1, 1) if now.month == 12 else (now.year, now.month + 1)
    return datetime(year, month, min(day, monthrange(year, month)[1]))


def _next_weekday(now: datetime, weekday: int) -> datetime:
    """The given weekday of next week (Mon=0): OSWorld's "next Monday" is the Monday after this week."""
    return now + timedelta(days=(7 - now.weekday()) + weekday)


def relative_day(name: str, now: datetime, *, other: str | None = None) -> datetime:
    """The day a relative name means on `now`, as OSWorld's tasks mean it. `other` is the range's other end
    (OSWorld's "next Friday" ending a range from "next Monday" is that week's Friday)."""
    if name == "tomorrow":
        return now + timedelta(days=1)
    if name in ("this month", "today"):
        return now
    if name.endswith(" next month") and name.split("th")[0].isdigit():
        return _nth_next_month(now, int(name.split("th")[0]))
    if name == "next Monday":
        return _next_weekday(now, 0)
    if name == "this Saturday":
        return now + timedelta(days=5 - now.weekday())
    if name == "this Sunday":
        return now + timedelta(days=6 - now.weekday())
    if name == "next Friday":
        # OSWorld: from Friday on, and ending a range that starts next Monday, the Friday of next week;
        # else this week's
        if now.weekday() >= 4 or other == "next Monday":
            return _next_weekday(now, 4)
        return now + timedelta(days=4 - now.weekday())
    if name == "first monday four months later":
        year, month = (now.year + 1, now.month - 8) if now.month > 8 else (now.year, now.month + 4)
        first = datetime(year, month, 1)
        return first + timedelta(days=(7 - first.weekday()) % 7)
    raise SpecError(f"rule_relativeTime: the relative time {name!r} is not known")


def format_day(template: str, day: datetime) -> str:
    """OSWorld's placeholders: {DoW} Mon, {Month} Jan, {MonthFull} January, {month} january, {Month0D} 01,
    {DayD} 5, {Day0D} 05, {Year} 2024; each replaced once, as OSWorld replaces them."""
    month = _MONTHS[day.month - 1]
    for key, value in (("{DoW}", _DOW[day.weekday()]), ("{Month}", month[:3]), ("{DayD}", str(day.day)),
                       ("{Year}", str(day.year)), ("{Month0D}", f"{day.month:02d}"), ("{month}", month.lower()),
                       ("{MonthFull}", month), ("{Day0D}", f"{day.day:02d}")):
        template = template.replace(key, value, 1)
    return template


@getter("rule_relativeTime")
def rule_relative_time(spec: dict[str, Any], now: datetime | None = None) -> Any:
    rules = dict(spec["rules"])
    when = rules["relativeTime"]
    expected = dict(rules["expected"])
    now = now or datetime.now()
    if "to" not in when:
        expected["time"] = format_day(expected["time"], relative_day(when["from"], now))
    else:
        expected["from"] = format_day(expected["from"], relative_day(when["from"], now, other=when["to"]))
        expected["to"] = format_day(expected["to"], relative_day(when["to"], now, other=when["from"]))
    rules["expected"] = expected
    return rules
