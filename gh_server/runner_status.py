"""Whether a runner is online, read from its row (the API's `status` and the start-state service's choice)."""

from __future__ import annotations

from datetime import timedelta

from gh_server.models import Runner, utcnow
from gh_server.settings import Settings


def is_online(row: Runner, settings: Settings) -> bool:
    """Connected (a gateway session holds it) and heard from recently: a row another process owns counts too."""
    if row.session_id is None or row.last_seen_at is None or row.revoked_at is not None:
        return False
    return row.last_seen_at >= utcnow() - timedelta(seconds=settings.online_window_seconds)
