"""Query strings (a replay URL's token) never reach the access log: a real uvicorn, logging at info."""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from pathlib import Path

import httpx
import uvicorn
from gateway.conftest import make_settings

from gh_server.app import create_app


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_access_log_has_paths_without_query_strings() -> None:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        settings = make_settings(Path(d), gateway=False)
        app = create_app(settings)
        server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="info",
                                               access_log=True, lifespan="on"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        keep = _Keep()
        logging.getLogger("uvicorn.access").addHandler(keep)
        try:
            deadline = time.monotonic() + 30
            while not server.started:
                assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
                time.sleep(0.02)
            secret = "1999999999.c2VjcmV0LXJlcGxheS10b2tlbg"
            with httpx.Client(base_url=f"http://{settings.host}:{settings.port}", timeout=30) as c:
                c.get(f"/v1/attempts/at_nope/replay?token={secret}")
                c.get("/healthz")
            deadline = time.monotonic() + 10
            while len(keep.lines) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            logging.getLogger("uvicorn.access").removeHandler(keep)
            server.should_exit = True
            thread.join(timeout=30)
            app.state.gh.engine.dispose()
    replay = [line for line in keep.lines if "/v1/attempts/at_nope/replay" in line]
    assert replay, keep.lines  # the request is logged, by path
    assert all(secret not in line and "token=" not in line for line in keep.lines), keep.lines
