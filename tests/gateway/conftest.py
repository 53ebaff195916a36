"""A real gh-server (the API engineer's create_app on uvicorn, in a thread) with short liveness
bounds, plus helpers that put runners and runs straight into its database."""

from __future__ import annotations

import secrets
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from kit.net import free_port
from server.conftest import pg_cluster  # the API tests' throwaway cluster (tests/server/pg.py)

from gh_server.app import create_app
from gh_server.gateway import Gateway
from gh_server.listener import listen_socket
from gh_server.settings import AgentConfig, ModelEndpoint, Settings
from gh_server.state import ServerState

from .rows import Rows


@dataclass
class GwServer(Rows):
    base_url: str
    ws_url: str
    state: ServerState
    admin_key: str
    app: Any
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def gateway(self) -> Gateway:
        gw = self.state.gateway
        assert isinstance(gw, Gateway)
        return gw

    def session(self) -> Any:
        return self.state.db()

    def wake(self) -> None:
        self.state.wake()


def wait_for(pred: Any, timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll a predicate with a deadline (the server runs in another thread)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(0.02)


async def await_for(pred: Any, timeout: float = 30.0, what: str = "condition") -> Any:
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        v = await asyncio.to_thread(pred)
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(0.02)


def start_server(settings: Settings) -> GwServer:
    app = create_app(settings)
    st: ServerState = app.state.gh
    admin = settings.admin_api_key
    assert admin is not None
    cfg = uvicorn.Config(app, log_level="warning", lifespan="on", ws_max_size=16 * 1024 * 1024)
    server = uvicorn.Server(cfg)
    sock = listen_socket(settings.host, settings.port)  # the socket gh-server serves on; uvicorn closes it
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("gh-server did not start within 30 s")
        time.sleep(0.02)
    base = f"http://{settings.host}:{settings.port}"
    return GwServer(base, base.replace("http", "ws", 1) + "/v1/runners/connect", st, admin, app, server, thread)


def stop_server(srv: GwServer) -> None:
    if not srv.thread.is_alive():
        return
    srv.server.should_exit = True
    srv.thread.join(timeout=30)
    srv.state.engine.dispose()


def make_settings(data_dir: Path, **kw: Any) -> Settings:
    port = free_port()
    base: dict[str, Any] = dict(data_dir=data_dir, host="127.0.0.1", port=port, heartbeat_interval=0.5, dead_after=3.0,
                                runner_grace_seconds=2.0, admin_api_key="gh_live_test_" + secrets.token_urlsafe(16),
                                webhook_allow=["127.0.0.1"],  # the tests' receivers are on loopback
                                # Retries go out at once here; test_leasing's spacing test sets its own.
                                retry_backoff_seconds=[0.0])
    base.update(kw)
    return Settings(**base)


@pytest.fixture
def server_factory() -> Iterator[Any]:
    made: list[GwServer] = []
    dirs: list[tempfile.TemporaryDirectory[str]] = []

    def make(**kw: Any) -> GwServer:
        data_dir = kw.pop("data_dir", None)
        if data_dir is None:  # a second server may share the first one's data dir (one SQLite file)
            d = tempfile.TemporaryDirectory(prefix="gh-gw-")
            dirs.append(d)
            data_dir = Path(d.name)
        srv = start_server(make_settings(data_dir, **kw))
        made.append(srv)
        return srv

    yield make
    for srv in made:
        stop_server(srv)
    for d in dirs:
        d.cleanup()


@pytest.fixture
def server(server_factory: Any) -> GwServer:
    srv: GwServer = server_factory()
    return srv


@pytest.fixture(params=["sqlite", "postgres"])
def any_db_server(request: pytest.FixtureRequest, server_factory: Any) -> GwServer:
    """The same server on SQLite and on PostgreSQL (the scheduler's guarded UPDATEs must hold on both)."""
    if request.param == "sqlite":
        srv: GwServer = server_factory()
        return srv
    cluster = request.getfixturevalue("pg_cluster")
    pg: GwServer = server_factory(database_url=cluster.url(cluster.create_db()))
    return pg


__all__ = ["AgentConfig", "GwServer", "ModelEndpoint", "await_for", "pg_cluster", "wait_for"]
