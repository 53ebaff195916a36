"""The gh-server ASGI app: /v1 Evals API, health, and (when installed) the runner gateway."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from gh_server import accesslog, api, console_page, db, errors, queue_wait, replays, start_state_jobs, webhooks
from gh_server.agents.machine_api import router as machine_router
from gh_server.agents.machine_limits import InFlightLimit
from gh_server.agents.supervisor import MACHINE_API_PATH, AgentSupervisor
from gh_server.attempts.intake import ResultIntake
from gh_server.attempts.lease import SavePointPolicy
from gh_server.attempts.scheduler import Scheduler
from gh_server.auth import ensure_admin_key
from gh_server.bodylimit import BodyLimit
from gh_server.fair_share import FairShare
from gh_server.gateway import PATH as GATEWAY_PATH
from gh_server.gateway import Gateway
from gh_server.live import api as live_api
from gh_server.live.screen_relay import LiveRelay
from gh_server.machine_relay import PgRelay
from gh_server.settings import Settings
from gh_server.start_states import apply_job_result
from gh_server.state import ServerState
from gh_server.takeover import routes as takeover_routes
from gh_server.yamlbody import YamlBody


def create_state(settings: Settings) -> ServerState:
    engine = db.make_engine(settings)
    return ServerState(settings=settings, engine=engine, db=db.make_sessionmaker(engine))


# How long an idle HTTP connection is kept. Longer than any client keeps one for reuse (httpx, under the
# official SDK, 5 s): at uvicorn's own 5 s the two closed one connection at the same moment, and a POST
# sent on it as the server closed it failed with "Server disconnected without sending a response".
HTTP_KEEP_ALIVE_S = 75


def create_app(settings: Settings, state: ServerState | None = None) -> FastAPI:
    """Build the app. The schema is upgraded here (not lazily) so a broken database fails at start."""
    st = state or create_state(settings)
    db.upgrade(st.engine)
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
    accesslog.install()
    _wire(app, st)
    errors.document(app)
    # Outside the routes (and so before auth and parsing): see gh_server.bodylimit, agents.machine_limits,
    # gh_server.yamlbody (inside the body limit: the last added runs first).
    app.add_middleware(YamlBody)
    app.add_middleware(InFlightLimit, prefix=MACHINE_API_PATH, limit=settings.machine_api_max_in_flight)
    app.add_middleware(BodyLimit, max_body=settings.max_body_bytes, max_batch_body=settings.max_batch_body_bytes)
    # Outside the body limit: a request waiting for its caller's share has had nothing of it read.
    app.add_middleware(FairShare, in_flight=settings.api_in_flight_per_caller,
                       waiting=settings.api_waiting_per_caller, not_shared=(MACHINE_API_PATH,))
    # Outermost: a trusted proxy's X-Forwarded-Proto and -For become the request's scheme and client for
    # everything inside (the console's cookie, gh_server/console_sessions.py; the access log; rate limits).
    # The one decision: gh-server's uvicorn runs without its own (gh_server/cli.py).
    app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=settings.trusted_proxies)
    return app


def _wire(app: FastAPI, st: ServerState) -> None:
    """The one place that puts the layers together (tests/test_layers.py): the routers, the
    webhook worker, replays, start-state housekeeping, and the runner gateway with what it is given
    (the start-state service's job results, the agents, the result intake; at start the scheduler and
    the relay) and the agents' machine API on top of it."""
    api.install(app, st)
    webhooks.install(app, st)
    replays.install(app, st)
    start_state_jobs.install(app, st)
    console_page.install(app, st.settings.novnc_dir)
    if st.settings.gateway:
        _serve_runners(app, st)


def _serve_runners(app: FastAPI, st: ServerState) -> None:
    """The runner websocket with the agents and the result intake, and in the app's lifespan the
    scheduler and (PostgreSQL) the relay of this process, handed to the gateway that runs them."""
    gw = Gateway(st, agents=AgentSupervisor, intake=ResultIntake, apply_job_result=apply_job_result)
    st.metrics.runners_connected.set_function(lambda: float(len(gw.local_runner_ids_all())))
    st.gateway = gw
    app.add_api_websocket_route(GATEWAY_PATH, gw.endpoint)
    app.include_router(machine_router(gw.agents))
    # Live views ride beside the runners' sockets (gh_server/live/screen_relay.py), and the takeovers with them.
    live = LiveRelay(st, takeovers=gw.takeovers)
    gw.on_view_refused = live.refused
    st.on_key_revoked.append(live.end_views_of)
    st.extras["live_relay"] = live  # how views ended (`ended`), for whoever watches this process
    live_api.install(app, st, live)
    takeover_routes.install(app, st, live, gw.takeovers)

    async def run(state: ServerState) -> None:
        s = state.settings
        if state.wakeup is None:
            state.wakeup = asyncio.Event()
        scheduler = Scheduler(
            gw.dbq,
            gw,
            state.wakeup,
            grace_s=s.runner_grace_seconds,
            dead_after_s=s.dead_after,
            judge_configured=s.judge is not None,
            retry_backoff_s=tuple(s.retry_backoff_seconds),
            save_points=SavePointPolicy(s.save_point_minutes, s.save_points_kept),
        )
        scheduler.on_leased = state.metrics.leased
        window = s.online_window_seconds
        scheduler.periodic += [
            (queue_wait.LOG_EVERY_S, lambda db: queue_wait.log_waiting(db, window_s=window)),
            (queue_wait.QUEUE_TIMEOUT_CHECK_S, lambda db: queue_wait.expire_queued(db, window)),
        ]
        relay = None
        if state.engine.dialect.name == "postgresql":  # machine requests for runners held by other processes
            conninfo = state.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
            relay = PgRelay(conninfo, gw.dbq, gw.local_runner_ids_all, gw.answer_relayed, state.metrics)
        await gw.run(scheduler, relay)

    st.background.append(run)
