"""The gh-server ASGI app: /v1 Evals API, health, and (when installed) the runner gateway."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from gh_server import db
from gh_server.settings import Settings
from gh_server.state import ServerState


def create_state(settings: Settings) -> ServerState:
    engine = db.make_engine(settings)
    return ServerState(settings=settings, engine=engine, db=db.make_sessionmaker(engine))


def create_app(settings: Settings, state: ServerState | None = None) -> FastAPI:
    """Build the app. The schema is upgraded here (not lazily) so a broken database fails at start."""
    st = state or create_state(settings)
    db.upgrade(st.engine)
    from gh_server.auth import ensure_admin_key

    ensure_admin_key(st)
    st.metrics.watch_db(st.engine, st.db)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        st.extras["loop"] = asyncio.get_running_loop()
        st.wakeup = asyncio.Event()
        st.webhook_wakeup = asyncio.Event()
        tasks: list[asyncio.Task[Any]] = []
        if settings.start_background_tasks:
            for start in st.background:
                tasks.append(asyncio.create_task(start(st)))
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t

    # No /docs or /redoc: the contract is Bearer auth everywhere but /openapi.json and /healthz.
    app = FastAPI(title="gh-server Evals API", version="1", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.gh = st
    _install_optional(app, st)
    return app


def _install_optional(app: FastAPI, st: ServerState) -> None:
    """Parts built by other modules plug in through `install(app, state)` when present."""
    names = ["gh_server.api", "gh_server.webhooks", "gh_server.replays", "gh_server.start_state_jobs"] + (
        ["gh_server.gateway"] if st.settings.gateway else []
    )
    for name in names:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        install = getattr(mod, "install", None)
        if install is not None:
            install(app, st)
