"""/v1/console/session: the console's sign-in, its state, and sign-out (gh_server/console_sessions.py).

The only place an API key is traded for a cookie. The page holds the CSRF token in memory and asks
GET /v1/console/session for it again after a reload: the cookie, which no script can read, is what
survives the reload."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import APIRouter, Request, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from gh_server import console_sessions
from gh_server.api.common import DB
from gh_server.api.schemas import ConsoleSignInBody
from gh_server.auth import Principal, hash_secret, rate_limit
from gh_server.errors import ApiError
from gh_server.models import ApiKey

router = APIRouter(tags=["Console"])
NO_STORE = {"Cache-Control": "no-store"}
SIGNED_OUT = "Not signed in to the console (or the session expired, or its key was revoked): sign in again."


@router.post("/v1/console/session", summary="Sign in to the console with an API key: sets the session cookie")
def sign_in(body: ConsoleSignInBody, request: Request, response: Response, s: Session = DB) -> dict[str, Any]:
    h = hash_secret(body.api_key.strip())
    key = s.scalar(select(ApiKey).where(ApiKey.key_hash == h))
    if key is None or not hmac.compare_digest(key.key_hash, h) or key.revoked_at is not None:
        raise ApiError(401, "Invalid or revoked API key.")
    rate_limit(request.app.state.gh, Principal(key_id=key.id, role=key.role))
    secret, signed_in = console_sessions.start(s, key)
    s.commit()
    console_sessions.set_cookie(response, request, secret)
    response.headers.update(NO_STORE)
    return signed_in.body()


@router.get("/v1/console/session", summary="The console session of this browser (role, CSRF token, expiry)")
def current(request: Request, response: Response, s: Session = DB) -> dict[str, Any]:
    secret = console_sessions.cookie_secret(request)
    signed_in = console_sessions.lookup(s, secret) if secret else None
    if signed_in is None:
        raise ApiError(401, SIGNED_OUT)
    response.headers.update(NO_STORE)
    return signed_in.body()


@router.delete("/v1/console/session", summary="Sign out of the console: ends the session, clears the cookie")
def sign_out(request: Request, response: Response, s: Session = DB) -> dict[str, Any]:
    secret = console_sessions.cookie_secret(request)
    if not secret:
        raise ApiError(401, SIGNED_OUT)
    signed_in = console_sessions.lookup(s, secret)
    # A live session is ended only with its CSRF token (as any change is); a dead one only loses its cookie.
    if signed_in is not None and not console_sessions.csrf_ok(request, signed_in):
        raise ApiError(403, f"Missing or wrong {console_sessions.CSRF_HEADER} header.")
    console_sessions.end(s, secret)
    s.commit()
    console_sessions.clear_cookie(response, request)
    return {"object": "console_session", "deleted": True}
