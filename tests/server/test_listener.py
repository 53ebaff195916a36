"""gh-server's listening socket (gh_server/listener.py): every connection uvicorn accepts on it has Nagle's
algorithm off, so a response's body is not held behind its headers until the client's delayed ACK."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import uvicorn

from gh_server.listener import listen_socket


async def _ok(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_every_connection_uvicorn_accepts_on_it_has_nodelay(host: str) -> None:
    try:
        sock = listen_socket(host, 0)
    except OSError as e:
        pytest.skip(f"no {host} here: {e}")
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_ok, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start within 30 s"
            time.sleep(0.02)
        url_host = f"[{host}]" if ":" in host else host
        with httpx.Client(base_url=f"http://{url_host}:{port}", timeout=10) as client:
            assert client.get("/").text == "ok"  # the connection stays open (keep-alive) while it is read
            accepted = [c.transport.get_extra_info("socket") for c in server.server_state.connections]
            assert len(accepted) == 1
            assert accepted[0].getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def test_a_port_in_use_is_refused_at_once() -> None:
    first = listen_socket("127.0.0.1", 0)
    try:
        with pytest.raises(OSError):
            listen_socket("127.0.0.1", first.getsockname()[1])
    finally:
        first.close()
