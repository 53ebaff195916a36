"""What the start state offers an imported task: a signed-in desktop session, python3, applications.

OSWorld's tasks assume an Ubuntu desktop with python3. linux-tiny (busybox sh, no python3, no display)
runs the tasks that need neither; linux-desktop (docs/desktop-guests.md) and any other start state are
taken to offer both, as the desktop image does. A task that needs what its target lacks is skipped
(`needs_desktop`), never imported to fail on every machine.

Applications likewise: a task's `related_apps` name what it is done in (chrome, libreoffice_calc, vlc,
...). linux-tiny and linux-desktop have none of OSWorld's applications beyond the system itself (`os`,
a terminal), so a task in another one is skipped (`app_missing`) on them; a start state of your own is
taken to have every application its tasks name.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Need(StrEnum):
    PYTHON3 = "python3"
    SESSION = "a desktop session"


# Start states known to lack what OSWorld assumes; every other one is taken to be a desktop.
_BARE = {"linux-tiny": frozenset[Need]()}
_DESKTOP = frozenset({Need.PYTHON3, Need.SESSION})
# The applications of OSWorld's related_apps each known start state has (lower case); others: all.
_SYSTEM_ONLY = frozenset({"os", "terminal"})
_APPS = {"linux-tiny": _SYSTEM_ONLY, "linux-desktop": _SYSTEM_ONLY}


@dataclass(frozen=True)
class Target:
    start_state: str
    offers: frozenset[Need]
    apps: frozenset[str] | None = None  # None: every application

    @classmethod
    def named(cls, start_state: str) -> Target:
        return cls(start_state, _BARE.get(start_state, _DESKTOP), _APPS.get(start_state))

    def lacks(self, needs: set[Need]) -> list[Need]:
        return sorted(needs - self.offers)

    def lacks_apps(self, related_apps: list[str]) -> list[str]:
        if self.apps is None:
            return []
        return [a for a in dict.fromkeys(related_apps) if a.lower() not in self.apps]
