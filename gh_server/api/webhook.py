"""/v1/webhook: the org's webhook endpoint (admin writes, anyone reads)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from fastapi import APIRouter
from sqlalchemy.orm import Session

from gh_server.api.common import DB, Admin, Member
from gh_server.api.schemas import WebhookUpdate
from gh_server.auth import Principal
from gh_server.errors import invalid
from gh_server.models import WebhookEndpoint, utcnow
from gh_server.webhooks import ENDPOINT_ID, EVENT_TYPES, endpoint, new_secret

router = APIRouter(tags=["Webhook"])


def _out(ep: WebhookEndpoint | None, secret: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "object": "webhook",
        "url": ep.url if ep else None,
        "events": list(ep.events or []) if ep else [],
        "has_secret": bool(ep and ep.url and ep.secret),
        "event_types": list(EVENT_TYPES),
    }
    if secret is not None:
        body["secret"] = secret
    return body


@router.get("/v1/webhook", summary="The webhook endpoint")
def get_webhook(s: Session = DB, _p: Principal = Member) -> dict[str, Any]:
    return _out(endpoint(s))


@router.put("/v1/webhook", summary="Change the webhook endpoint (only the fields sent); url null removes it")
def put_webhook(body: WebhookUpdate, s: Session = DB, _p: Principal = Admin) -> dict[str, Any]:
    sent = body.model_fields_set
    ep = endpoint(s)
    if "url" in sent and body.url is None:
        if ep is not None:
            s.delete(ep)
            s.commit()
        return _out(None)
    if body.url is not None:
        u = urlparse(body.url)
        # Self-hosted: the receiver is often on the lab's own network, so http is allowed too.
        if u.scheme not in ("http", "https") or not u.netloc:
            raise invalid("url", "must be an http(s) URL")
    if body.events is not None:
        for i, e in enumerate(body.events):
            if e not in EVENT_TYPES:
                raise invalid(f"events[{i}]", f"unknown event type {e!r} (known: {', '.join(EVENT_TYPES)})")
    secret: str | None = None
    if ep is None:
        if body.url is None:
            raise invalid("url", "is required the first time")
        secret = new_secret()
        ep = WebhookEndpoint(id=ENDPOINT_ID, url=body.url, secret=secret, events=list(body.events or []))
        s.add(ep)
    else:
        if body.url is not None:
            ep.url = body.url
        if body.events is not None:
            ep.events = list(body.events)
        if body.rotate_secret:
            secret = new_secret()
            ep.secret = secret
    ep.updated_at = utcnow()
    s.commit()
    return _out(ep, secret)
