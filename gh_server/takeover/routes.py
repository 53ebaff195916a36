"""The takeover routes (admin): `POST /v1/attempts/{id}/takeover` and `POST /v1/attempts/{id}/handback`
(docs/server-api.md, "Takeovers"). The hold itself is the desk's (gh_server/takeover/desk.py); the holder
drives through a writable live view of the attempt (gh_server/live/screen_relay.py), whose ticket the
takeover's answer carries. The ticket is issued before the hold is taken (no hold without a view to
drive it; a refused take drops the ticket), and a view of it that fails to open undoes the hold
(TakeoverDesk.view_failed). The holder may ask again (a reload): its hold, and a new view.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.concurrency import run_in_threadpool

from gh_server.auth import Principal, require_admin
from gh_server.errors import ApiError, conflict, not_found
from gh_server.live.api import view_object
from gh_server.live.screen_relay import LiveRelay
from gh_server.models import ApiKey
from gh_server.state import ServerState
from gh_server.takeover.desk import NoAttempt, Refused, TakeoverDesk


def _refused(e: Refused) -> ApiError:
    return conflict(str(e), code=e.code, **e.extra)


def install(app: FastAPI, st: ServerState, relay: LiveRelay, desk: TakeoverDesk) -> None:
    router = APIRouter(tags=["Test runs"])

    def key_name(p: Principal) -> str:
        with st.db() as s:
            key = s.get(ApiKey, p.key_id)
            return key.name if key is not None else p.key_id

    @router.post("/v1/attempts/{attempt_id}/takeover",
                 summary="Take over a running attempt's machine: its agent waits, its time limit stops (admin)")
    async def take(attempt_id: str, p: Principal = Depends(require_admin)) -> dict[str, Any]:
        name = await run_in_threadpool(key_name, p)
        view = view_object(lambda: relay.tickets.issue(key_id=p.key_id, key_name=name, read_only=False,
                                                       attempt_id=attempt_id))
        try:
            hold = await desk.take(attempt_id, p.key_id, name)
        except Refused as e:
            relay.tickets.discard(view["ticket"])
            raise _refused(e) from None
        except NoAttempt:
            relay.tickets.discard(view["ticket"])
            raise not_found("attempt", attempt_id) from None
        return {"object": "takeover", "attempt_id": attempt_id, **hold.in_progress(),
                "idle_seconds": hold.idle_s, "view": view}

    @router.post("/v1/attempts/{attempt_id}/handback",
                 summary="Hand a taken-over attempt's machine back to its agent (admin)")
    async def hand_back(attempt_id: str, p: Principal = Depends(require_admin)) -> dict[str, Any]:
        try:
            entry = await desk.hand_back(attempt_id)
        except Refused as e:
            raise _refused(e) from None
        return {"object": "takeover", "attempt_id": attempt_id, **entry}

    app.include_router(router)


__all__ = ["install"]
