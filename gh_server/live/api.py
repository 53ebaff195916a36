"""The live-view routes: the ticket (`POST /v1/start_states/{id}/view`), the viewer's WebSocket
(`/v1/live/{ticket}`) and the runner's view socket (`/v1/runners/views/{view_id}`).

Any signed-in key may ask for a ticket to an open start state's machine; an admin key's viewer may send
input, a member key's is read-only (its input is dropped by the relay, gh_server/live/relay.py).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, Request, WebSocket
from fastapi.concurrency import run_in_threadpool

from gh_server.api.common import Member, state_of
from gh_server.auth import Principal
from gh_server.errors import ApiError, conflict, not_found
from gh_server.live.relay import VIEWER_PATH, LiveRelay
from gh_server.live.tickets import TooManyTickets
from gh_server.models import ApiKey, StartState
from gh_server.state import ServerState
from gh_server.timestamps import ts
from gh_wire import protocol


def install(app: FastAPI, st: ServerState, relay: LiveRelay) -> None:
    router = APIRouter(tags=["Start states"])

    @router.post("/v1/start_states/{start_state_id}/view",
                 summary="A ticket to watch (admin: and drive) the open machine live, through a WebSocket")
    async def open_view(start_state_id: str, request: Request, p: Principal = Member) -> dict[str, Any]:
        state = state_of(request)

        def load() -> tuple[str | None, str]:
            with state.db() as s:
                ss = s.get(StartState, start_state_id)
                if ss is None:
                    raise not_found("start state", start_state_id)
                if ss.status != "open":
                    raise conflict(f"Start state {ss.id} is {ss.status}: open it first.", status=ss.status)
                key = s.get(ApiKey, p.key_id)
                return ss.runner_id, key.name if key is not None else p.key_id

        runner_id, key_name = await run_in_threadpool(load)
        gw = state.gateway
        if runner_id is None or gw is None or not gw.takes_views(runner_id):
            raise conflict(f"The runner that holds start state {start_state_id} is not connected to this server, "
                           "or is too old for live views.", code="not_connected")
        try:
            t = relay.tickets.issue(key_id=p.key_id, key_name=key_name, read_only=not p.is_admin,
                                    start_state_id=start_state_id)
        except TooManyTickets as e:
            raise ApiError(429, str(e)) from None
        return {"object": "live_view", "ticket": t.value, "url": VIEWER_PATH.format(ticket=t.value),
                "read_only": t.read_only, "expires_at": ts(t.expires_at)}

    async def viewer(ws: WebSocket, ticket: str) -> None:
        await relay.viewer_endpoint(ws, ticket)

    async def runner(ws: WebSocket, view_id: str) -> None:
        await relay.runner_endpoint(ws, view_id)

    app.include_router(router)
    app.add_api_websocket_route(VIEWER_PATH, viewer)
    app.add_api_websocket_route(protocol.VIEW_PATH, runner)


__all__ = ["install"]
