"""Why a task is not imported: one reason per kind of gap, and the detail that names the instance."""

from __future__ import annotations

from enum import StrEnum


class SkipReason(StrEnum):
    """A task that cannot become a case that keeps its meaning, and why (docs/osworld.md maps each)."""

    UNSUPPORTED_CONFIG = "unsupported_config"  # a setup step type we do not translate
    UNSUPPORTED_GETTER = "unsupported_getter"  # state read by a getter we do not translate
    UNSUPPORTED_METRIC = "unsupported_metric"  # a metric we do not translate
    UNSUPPORTED_OPTION = "unsupported_option"  # a known step, getter or metric with a form we do not translate
    LIVE_WEB = "live_web"  # needs the live web (a page opened or read from the internet)
    GOOGLE_DRIVE = "google_drive"  # needs a Google Drive account
    LOGIN = "login"  # needs a sign-in to an online service
    DOWNLOAD_FAILED = "download_failed"  # a file the task needs could not be fetched at import time
    DOWNLOAD_TOO_LARGE = "download_too_large"  # a file the task needs does not fit in a script
    SCRIPT_TOO_LARGE = "script_too_large"  # the setup or check would pass the API's script limit
    NEEDS_DESKTOP = "needs_desktop"  # needs a desktop session or python3 the start state does not have
    NEEDS_GH_OSWORLD = "needs_gh_osworld"  # its metrics run in gh_osworld, which the start state does not carry
    APP_MISSING = "app_missing"  # an application of related_apps the start state does not have
    DUPLICATE_ID = "duplicate_id"  # a second task with an id already imported
    PROMPT_TOO_LONG = "prompt_too_long"  # the instruction passes the API's prompt limit


class Skip(Exception):
    """Raised by a translation step: the task is skipped for `reason`; `detail` names what (a type, a host)."""

    def __init__(self, reason: SkipReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
