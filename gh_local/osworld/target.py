"""What the start state offers an imported task: what it carries, and what the importer may ask of it.

Each known start state says here what it has, so a translation asks the target (`target.carries(...)`),
never the start state's name:

| start state | session, python3 | OSWorld's applications | carries |
|---|---|---|---|
| linux-tiny | neither (busybox sh) | none (`os` only) | |
| linux-desktop | both | none beyond the system (`os`, a terminal) | |
| osworld-desktop (default) | both | all but VS Code (not in Debian) | gh_osworld, wmctrl, en_US.UTF-8, file store |
| any other name | both | every one its tasks name | |

`--like NAME` gives a start state of your own what a known one offers (`--start-state mine --like
osworld-desktop`: an image built from osworld-desktop's profile under another name).
- gh_osworld: the in-guest package (gh_osworld/); the check hands the evaluator to `python3 -m gh_osworld`
  for the metrics and getters gh_osworld/names.py lists. Elsewhere the check is translated to sh.
- wmctrl: `close_window` becomes `wmctrl -c` (Debian 12's xdotool has no windowclose).
- en_US.UTF-8: the locale OSWorld's snapshot runs in; every script exports it when `locale -a` has it,
  so this only records that the target is known to have it (docs/osworld.md, "Locale").
- the file store: /usr/share/gh-osworld/files/sha256/<hex>, filled at image build from the importer's
  --files-dir; a file too large to embed in a script is placed from it (`gh_osworld_place`).

A task that needs what its target lacks is skipped with the reason, never imported to fail everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum


class Need(StrEnum):
    PYTHON3 = "python3"
    SESSION = "a desktop session"


class Carry(StrEnum):
    """What a start state carries beyond a session and python3, that a translation may use."""

    GH_OSWORLD = "gh_osworld"  # python3 -m gh_osworld SPEC.json evaluates in the guest
    WMCTRL = "wmctrl"  # close_window
    EN_US_LOCALE = "en_US.UTF-8"  # OSWorld's locale
    FILE_STORE = "file store"  # /usr/share/gh-osworld/files/sha256/<hex>


OSWORLD_DESKTOP = "osworld-desktop"
DEFAULT_START_STATE = OSWORLD_DESKTOP
KNOWN_START_STATES = (OSWORLD_DESKTOP, "linux-desktop", "linux-tiny")
FILE_STORE_DIR = "/usr/share/gh-osworld/files/sha256"
FILE_STORE_BUILD = "image-builder/build osworld-desktop --files-dir DIR"

_DESKTOP = frozenset({Need.PYTHON3, Need.SESSION})
_SYSTEM_ONLY = frozenset({"os", "terminal"})
_VS_CODE = "VS Code is not in Debian"


@dataclass(frozen=True)
class Target:
    start_state: str
    offers: frozenset[Need] = _DESKTOP
    apps: frozenset[str] | None = None  # the related_apps it has (lower case); None: every one ...
    apps_missing: dict[str, str] = field(default_factory=dict)  # ... but these, with why
    carry: frozenset[Carry] = frozenset()
    # Every fetched file placed from the file store, none embedded: for a task whose files each fit in a
    # script but together pass its limit (the importer asks again with this set; see importer.task_to_case).
    store_every_file: bool = False

    @classmethod
    def named(cls, start_state: str) -> Target:
        if start_state == "linux-tiny":
            return cls(start_state, frozenset(), _SYSTEM_ONLY)
        if start_state == "linux-desktop":
            return cls(start_state, _DESKTOP, _SYSTEM_ONLY)
        if start_state == OSWORLD_DESKTOP:
            return cls(start_state, _DESKTOP, None, {"vs_code": _VS_CODE, "vscode": _VS_CODE}, frozenset(Carry))
        return cls(start_state)

    @classmethod
    def like(cls, start_state: str, model: str | None) -> Target:
        """`start_state` offering what the known start state `model` offers (an image built from osworld-desktop's
        profile under another name: `--start-state mine --like osworld-desktop`)."""
        if model is None:
            return cls.named(start_state)
        return replace(cls.named(model), start_state=start_state)

    def carries(self, what: Carry) -> bool:
        return what in self.carry

    def lacks(self, needs: set[Need]) -> list[Need]:
        return sorted(needs - self.offers)

    def lacks_apps(self, related_apps: list[str]) -> list[str]:
        """The related apps it does not have, each with why when it is known ("vs_code (VS Code is not in
        Debian)")."""
        out = []
        for a in dict.fromkeys(related_apps):
            low = a.lower()
            if low in self.apps_missing:
                out.append(f"{a} ({self.apps_missing[low]})")
            elif self.apps is not None and low not in self.apps:
                out.append(a)
        return out
