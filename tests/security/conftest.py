"""The security suite: a real gh-server (tests/gateway's fixtures: uvicorn in a thread, free port)."""

from __future__ import annotations

from gateway.conftest import server, server_factory

__all__ = ["server", "server_factory"]
