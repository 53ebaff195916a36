"""The API's error envelope: {"error": {"type", "message", ...extra}} with the SDK's types and statuses.

FastAPI's own errors (validation, 404 for unknown routes, 405) are mapped into the same envelope, so a
client never sees `{"detail": ...}`.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException

from gh_server.bodylimit import Send
from gh_server.db import is_locked

log = logging.getLogger("gh_server.api")
DB_RETRY_AFTER_S = 5

TYPE_BY_STATUS = {
    400: "invalid_request",
    401: "authentication",
    402: "payment_required",
    403: "permission",
    404: "not_found",
    405: "invalid_request",
    409: "conflict",
    413: "invalid_request",
    415: "invalid_request",
    422: "invalid_request",
    429: "rate_limit",
}


class ApiError(Exception):
    def __init__(self, http_status: int, message: str, /, *, type: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        status = http_status
        self.status = status
        self.message = message
        self.type = type or TYPE_BY_STATUS.get(status, "server_error" if status >= 500 else "invalid_request")
        self.extra = extra
        self.headers: dict[str, str] = {}

    def body(self) -> dict[str, Any]:
        return {"error": {"type": self.type, "message": self.message, **self.extra}}


def invalid(param: str, message: str, **extra: Any) -> ApiError:
    """A 400 that names the field (`param`), also in the message so it reads on its own."""
    text = message if message.startswith(param) else f"{param}: {message}"
    return ApiError(400, text, param=param, **extra)


def not_found(what: str, ident: str) -> ApiError:
    return ApiError(404, f"No {what} {ident!r}.")


def conflict(message: str, **extra: Any) -> ApiError:
    return ApiError(409, message, **extra)


async def send_too_many(send: Send, limit: int, message: str) -> None:
    """A 429 `rate_limit` with `limit` and Retry-After, sent by an ASGI middleware before the app runs."""
    raw = json.dumps({"error": {"type": "rate_limit", "limit": limit, "message": message}}).encode()
    await send({"type": "http.response.start", "status": 429, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
        (b"retry-after", b"1")]})
    await send({"type": "http.response.body", "body": raw})


def _loc_to_param(loc: tuple[Any, ...] | list[Any]) -> str:
    parts: list[str] = []
    items = list(loc)
    if items and items[0] in ("body", "query", "path", "header"):
        items = items[1:]
    for p in items:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif isinstance(p, str) and (p.isidentifier() or p.replace("-", "_").isidentifier()):
            # Pydantic adds union-member tags (e.g. "function-after[...]") to locs: drop those.
            if "[" in p or p in ("str", "int", "dict", "list", "float", "bool", "none"):
                continue
            parts.append(("." if parts else "") + p)
    return "".join(parts) or "body"


def _validation_error(exc: RequestValidationError) -> ApiError:
    errors = exc.errors()
    if not errors:
        return ApiError(400, "The request is invalid.")
    first = errors[0]
    param = _loc_to_param(first.get("loc", ()))
    msg = str(first.get("msg", "invalid"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if first.get("type") == "missing":
        msg = "is required"
    elif first.get("type") == "extra_forbidden":
        msg = "is not a known field"
    elif first.get("type") == "json_invalid":
        return ApiError(400, "The request body is not valid JSON.", param="body")
    more = len(errors) - 1
    text = f"{param}: {msg}" + (f" (and {more} more problem{'s' if more > 1 else ''})" if more else "")
    return ApiError(400, text, param=param)


ERROR_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["type", "message"], "additionalProperties": True,
        "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}}}
ERROR_RESPONSES = {
    400: "The request is invalid (the message and `param` name the field).",
    401: "No API key, or an invalid or revoked one.",
    403: "The key's role may not do this.",
    404: "No such object.",
    409: "The object's state does not allow this.",
    413: "The request body is larger than this endpoint's limit (`limit_bytes`).",
    429: "Too many requests (`Retry-After` says when to retry).",
    503: "The database is busy or unreachable, or a service it needs is missing (`Retry-After`).",
}


def document(app: FastAPI) -> None:
    """Every operation in /openapi.json lists the error envelope for the statuses any request may get, so
    a client (and the schemathesis suite) finds every answer the server gives in its own schema. Done on
    the generated document: FastAPI's route objects differ between versions, the document does not."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = generate()
        for operations in spec.get("paths", {}).values():
            for op in operations.values():
                if not isinstance(op, dict):
                    continue
                responses = op.setdefault("responses", {})
                for status, description in ERROR_RESPONSES.items():
                    responses.setdefault(str(status), {
                        "description": description, "content": {"application/json": {"schema": ERROR_SCHEMA}}})
        app.openapi_schema = spec
        return spec

    app.openapi = openapi  # type: ignore[method-assign]


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_req: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers or None)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        err = _validation_error(exc)
        return JSONResponse(err.body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = exc.status_code
        message = str(exc.detail) if exc.detail else "error"
        if status == 404 and message == "Not Found":
            message = "No such endpoint."
        err = ApiError(status, message)
        return JSONResponse(err.body(), status_code=status, headers=getattr(exc, "headers", None))

    @app.exception_handler(sa_exc.OperationalError)
    @app.exception_handler(sa_exc.TimeoutError)
    async def _database(_req: Request, exc: Exception) -> JSONResponse:
        # A locked SQLite (past its busy timeout), a PostgreSQL that is down, a full pool: the request may
        # work in a moment, so 503 with Retry-After rather than a 500. The text never carries the SQL.
        busy = is_locked(exc) or isinstance(exc, sa_exc.TimeoutError)
        log.warning("database %s during an API request", "busy" if busy else "unreachable")
        message = ("The database is busy; retry in a few seconds." if busy
                   else "The database is unreachable; retry in a few seconds.")
        err = ApiError(503, message, type="server_error")
        return JSONResponse(err.body(), status_code=503, headers={"Retry-After": str(DB_RETRY_AFTER_S)})

    @app.exception_handler(Exception)
    async def _unexpected(_req: Request, exc: Exception) -> JSONResponse:
        # The message is generic on purpose: an exception's text may carry a secret from the request.
        log.exception("unhandled error in API request")
        return JSONResponse(ApiError(500, "Internal server error.").body(), status_code=500)
