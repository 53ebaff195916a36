"""What every resource module shares: the database session, pagination, lookups."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from fastapi import Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import ColumnElement, Select, and_, func, or_, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from gh_server.auth import Principal, require_admin, require_member
from gh_server.errors import invalid
from gh_server.state import ServerState

Member = Depends(require_member)
Admin = Depends(require_admin)
__all__ = ["Admin", "Member", "Principal"]

MAX_LIMIT = 100
DEFAULT_LIMIT = 20


def state_of(request: Request) -> ServerState:
    st: ServerState = request.app.state.gh
    return st


async def get_db(request: Request) -> AsyncIterator[Session]:
    """The request's session. Opening one does no I/O, so it opens on the loop (a sync dependency would be a
    trip through the thread pool); closing one that still holds a connection gives the connection back
    (a rollback: I/O), so that close goes to the pool."""
    s = state_of(request).db()
    try:
        yield s
    finally:
        if s.in_transaction():
            await run_in_threadpool(s.close)
        else:
            s.close()


DB = Depends(get_db)


def task_minutes_bound(request: Request) -> int:
    """This server's max_task_minutes: the longest `limits.minutes` a case may ask of it."""
    return state_of(request).settings.max_task_minutes


MaxTaskMinutes = Depends(task_minutes_bound)


def task_minutes(limits: dict[str, Any] | None) -> int:
    """A case's task limit in minutes: its `limits.minutes`, or the default of 10."""
    return int((limits or {}).get("minutes") or 10)


def check_task_minutes(limits: dict[str, Any] | None, bound: int, param: str) -> None:
    """Refuse a case whose `limits.minutes` is over this server's max_task_minutes."""
    minutes = task_minutes(limits)
    if minutes > bound:
        raise invalid(param, f"{minutes} minutes is over this server's limit of {bound} (its max_task_minutes "
                             "setting): shorten the case, or ask the operator to raise the setting",
                      max_task_minutes=bound)


class PageParams:
    """A list's page: how many rows, from which cursor, with which extras."""

    def __init__(self, limit: int | None, cursor: str | None, include: str | None) -> None:
        if limit is not None and not 1 <= limit <= MAX_LIMIT:
            raise invalid("limit", f"must be 1 to {MAX_LIMIT}")
        self.limit = limit or DEFAULT_LIMIT
        self.cursor = cursor
        self.include = {p.strip() for p in (include or "").split(",") if p.strip()}
        unknown = self.include - {"total_count", "facets"}
        if unknown:
            raise invalid("include", f"unknown value {sorted(unknown)[0]!r} (total_count, facets)")


async def page_params(
    limit: int | None = Query(default=None, description="1 to 100 (default 20)"),
    cursor: str | None = Query(default=None, description="next_cursor of the previous page"),
    include: str | None = Query(default=None, description="total_count (comma-separated extras)"),
) -> PageParams:
    # async, as it only parses: a sync dependency is a trip through the thread pool (test_thread_trips.py)
    return PageParams(limit, cursor, include)


# Dependencies run in the order a route names them: a list route names its key's check before Page, so a
# caller without a key hears 401 whatever its page parameters say.
Page = Depends(page_params)


def encode_cursor(values: list[Any]) -> str:
    raw = json.dumps([v.isoformat() if isinstance(v, datetime) else v for v in values]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, n: int) -> list[Any]:
    try:
        pad = "=" * (-len(cursor) % 4)
        values = json.loads(base64.urlsafe_b64decode(cursor + pad))
        if not isinstance(values, list) or len(values) != n:
            raise ValueError
        return values
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise invalid("cursor", "is not a cursor this list returned") from None


def paginate(
    session: Session,
    stmt: Select[Any],
    created_col: InstrumentedAttribute[Any],
    id_col: InstrumentedAttribute[Any],
    page: PageParams,
    *,
    newest_first: bool = True,
) -> tuple[list[Any], bool, str | None, int | None]:
    """Keyset pagination on (created_at, id): stable while rows are added, cheap on deep pages."""
    total = None
    if "total_count" in page.include:
        total = session.scalar(select(func.count()).select_from(stmt.order_by(None).subquery()))
    q = stmt
    if page.cursor:
        c_at, c_id = decode_cursor(page.cursor, 2)
        try:
            at = datetime.fromisoformat(c_at)
        except (TypeError, ValueError):
            raise invalid("cursor", "is not a cursor this list returned") from None
        cond: ColumnElement[bool]
        if newest_first:
            cond = or_(created_col < at, and_(created_col == at, id_col < c_id))
        else:
            cond = or_(created_col > at, and_(created_col == at, id_col > c_id))
        q = q.where(cond)
    order = (created_col.desc(), id_col.desc()) if newest_first else (created_col.asc(), id_col.asc())
    rows = list(session.scalars(q.order_by(*order).limit(page.limit + 1)))
    has_more = len(rows) > page.limit
    rows = rows[: page.limit]
    next_cursor = None
    if has_more and rows:
        last = rows[-1]
        next_cursor = encode_cursor([getattr(last, created_col.key), getattr(last, id_col.key)])
    return rows, has_more, next_cursor, total


def page_body(data: list[Any], has_more: bool, next_cursor: str | None, total: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"object": "list", "data": data, "has_more": has_more, "next_cursor": next_cursor}
    if total is not None:
        body["total_count"] = total
    return body


def like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"
