"""/v1/api_keys (admin): make member or admin keys (shown once), list them, revoke them.

Also `gh-server keys create --role member` on the server host (gh_server.cli)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from gh_server import serialize
from gh_server.api.common import DB, Admin, state_of
from gh_server.api.schemas import KeyCreate
from gh_server.auth import Principal, create_key
from gh_server.errors import conflict, not_found
from gh_server.models import ApiKey, utcnow

router = APIRouter(tags=["API keys"])


@router.post("/v1/api_keys", summary="Make an API key (admin); the key is in the response once")
def create_api_key(body: KeyCreate, s: Session = DB, _p: Principal = Admin) -> dict[str, Any]:
    row, plain = create_key(s, body.name, body.role)
    s.commit()
    return {**serialize.api_key(row), "key": plain}


@router.get("/v1/api_keys", summary="List API keys (admin; never their secrets)")
def list_api_keys(s: Session = DB, _p: Principal = Admin) -> dict[str, Any]:
    rows = s.scalars(select(ApiKey).order_by(ApiKey.created_at.desc(), ApiKey.id.desc())).all()
    data = [serialize.api_key(r) for r in rows]
    return {"object": "list", "data": data, "has_more": False, "next_cursor": None}


@router.delete("/v1/api_keys/{key_id}", summary="Revoke an API key (admin)")
def revoke_api_key(key_id: str, request: Request, s: Session = DB, p: Principal = Admin) -> dict[str, Any]:
    row = s.get(ApiKey, key_id)
    if row is None:
        raise not_found("API key", key_id)
    if row.id == p.key_id:
        raise conflict("A key cannot revoke itself: use another admin key.")
    row.revoked_at = row.revoked_at or utcnow()
    s.commit()
    state_of(request).key_revoked(key_id)  # its open live views end now, not when their sockets do
    return {"object": "api_key", "id": key_id, "deleted": True}
