"""Webhook URLs are resolved at send time and refused on loopback, link-local (metadata), private and
other non-public addresses, unless the host is on the webhook_allow list (gh_server.egress)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from gateway.conftest import GwServer, wait_for
from sqlalchemy import select

from gh_server import egress, webhooks
from gh_server.models import WebhookDelivery


@pytest.mark.parametrize(("url", "why"), [
    ("http://127.0.0.1:8700/v1/test_cases", "loopback"),
    ("http://localhost/hook", "loopback"),
    ("http://[::1]/hook", "loopback"),
    ("http://[::ffff:127.0.0.1]/hook", "loopback"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://[fd00:ec2::254]/latest/meta-data/", "metadata"),
    ("http://10.1.2.3/hook", "private"),
    ("http://192.168.122.1/hook", "private"),
    ("http://100.100.100.200/latest/meta-data/", "not a public address"),  # Alibaba's, in 100.64/10
    ("http://0.0.0.0/hook", "private"),
    ("ftp://example.com/hook", "not an http(s) URL"),
])
async def test_non_public_targets_are_refused(url: str, why: str) -> None:
    with pytest.raises(egress.Refused) as e:
        await egress.resolve(url)
    assert why in str(e.value)


async def test_public_and_allowed_targets_pass_with_the_name_kept() -> None:
    t = await egress.resolve("https://93.184.215.14:8443/hook?x=1")
    assert t.url == "https://93.184.215.14:8443/hook?x=1" and t.address == "93.184.215.14"
    t = await egress.resolve("http://localhost:9/hook", allow=["localhost"])
    assert t.address in ("127.0.0.1", "::1") and t.host_header == "localhost:9" and t.extensions == {
        "sni_hostname": "localhost"}
    t = await egress.resolve("http://10.20.30.40/hook", allow=["10.20.0.0/16"])
    assert t.url == "http://10.20.30.40/hook"
    with pytest.raises(egress.Refused):
        await egress.resolve("http://10.21.0.1/hook", allow=["10.20.0.0/16", "lab-receiver"])


class _Receiver:
    def __init__(self) -> None:
        self.got: queue.Queue[dict[str, str]] = queue.Queue()
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.got.put(dict(self.headers.items()))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    r = _Receiver()
    yield r
    r.close()


def _send_event(srv: GwServer, url: str) -> str:
    with httpx.Client(base_url=srv.base_url, timeout=30, headers={"Authorization": f"Bearer {srv.admin_key}"}) as c:
        assert c.put("/v1/webhook", json={"url": url, "events": []}).status_code == 200
    with srv.state.db.begin() as s:
        event_id = webhooks.enqueue(s, "test_run.completed", {"test_run_id": "tr_x"})
    assert event_id is not None
    srv.state.wake_webhooks()
    return event_id


def _delivery(srv: GwServer, event_id: str) -> Any:
    with srv.state.db() as s:
        return s.execute(select(WebhookDelivery.attempts, WebhookDelivery.last_error, WebhookDelivery.delivered_at)
                         .where(WebhookDelivery.id == event_id)).first()


def test_loopback_receiver_refused_at_send_time_unless_allowed(server_factory: Any, receiver: _Receiver) -> None:
    url = f"http://localhost:{receiver.port}/hook"
    srv: GwServer = server_factory(webhook_allow=[])
    event_id = _send_event(srv, url)
    row = wait_for(lambda: (d := _delivery(srv, event_id)) and d.attempts >= 1 and d, what="a delivery attempt")
    assert row.delivered_at is None and "refused" in row.last_error and "loopback" in row.last_error
    assert receiver.got.empty()

    allowed: GwServer = server_factory(webhook_allow=["localhost"])
    event_id = _send_event(allowed, url)
    headers = receiver.got.get(timeout=30)
    assert headers["Host"] == f"localhost:{receiver.port}"  # sent to the checked address, under its name
    wait_for(lambda: (d := _delivery(allowed, event_id)) and d.delivered_at, what="delivered")
