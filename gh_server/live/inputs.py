"""What a person sent a start state's machine through live views: the rows, and how the API shows them.

One `LiveInput` row per view that delivered input (who, from when to when, how many key, pointer and
clipboard events), never the keys. Input also moves the start state's `last_input_at`, which the idle
close counts from (gh_server/start_state_jobs.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gh_server.models import LiveInput, StartState, new_id, utcnow
from gh_server.timestamps import ts

SHOWN = 50  # the latest rows GET /v1/start_states/{id} shows


@dataclass
class InputCount:
    """A view's input so far."""

    key_id: str
    key_name: str
    first_at: datetime | None = None
    last_at: datetime | None = None
    keys: int = 0
    pointer: int = 0
    clipboard: int = 0

    @property
    def any(self) -> bool:
        return self.first_at is not None


def record(session: Session, start_state_id: str, count: InputCount) -> None:
    """Store one view's input (nothing when it sent none)."""
    if count.first_at is None or count.last_at is None or session.get(StartState, start_state_id) is None:
        return
    session.add(LiveInput(id=new_id("li_"), start_state_id=start_state_id, key_id=count.key_id,
                          key_name=count.key_name, started_at=count.first_at, ended_at=count.last_at,
                          key_events=count.keys, pointer_events=count.pointer, clipboard_events=count.clipboard))


def touch(session: Session, start_state_id: str) -> None:
    """A person sent input now: the idle close counts from here."""
    ss = session.get(StartState, start_state_id)
    if ss is not None and ss.status == "open":
        ss.last_input_at = utcnow()


def listed(session: Session, start_state_id: str) -> list[dict[str, Any]]:
    """The latest rows, newest first, as `inputs` on GET /v1/start_states/{id}."""
    rows = session.scalars(select(LiveInput).where(LiveInput.start_state_id == start_state_id)
                           .order_by(LiveInput.ended_at.desc()).limit(SHOWN))
    return [{"object": "live_input", "key_id": r.key_id, "key_name": r.key_name, "started_at": ts(r.started_at),
             "ended_at": ts(r.ended_at), "key_events": r.key_events, "pointer_events": r.pointer_events,
             "clipboard_events": r.clipboard_events} for r in rows]


__all__ = ["InputCount", "listed", "record", "touch"]
