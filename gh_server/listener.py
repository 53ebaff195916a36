"""The listening socket gh-server's uvicorn serves on, bound before the app starts (gh_server/cli.py, and
the embedded control plane of `gh-runner local`, gh_local/local.py), so a port in use is said at once and
no other process takes the port in between.

Made with protocol IPPROTO_TCP, as asyncio's own `create_server(host, port)` makes it from getaddrinfo:
asyncio sets TCP_NODELAY on each accepted connection only when the socket says it is TCP
(`base_events._set_nodelay`), and an accepted socket inherits the listening socket's protocol. With the
default protocol 0, Nagle's algorithm held every response's body (a second small write after its
headers) until the client's delayed ACK, 40 ms on Linux: a client making requests one after another (the
SDK, an agent's machine requests) waited 44 ms for each (bench/api_round_trip.py).
"""

from __future__ import annotations

import socket


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (IPv6 when the host is one; port 0 takes a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


__all__ = ["listen_socket"]
