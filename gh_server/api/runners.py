"""/v1/runners: register (token shown once), list with liveness, delete (revoke and disconnect at once)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from gh_server import runner_admin, serialize
from gh_server.api.common import DB, Admin, Member, Page, PageParams, like, page_body, paginate, state_of
from gh_server.api.schemas import RunnerCreate
from gh_server.auth import Principal
from gh_server.errors import not_found
from gh_server.models import Runner
from gh_server.runner_status import is_online

router = APIRouter(tags=["Runners"])

# Close code for a revoked token (the runner stops retrying hot and says so).
CLOSE_REVOKED = 4001


@router.post("/v1/runners", summary="Register a runner; the response has its token (gh_rn_...), shown once")
def create_runner(body: RunnerCreate, s: Session = DB, _p: Principal = Admin) -> dict[str, Any]:
    row, token = runner_admin.register(s, body.name)
    s.commit()
    out = serialize.runner(row, online=False)
    out["token"] = token
    return out


@router.get("/v1/runners", summary="List runners with status (online/offline), busy and slots")
def list_runners(
    request: Request,
    q: str | None = Query(default=None, max_length=200),
    _p: Principal = Member,
    page: PageParams = Page,
    s: Session = DB,
) -> dict[str, Any]:
    settings = state_of(request).settings
    stmt = select(Runner).where(Runner.revoked_at.is_(None))
    if q:
        stmt = stmt.where(or_(Runner.name.ilike(like(q), escape="\\"), Runner.id == q))
    rows, has_more, nxt, total = paginate(s, stmt, Runner.created_at, Runner.id, page)
    return page_body([serialize.runner(r, is_online(r, settings)) for r in rows], has_more, nxt, total)


@router.get("/v1/runners/{runner_id}", summary="Retrieve a runner")
def retrieve_runner(runner_id: str, request: Request, s: Session = DB, _p: Principal = Member) -> dict[str, Any]:
    row = s.get(Runner, runner_id)
    if row is None or row.revoked_at is not None:
        raise not_found("runner", runner_id)
    return serialize.runner(row, is_online(row, state_of(request).settings))


def _revoke(st: Any, runner_id: str) -> bool:
    with st.db.begin() as s:
        return runner_admin.revoke(s, runner_id)


@router.delete("/v1/runners/{runner_id}", summary="Revoke a runner's token and disconnect it")
async def delete_runner(runner_id: str, request: Request, _p: Principal = Admin) -> dict[str, Any]:
    st = state_of(request)
    if not await run_in_threadpool(_revoke, st, runner_id):
        raise not_found("runner", runner_id)
    if st.gateway is not None:
        await st.gateway.kick(runner_id, CLOSE_REVOKED, "runner deleted: its token was revoked")
    st.wake()
    return {"object": "runner", "runner_id": runner_id, "deleted": True}
