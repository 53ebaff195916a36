"""The console: a page of plain ES modules (gh_server/static/console/) that is a client of the /v1 API,
signed in with a session cookie (gh_server/console_sessions.py). See docs/console.md.

Every page of the console has its own URL, and a reload or a pasted link serves the same HTML, whose
script reads the path: `/`, `/test_cases...`, `/test_sets...`, `/test_runs...`, `/attempts/...`,
`/runners...`, `/start_states...`. None of these shadows /v1, /healthz, /metrics or the report and
replay pages, which all live under /v1. The page's code is public (it holds no data). Of Debian's noVNC
only the core is served, at /console/novnc/core/ (and the pako modules it imports, at
/console/novnc/vendor/pako/): the ES modules the live screen imports (static/console/live_screen.js).
noVNC's own client (vnc.html, which connects wherever its query string says) and the rest are a 404.
Every response here carries the console's Content-Security-Policy.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.types import Scope

CONSOLE_DIR = Path(__file__).parent / "static" / "console"
PAGE_PREFIXES = ("test_cases", "test_sets", "test_runs", "attempts", "runners", "start_states")
# The page loads only its own files; it may frame the results and replay pages (same origin); no other
# site may frame it (clickjacking of Save or Revoke).
CSP = ("default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; "
       "connect-src 'self'; frame-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
HEADERS = {"Content-Security-Policy": CSP, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "same-origin"}


# noVNC's parts the live screen imports, below its directory: core/rfb.js and what it imports.
NOVNC_PARTS = ("core", "vendor/pako")


class _ConsoleFiles(StaticFiles):
    """Static files with the console's headers: its policy, no sniffing, no-cache."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(HEADERS)
        return response


def _page() -> HTMLResponse:
    return HTMLResponse((CONSOLE_DIR / "index.html").read_text(encoding="utf-8"), headers=HEADERS)


def install(app: FastAPI, novnc_dir: Path) -> None:
    """Routes for the console's pages and files, and noVNC's core (a missing noVNC answers 404, never fails
    the server's start: the console works without the live screen)."""

    async def page() -> HTMLResponse:
        return _page()

    async def page_below(rest: str) -> HTMLResponse:  # the script reads the path itself
        return _page()

    app.add_api_route("/", page, methods=["GET"], include_in_schema=False)
    for prefix in PAGE_PREFIXES:
        app.add_api_route(f"/{prefix}", page, methods=["GET"], include_in_schema=False)
        app.add_api_route(f"/{prefix}/{{rest:path}}", page_below, methods=["GET"], include_in_schema=False)
    app.mount("/console/assets", _ConsoleFiles(directory=CONSOLE_DIR), name="console-assets")
    for part in NOVNC_PARTS:
        app.mount(f"/console/novnc/{part}", _ConsoleFiles(directory=novnc_dir / part, check_dir=False),
                  name=f"novnc-{part}")
