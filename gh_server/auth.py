"""API keys: Bearer auth (or the console's session cookie, gh_server/console_sessions.py), roles (admin /
member), hashing, the admin key at first start.

Keys and runner tokens are stored as sha256 hex of the whole secret; lookups go by that hash (an
index), and the stored hash is compared again with hmac.compare_digest so no byte-by-byte early exit
on the secret ever happens in our code.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from fastapi import Depends, Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from gh_server import console_sessions
from gh_server.errors import ApiError
from gh_server.models import ApiKey, new_id, utcnow
from gh_server.state import ServerState

API_KEY_PREFIX = "gh_live_"
RUNNER_TOKEN_PREFIX = "gh_rn_"
ROLES = ("admin", "member")
ENV_KEY_NAME = "admin (GH_SERVER_API_KEY)"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def new_api_key() -> str:
    return API_KEY_PREFIX + secrets.token_urlsafe(32)


def new_runner_token() -> str:
    return RUNNER_TOKEN_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Principal:
    key_id: str
    role: str

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def create_key(session: Session, name: str, role: str, secret: str | None = None) -> tuple[ApiKey, str]:
    """Stores a key (hashed) and returns the row and the plain key (shown once)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    plain = secret or new_api_key()
    row = ApiKey(id=new_id("ak_"), name=name, role=role, key_hash=hash_secret(plain), prefix=plain[:12])
    session.add(row)
    session.flush()
    return row, plain


def ensure_admin_key(st: ServerState, out: TextIO | None = None) -> str | None:
    """GH_SERVER_API_KEY (settings.admin_api_key) is registered as an admin key; without it, an admin key is
    generated on first start and written to DATA_DIR/admin-api-key (0600). It is printed once, and only
    when stdout is a terminal: under a service manager stdout is a journal other users may read. Returns
    the key when it was just generated."""
    stream = out if out is not None else sys.stdout
    with st.db.begin() as s:
        if st.settings.admin_api_key:
            h = hash_secret(st.settings.admin_api_key)
            # A changed GH_SERVER_API_KEY replaces the previous one: the old value stops working.
            for old in s.scalars(select(ApiKey).where(ApiKey.name == ENV_KEY_NAME, ApiKey.revoked_at.is_(None))):
                if not hmac.compare_digest(old.key_hash, h):
                    old.revoked_at = utcnow()
            if s.scalar(select(ApiKey).where(ApiKey.key_hash == h)) is None:
                create_key(s, ENV_KEY_NAME, "admin", st.settings.admin_api_key)
            return None
        existing = s.scalar(select(ApiKey.id).where(ApiKey.role == "admin", ApiKey.revoked_at.is_(None)).limit(1))
        if existing is not None:
            return None
        _row, plain = create_key(s, "admin (generated)", "admin")
        path = Path(st.settings.data_dir) / "admin-api-key"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(plain + "\n")
        os.chmod(path, 0o600)
    if _is_terminal(stream):
        print(f"gh-server: generated the admin API key (also in {path}, mode 0600):\n{plain}", file=stream, flush=True)
    else:
        print(f"gh-server: generated an admin API key: read it from {path} (mode 0600); it is not printed "
              "because stdout is not a terminal", file=sys.stderr, flush=True)
    return plain


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed, or not a real stream
        return False


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization")
    if not header:
        raise ApiError(401, "Missing API key: send Authorization: Bearer <key>.")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "Malformed Authorization header: use Bearer <key>.")
    return token.strip()


def authenticate(request: Request) -> Principal:
    """The Bearer key, or (with no Authorization header) the console's session cookie, whose requests that
    may change state must carry its CSRF token. The cookie stands for an API key, never a runner token."""
    st: ServerState = request.app.state.gh
    cookie = console_sessions.cookie_secret(request)
    if cookie and not request.headers.get("authorization"):
        return _from_cookie(st, request, cookie)
    token = _bearer(request)
    h = hash_secret(token)
    with st.db() as s:
        row = s.execute(
            select(ApiKey.id, ApiKey.role, ApiKey.key_hash, ApiKey.revoked_at).where(ApiKey.key_hash == h)
        ).first()
    if row is None or not hmac.compare_digest(row.key_hash, h) or row.revoked_at is not None:
        raise ApiError(401, "Invalid or revoked API key.")
    principal = Principal(key_id=row.id, role=row.role)
    rate_limit(st, principal)
    return principal


def _from_cookie(st: ServerState, request: Request, cookie: str) -> Principal:
    with st.db() as s:
        signed_in = console_sessions.lookup(s, cookie)
    if signed_in is None:
        raise ApiError(401, "The console session has ended (signed out, expired, or its key was revoked): "
                            "sign in again.")
    if not console_sessions.csrf_ok(request, signed_in):
        raise ApiError(403, f"Missing or wrong {console_sessions.CSRF_HEADER} header: a console request that "
                            "changes something sends the csrf_token its sign-in returned.")
    principal = Principal(key_id=signed_in.key_id, role=signed_in.role)
    rate_limit(st, principal)
    return principal


def rate_limit(st: ServerState, p: Principal) -> None:
    rate = st.settings.rate_limit_per_second
    if rate <= 0:
        return
    import time

    buckets = st.extras.setdefault("rate_buckets", {})
    assert isinstance(buckets, dict)
    now = time.monotonic()
    tokens, last = buckets.get(p.key_id, (float(st.settings.rate_limit_burst), now))
    tokens = min(float(st.settings.rate_limit_burst), tokens + (now - last) * rate)
    if tokens < 1.0:
        buckets[p.key_id] = (tokens, now)
        err = ApiError(429, "Too many requests: slow down.")
        err.headers["Retry-After"] = str(max(1, int((1.0 - tokens) / rate + 0.999)))
        raise err
    buckets[p.key_id] = (tokens - 1.0, now)


# The role checks do no I/O, so they are async: a sync dependency is a trip through the thread pool
# (tests/server/test_thread_trips.py says why that counts). `authenticate` reads the database, so it stays
# sync: its one trip is the lookup.
async def require_member(principal: Principal = Depends(authenticate)) -> Principal:
    return principal


async def require_admin(principal: Principal = Depends(authenticate)) -> Principal:
    if not principal.is_admin:
        raise ApiError(403, "This needs an admin API key: member keys can read, and start, cancel and rerun runs.")
    return principal
