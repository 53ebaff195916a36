"""Public endpoints: health (no auth)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from gh_server import db
from gh_server.errors import DB_RETRY_AFTER_S

router = APIRouter(tags=["Meta"])


class Healthy(BaseModel):
    ok: Literal[True]


class Degraded(BaseModel):
    ok: Literal[False]
    status: Literal["degraded"]
    database: Literal["locked", "unreachable"]


@router.get("/healthz", summary="Liveness and database health (no auth)", response_model=Healthy,
            responses={503: {"model": Degraded, "description": "the database is locked or unreachable"}})
def healthz(request: Request) -> Any:
    st = request.app.state.gh
    health = db.probe(st.engine, st.settings)
    if health is not db.DbHealth.OK:
        return JSONResponse({"ok": False, "status": "degraded", "database": health.value}, status_code=503,
                            headers={"Retry-After": str(DB_RETRY_AFTER_S)})
    return {"ok": True}
