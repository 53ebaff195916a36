"""Webhooks: the org's endpoint, signed events (`Eager-Signature: t=<unix>,v1=<hmac-sha256 hex of "t.body">`,
as the SDK's verify_webhook checks), and a delivery worker that retries with capped exponential backoff.

Deliveries are rows (`webhook_deliveries`), so an event survives a restart and several gh-server
processes can share the work: a worker claims a delivery by moving its `next_attempt_at` forward in an
UPDATE guarded by the value it read.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import secrets
import time
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gh_common import timeouts
from gh_server import egress
from gh_server.models import WebhookDelivery, WebhookEndpoint, new_id, utcnow
from gh_server.serialize import ts
from gh_server.state import ServerState

log = logging.getLogger("gh_server.webhooks")

EVENT_TYPES = ("test_run.completed", "start_state.ready", "start_state.failed")
SIGNATURE_HEADER = "Eager-Signature"
ORG_ID = "org_self_hosted"
ENDPOINT_ID = 1

# Wake-ups of the delivery workers in this process (set by install), so an event goes out at once.
_wakers: list[ServerState] = []


def new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    t = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode("utf-8"), str(t).encode("ascii") + b"." + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def endpoint(session: Session) -> WebhookEndpoint | None:
    return session.get(WebhookEndpoint, ENDPOINT_ID)


def _data_key(event_type: str) -> str:
    return event_type.split(".", 1)[0]


def enqueue(session: Session, event_type: str, payload: dict[str, Any]) -> str | None:
    """Records an event for delivery in the caller's transaction (it goes out only if that commits).
    `payload` is the object the event is about (a test_run, a start_state). Returns the event id, or None
    when no endpoint wants it."""
    ep = endpoint(session)
    if ep is None or not ep.url:
        return None
    if ep.events and event_type not in ep.events:
        return None
    event_id = new_id("evt_")
    now = utcnow()
    body = {
        "id": event_id,
        "type": event_type,
        "created_at": ts(now),
        "org_id": ORG_ID,
        "data": {_data_key(event_type): payload},
    }
    session.add(WebhookDelivery(id=event_id, event_type=event_type, payload=body, next_attempt_at=now, created_at=now))
    for st in _wakers:
        st.wake_webhooks()
    return event_id


def backoff(settings: Any, attempts: int) -> float:
    return float(min(settings.webhook_backoff_cap, settings.webhook_backoff_base * (2 ** max(attempts - 1, 0))))


def _claim(st: ServerState, limit: int = 20) -> list[tuple[str, dict[str, Any], int, str, str]]:
    """Due deliveries, each claimed for `webhook_timeout` + slack so another process skips it meanwhile."""
    out: list[tuple[str, dict[str, Any], int, str, str]] = []
    now = utcnow()
    with st.db.begin() as s:
        ep = endpoint(s)
        if ep is None or not ep.url:
            return out
        due = s.execute(
            select(
                WebhookDelivery.id, WebhookDelivery.next_attempt_at, WebhookDelivery.payload, WebhookDelivery.attempts
            )
            .where(WebhookDelivery.delivered_at.is_(None), WebhookDelivery.next_attempt_at <= now)
            .order_by(WebhookDelivery.next_attempt_at)
            .limit(limit)
        ).all()
        hold = now + timedelta(seconds=st.settings.webhook_timeout + 30)
        for d_id, at, payload, n in due:
            claimed = s.execute(
                update(WebhookDelivery)
                .where(WebhookDelivery.id == d_id, WebhookDelivery.next_attempt_at == at)
                .values(next_attempt_at=hold)
            ).rowcount  # type: ignore[attr-defined]
            if claimed:
                out.append((d_id, payload, n, ep.url, ep.secret))
    return out


def _finish(st: ServerState, d_id: str, attempts: int, error: str | None) -> None:
    now = utcnow()
    with st.db.begin() as s:
        values: dict[str, Any] = {"attempts": attempts, "last_error": error}
        if error is None:
            values.update(delivered_at=now, next_attempt_at=None)
        elif attempts >= st.settings.webhook_max_attempts:
            values.update(next_attempt_at=None)  # gave up; last_error says why
            log.warning("webhook %s given up after %d attempts: %s", d_id, attempts, error)
        else:
            values.update(next_attempt_at=now + timedelta(seconds=backoff(st.settings, attempts)))
        s.execute(update(WebhookDelivery).where(WebhookDelivery.id == d_id).values(**values))


async def deliver_due(st: ServerState, client: httpx.AsyncClient) -> int:
    """One pass: send every due delivery once. Returns how many were sent successfully."""
    claimed = await asyncio.to_thread(_claim, st)
    ok = 0
    for d_id, payload, n, url, secret in claimed:
        raw = json.dumps(payload, separators=(",", ":")).encode("utf-8")
        headers = {"Content-Type": "application/json", SIGNATURE_HEADER: sign(secret, raw), "User-Agent": "gh-server"}
        error: str | None = None
        try:
            # Resolved now, and sent to the address checked (gh_server.egress): not where a second lookup says.
            target = await egress.resolve(url, st.settings.webhook_allow, timeout=st.settings.webhook_timeout)
            resp = await client.post(target.url, content=raw, headers={**headers, **target.headers},
                                     extensions=target.extensions, timeout=st.settings.webhook_timeout)
            if not 200 <= resp.status_code < 300:
                error = f"HTTP {resp.status_code}"
        except egress.Refused as e:
            error = f"refused: {e}"[:500]
            log.warning("webhook %s not sent: %s", d_id, e)
        except httpx.HTTPError as e:
            error = f"{type(e).__name__}: {e}"[:500]
        await asyncio.to_thread(_finish, st, d_id, n + 1, error)
        ok += error is None
    return ok


async def worker(st: ServerState, poll_seconds: float = 5.0) -> None:
    """Delivers until cancelled; wakes at once on a new event, else polls (retries come due by time)."""
    if st.webhook_wakeup is None:
        st.webhook_wakeup = asyncio.Event()
    async with httpx.AsyncClient(follow_redirects=False) as client:
        while True:
            try:
                await deliver_due(st, client)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("webhook delivery pass failed")
            try:
                async with timeouts.timeout(poll_seconds):
                    await st.webhook_wakeup.wait()
            except TimeoutError:
                pass
            st.webhook_wakeup.clear()


def install(app: Any, st: ServerState) -> None:
    _wakers.append(st)
    st.background.append(worker)
