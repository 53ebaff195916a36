"""The console's sign-in: an API key traded once for a session cookie and a CSRF token.

The browser sends its key once (POST /v1/console/session); the page never keeps it. What it gets back:
- the cookie, HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it), Path=/,
  Max-Age the session's life. Its name goes by the request's scheme (a trusted proxy's X-Forwarded-Proto
  counts: the setting `trusted_proxies`, gh_server/app.py): over https it is `__Host-gh_console`, with
  Secure and no Domain, which a browser takes only from a secure origin for this host alone, so a page
  on plain http or on a sibling host cannot plant a session of its own choosing; over http (a lab's
  127.0.0.1, where a browser refuses a `__Host-` cookie without Secure) it is `gh_console`. Each
  scheme reads only its own name: an https request never takes the plain cookie, which anything on
  plain http to this host could have set;
- a CSRF token the page sends as `X-CSRF-Token` on every request that is not GET, HEAD or OPTIONS.

Only the sha256 of the cookie's secret is stored (as API keys are, gh_server/auth.py), beside the key it
stands for: a session lives no longer than its expiry, and not a moment after its key is revoked (every
lookup joins the key and checks `revoked_at`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from fastapi import Request, Response
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from gh_server.models import ApiKey, ConsoleSession, utcnow
from gh_server.timestamps import ts

COOKIE = "gh_console"  # over plain http
SECURE_COOKIE = "__Host-" + COOKIE  # over https: Secure, Path=/, no Domain (the prefix's rules)
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# A working day: a person signs in once in the morning; a forgotten tab stops working by the next one.
LIFETIME = timedelta(hours=12)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ConsoleSignIn:
    key_id: str
    role: str
    csrf_token: str
    expires_at: datetime

    def body(self) -> dict[str, str | None]:
        return {"object": "console_session", "role": self.role, "csrf_token": self.csrf_token,
                "expires_at": ts(self.expires_at)}


def start(session: Session, key: ApiKey) -> tuple[str, ConsoleSignIn]:
    """A new session for `key`: returns the cookie's secret (never stored) and what the page is told.
    Expired sessions are removed here, so the table holds only live ones and those of the last day."""
    now = utcnow()
    session.execute(delete(ConsoleSession).where(ConsoleSession.expires_at < now))
    secret = secrets.token_urlsafe(32)
    row = ConsoleSession(secret_hash=_hash(secret), key_id=key.id, csrf_token=secrets.token_urlsafe(32),
                         created_at=now, expires_at=now + LIFETIME)
    session.add(row)
    session.flush()
    return secret, ConsoleSignIn(key.id, key.role, row.csrf_token, row.expires_at)


def lookup(session: Session, secret: str) -> ConsoleSignIn | None:
    """The live session the cookie's secret names: None when unknown, expired, or its key is revoked."""
    h = _hash(secret)
    row = session.execute(
        select(ConsoleSession.secret_hash, ConsoleSession.csrf_token, ConsoleSession.expires_at, ApiKey.id,
               ApiKey.role, ApiKey.revoked_at)
        .join(ApiKey, ApiKey.id == ConsoleSession.key_id)
        .where(ConsoleSession.secret_hash == h)
    ).first()
    if row is None or not hmac.compare_digest(row.secret_hash, h):
        return None
    if row.revoked_at is not None or row.expires_at <= utcnow():
        return None
    return ConsoleSignIn(row.id, row.role, row.csrf_token, row.expires_at)


def end(session: Session, secret: str) -> None:
    session.execute(delete(ConsoleSession).where(ConsoleSession.secret_hash == _hash(secret)))


def csrf_ok(request: Request, signed_in: ConsoleSignIn) -> bool:
    """A request that may change state carries the session's token in a header: a page on another origin
    cannot set it (and SameSite=Strict keeps the cookie off its requests anyway)."""
    if request.method.upper() in SAFE_METHODS:
        return True
    sent = request.headers.get(CSRF_HEADER, "")
    return bool(sent) and hmac.compare_digest(sent.encode(), signed_in.csrf_token.encode())


def cookie_name(request: Request) -> str:
    """The session cookie's name for this request's scheme (after the trusted proxy's word)."""
    return SECURE_COOKIE if request.url.scheme == "https" else COOKIE


def cookie_secret(request: Request) -> str | None:
    """The session's secret this request carries, under its scheme's name only."""
    return request.cookies.get(cookie_name(request)) or None


def set_cookie(response: Response, request: Request, secret: str) -> None:
    name = cookie_name(request)
    response.set_cookie(name, secret, max_age=int(LIFETIME.total_seconds()), path="/", httponly=True,
                        samesite="strict", secure=name == SECURE_COOKIE)


def clear_cookie(response: Response, request: Request) -> None:
    name = cookie_name(request)
    response.delete_cookie(name, path="/", httponly=True, samesite="strict", secure=name == SECURE_COOKIE)
