"""What the start state offers an imported task: a signed-in desktop session, python3.

OSWorld's tasks assume an Ubuntu desktop with python3. linux-tiny (busybox sh, no python3, no display)
runs the tasks that need neither; linux-desktop (docs/desktop-guests.md) and any other start state are
taken to offer both, as the desktop image does. A task that needs what its target lacks is skipped
(`needs_desktop`), never imported to fail on every machine.
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


@dataclass(frozen=True)
class Target:
    start_state: str
    offers: frozenset[Need]

    @classmethod
    def named(cls, start_state: str) -> Target:
        return cls(start_state, _BARE.get(start_state, _DESKTOP))

    def lacks(self, needs: set[Need]) -> list[Need]:
        return sorted(needs - self.offers)
