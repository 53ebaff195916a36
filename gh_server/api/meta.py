"""Public endpoints: health (no auth)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy import text

from gh_server.errors import ApiError

router = APIRouter(tags=["Meta"])


@router.get("/healthz", summary="Liveness and database reachability (no auth)")
def healthz(request: Request) -> dict[str, Any]:
    st = request.app.state.gh
    try:
        with st.db() as s:
            s.execute(text("SELECT 1"))
    except Exception:
        raise ApiError(503, "The database is unreachable.", type="server_error") from None
    return {"ok": True}
