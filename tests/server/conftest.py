"""A real gh-server (uvicorn on a free loopback port, in a thread) per test module, on SQLite and on
PostgreSQL (a throwaway cluster), driven through the official guidinghand SDK."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
from guidinghand import Eager
from kit.net import free_port

from gh_server.app import HTTP_KEEP_ALIVE_S, create_app
from gh_server.auth import create_key
from gh_server.listener import listen_socket
from gh_server.live.sockets import LiveBoundedWebSockets
from gh_server.settings import Settings
from gh_server.state import ServerState

from .pg import PgCluster, start_cluster


@dataclass
class Server:
    base_url: str
    admin_key: str
    member_key: str
    state: ServerState
    data_dir: Path

    def client(self, key: str | None = None, **kw: object) -> Eager:
        return Eager(api_key=key or self.admin_key, base_url=self.base_url, max_retries=0, timeout=30, **kw)  # type: ignore[arg-type]

    @property
    def admin(self) -> Eager:
        return self.client(self.admin_key)

    @property
    def member(self) -> Eager:
        return self.client(self.member_key)


class RunningServer:
    """uvicorn in a thread; start() waits (with a deadline) until it accepts requests."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app = create_app(settings)
        cfg = uvicorn.Config(self.app, log_level="warning", lifespan="on",
                             ws=LiveBoundedWebSockets, timeout_keep_alive=HTTP_KEEP_ALIVE_S)  # as gh-server's own
        self.server = uvicorn.Server(cfg)
        self.sock = listen_socket(settings.host, settings.port)  # the socket gh-server serves on
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("gh-server did not start within 30 s")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()
        self.app.state.gh.engine.dispose()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    try:
        cluster = start_cluster()
    except Exception as e:  # a missing PostgreSQL is a failure, never a silent skip
        pytest.fail(f"PostgreSQL could not be started: {e}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    if request.param == "sqlite":
        yield None
        return
    cluster: PgCluster = request.getfixturevalue("pg_cluster")
    yield cluster.url(cluster.create_db())


def make_settings(db_url: str | None, **kw: object) -> tuple[Settings, Path]:
    data_dir = Path(tempfile.mkdtemp(prefix="gh-server-test-", dir="/var/tmp"))
    fields: dict[str, object] = {"admin_api_key": None, "gateway": False, "webhook_allow": ["127.0.0.1"], **kw}
    settings = Settings(data_dir=data_dir, database_url=db_url, host="127.0.0.1", port=free_port(), **fields)  # type: ignore[arg-type]
    return settings, data_dir


@pytest.fixture(scope="module")
def server(db_url: str | None) -> Iterator[Server]:
    settings, data_dir = make_settings(db_url)
    running = RunningServer(settings)
    running.start()
    try:
        admin_key = (data_dir / "admin-api-key").read_text().strip()
        st: ServerState = running.app.state.gh
        with st.db.begin() as s:
            _row, member_key = create_key(s, "member for tests", "member")
        yield Server(
            base_url=f"http://127.0.0.1:{settings.port}",
            admin_key=admin_key,
            member_key=member_key,
            state=st,
            data_dir=data_dir,
        )
    finally:
        running.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def case_body(i: int = 0, **kw: object) -> dict[str, object]:
    body: dict[str, object] = {
        "name": f"case {i}",
        "prompt": f"fix thing {i}",
        "start_state": "linux-tiny",
        "success": {"check_script": "echo False"},
    }
    body.update(kw)
    return body
