"""Request bodies are refused with 413 before auth and before parsing (gh_server.bodylimit)."""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx
from gateway.conftest import GwServer


def raw_request(srv: GwServer, head: bytes, body_chunks: list[bytes] = ()) -> tuple[int, dict[str, Any]]:  # type: ignore[assignment]
    """One HTTP/1.1 exchange on a raw socket, so the body can lie about or omit its length."""
    host, port = srv.state.settings.host, srv.state.settings.port
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(head)
        for c in body_chunks:
            try:
                s.sendall(c)
            except (BrokenPipeError, ConnectionResetError):
                break  # the server answered and closed before taking it all: that is the point
        data = b""
        while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + _length(data):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1])
    body = data.split(b"\r\n\r\n", 1)[1]
    return status, json.loads(body)


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            return int(v)
    return 0


def test_declared_length_over_limit_is_413_before_auth(server_factory: Any) -> None:
    srv: GwServer = server_factory(max_body_bytes=1_000_000)
    # 60 MB announced, no auth, nothing sent after the headers: the answer comes from the header alone.
    head = (b"POST /v1/test_cases HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 60000000\r\n\r\n")
    status, body = raw_request(srv, head)
    assert status == 413
    assert body["error"]["type"] == "invalid_request"
    assert body["error"]["limit_bytes"] == 1_000_000 and "1,000,000 bytes" in body["error"]["message"]


def test_streamed_body_over_limit_is_413_before_auth(server_factory: Any) -> None:
    srv: GwServer = server_factory(max_body_bytes=1_000_000)
    # Chunked: no Content-Length to check, so the streamed size decides. Not JSON either: never parsed.
    head = b"POST /v1/test_cases HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    piece = b"x" * 200_000
    chunks = [b"%x\r\n%s\r\n" % (len(piece), piece)] * 8 + [b"0\r\n\r\n"]
    status, body = raw_request(srv, head, chunks)
    assert status == 413 and body["error"]["limit_bytes"] == 1_000_000


def test_body_under_limit_reaches_auth_and_batch_has_its_own_limit(server_factory: Any) -> None:
    srv: GwServer = server_factory(max_body_bytes=100_000, max_batch_body_bytes=300_000)
    with httpx.Client(base_url=srv.base_url, timeout=30) as c:
        small = c.post("/v1/test_cases", content=b"{}", headers={"content-type": "application/json"})
        assert small.status_code == 401  # under the limit: auth runs as before
        big = b'{"cases": [' + b" " * 200_000 + b"]}"
        assert c.post("/v1/test_cases", content=big).status_code == 413
        # The batch endpoint takes up to its own, larger, limit; past it, 413 as well.
        assert c.post("/v1/test_cases/batch", content=big).status_code == 401
        huge = b" " * 400_000
        resp = c.post("/v1/test_cases/batch", content=huge)
        assert resp.status_code == 413 and resp.json()["error"]["limit_bytes"] == 300_000
        # An authenticated request under the limit works end to end.
        ok = c.get("/v1/test_cases", headers={"Authorization": f"Bearer {srv.admin_key}"})
        assert ok.status_code == 200
