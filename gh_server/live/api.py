"""The live-view routes: the tickets (`POST /v1/start_states/{id}/view`, `POST /v1/attempts/{id}/view`),
the viewer's WebSocket (`/v1/live/{ticket}`) and the runner's view socket (`/v1/runners/views/{view_id}`).

Who may view follows who may read the screen: an open start state's machine is the one an admin is
setting up by hand, so its view needs an admin key (`require_screen_reader`,
gh_server/api/start_states.py) and takes that admin's input. An attempt's machine is the agent's:
who may read its replay (any member key) may watch it, read-only, and the runner ends such a watch
(`ViewOpen.watch_only`) with `masked` once a secret is typed in the attempt, as its replay masks from
then (gh_runner/live_views.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request, WebSocket
from fastapi.concurrency import run_in_threadpool

from gh_server.api.common import state_of
from gh_server.api.start_states import require_screen_reader
from gh_server.auth import Principal, require_member
from gh_server.errors import ApiError, conflict, not_found
from gh_server.live.screen_relay import LIVE_ATTEMPT, MAX_WATCHES_PER_KEY_MACHINE, VIEWER_PATH, LiveRelay
from gh_server.live.tickets import Ticket, TooManyTickets
from gh_server.models import ApiKey, Attempt, StartState
from gh_server.state import ServerState
from gh_server.timestamps import ts
from gh_wire import protocol
from gh_wire.vocab import ViewEndReason


def view_object(issue: Callable[[], Ticket]) -> dict[str, Any]:
    """A new ticket as the `live_view` object the page opens (429 when too many are out)."""
    try:
        t = issue()
    except TooManyTickets as e:
        raise ApiError(429, str(e)) from None
    return {"object": "live_view", "ticket": t.value, "url": VIEWER_PATH.format(ticket=t.value),
            "read_only": t.read_only, "expires_at": ts(t.expires_at)}


def install(app: FastAPI, st: ServerState, relay: LiveRelay) -> None:
    router = APIRouter(tags=["Start states"])

    @router.post("/v1/start_states/{start_state_id}/view",
                 summary="A ticket to watch and drive the open machine live, through a WebSocket (admin)")
    async def open_view(start_state_id: str, request: Request,
                        p: Principal = Depends(require_screen_reader)) -> dict[str, Any]:
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
        if not takes_views(runner_id):
            raise conflict(f"The runner that holds start state {start_state_id} is not connected to this server, "
                           "or is too old for live views.", code="not_connected")
        return issued(lambda: relay.tickets.issue(key_id=p.key_id, key_name=key_name, read_only=False,
                                                  start_state_id=start_state_id))

    @router.post("/v1/attempts/{attempt_id}/view", tags=["Test runs"],
                 summary="A ticket to watch a running attempt's machine live, read-only, through a WebSocket")
    async def open_attempt_view(attempt_id: str, request: Request,
                                p: Principal = Depends(require_member)) -> dict[str, Any]:
        state = state_of(request)
        # The key's share of this machine's watchers, before anything is looked up (docs/server-api.md).
        if relay.watch_seats_taken(p.key_id, attempt_id) >= MAX_WATCHES_PER_KEY_MACHINE:
            raise ApiError(429, f"this key watches attempt {attempt_id} {MAX_WATCHES_PER_KEY_MACHINE} times "
                                "already (open views and unused tickets): close one first",
                           code=ViewEndReason.TOO_MANY_VIEWS.value)
        try:
            relay.tickets.admit(p.key_id)
        except TooManyTickets as e:
            raise ApiError(429, str(e)) from None

        def load() -> tuple[str | None, str, str, str | None]:
            with state.db() as s:
                a = s.get(Attempt, attempt_id)
                if a is None:
                    raise not_found("attempt", attempt_id)
                key = s.get(ApiKey, p.key_id)
                return a.runner_id, key.name if key is not None else p.key_id, a.status, a.outcome

        runner_id, key_name, status, outcome = await run_in_threadpool(load)
        if status not in LIVE_ATTEMPT or not takes_views(runner_id):
            now = f"is {status}" + (f" ({outcome})" if outcome else "")
            if status in LIVE_ATTEMPT:
                now += " on a runner that is not connected to this server, or is too old for live views"
            raise conflict(f"Attempt {attempt_id} {now}: only a running attempt's machine can be watched.",
                           code="not_running", status=status, outcome=outcome)
        # Read-only for admins too: the attempt's input is the agent's (a takeover's view is the holder's).
        return issued(lambda: relay.tickets.issue(key_id=p.key_id, key_name=key_name, read_only=True,
                                                  attempt_id=attempt_id))

    def takes_views(runner_id: str | None) -> bool:
        gw = st.gateway
        return runner_id is not None and gw is not None and gw.takes_views(runner_id)

    def issued(issue: Callable[[], Ticket]) -> dict[str, Any]:
        return view_object(issue)

    async def viewer(ws: WebSocket, ticket: str) -> None:
        await relay.viewer_endpoint(ws, ticket)

    async def runner(ws: WebSocket, view_id: str) -> None:
        await relay.runner_endpoint(ws, view_id)

    app.include_router(router)
    app.add_api_websocket_route(VIEWER_PATH, viewer)
    app.add_api_websocket_route(protocol.VIEW_PATH, runner)


__all__ = ["install", "view_object"]
