"""The console in a real browser: Debian's Chromium (/usr/bin/chromium, headless) driven by Playwright's
Python package, against a real gh-server (uvicorn on SQLite, as tests/server runs it). One browser per
module; a fresh context (no cookies) per test. GH_CONSOLE_SCREENSHOTS=1 writes each tab's picture into
docs/ (1280x800)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.browser import chromium, sign_in
from playwright.sync_api import Browser, Page, expect
from server.conftest import RunningServer, Server, make_settings
from starlette.websockets import WebSocket

from gh_server.auth import create_key
from gh_server.state import ServerState

from .rfb_peer import RfbPeer

__all__ = ["sign_in"]  # the tests sign in through the kit's one way

VIEWPORT = {"width": 1280, "height": 800}
DOCS = Path(__file__).resolve().parents[2] / "docs"
# Every wait in these tests is Playwright's auto-wait with this deadline (a loaded 2-core host).
expect.set_options(timeout=20_000)


# Stand-ins for the live channel, by ticket, at LIVE_TEST_PATH/{ticket} of the test's server (rfb_peer.py).
LIVE_TEST_PATH = "/v1/live-test"
LIVE_PEERS: dict[str, RfbPeer] = {}


async def _live_peer(ws: WebSocket, ticket: str) -> None:
    peer = LIVE_PEERS.get(ticket)
    if peer is None:
        await ws.close(code=4404)
        return
    await peer.serve(ws)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    settings, data_dir = make_settings(None)
    running = RunningServer(settings)
    running.app.add_api_websocket_route(LIVE_TEST_PATH + "/{ticket}", _live_peer)
    running.start()
    try:
        st: ServerState = running.app.state.gh
        with st.db.begin() as s:
            _row, member_key = create_key(s, "member for console tests", "member")
        yield Server(base_url=f"http://127.0.0.1:{settings.port}",
                     admin_key=(data_dir / "admin-api-key").read_text().strip(), member_key=member_key,
                     state=st, data_dir=data_dir)
    finally:
        running.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Browser, server: Server) -> Iterator[Page]:
    context = browser.new_context(viewport=VIEWPORT, base_url=server.base_url)  # type: ignore[arg-type]
    p = context.new_page()
    errors: list[str] = []
    p.on("pageerror", lambda e: errors.append(str(e)))  # an uncaught exception in the console's code
    try:
        yield p
    finally:
        context.close()
    assert errors == [], f"the console's code threw: {errors}"


def screenshot(page: Page, name: str) -> None:
    """docs/console-NAME.png when GH_CONSOLE_SCREENSHOTS=1 (the pictures in docs/console.md)."""
    if os.environ.get("GH_CONSOLE_SCREENSHOTS") == "1":
        page.screenshot(path=str(DOCS / f"console-{name}.png"))
