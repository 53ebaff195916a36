"""Test cases may be sent as YAML (`Content-Type: application/yaml`): the console's editor posts what a
person wrote, and the server parses it, so there is one YAML parser (PyYAML's safe loader, as config
files use, gh_common/configfile.py) and no JavaScript YAML library in the page.

An ASGI middleware inside gh_server.bodylimit (so the body is already bounded) turns the YAML body of
POST /v1/test_cases, POST /v1/test_cases/batch and PATCH /v1/test_cases/{id} into the same JSON the
routes take, so validation, its errors (`param` names the field) and the OpenAPI document stay one.
YAML that does not parse is a 400 naming the line. Aliases are refused: `&a` / `*a` could expand a
small body into a huge JSON one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import yaml

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

YAML_TYPES = frozenset({"application/yaml", "application/x-yaml", "text/yaml"})
_PATHS = re.compile(r"^/v1/test_cases(/batch|/[^/]+)?$")


class YamlError(ValueError):
    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


class _NoAliases(yaml.SafeLoader):
    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise YamlError("YAML aliases (*name) are not accepted: write the value out",
                            event.start_mark.line + 1)
        return super().compose_node(parent, index)


def parse(text: bytes) -> Any:
    """The document's value. Raises YamlError (with the 1-based line when known)."""
    try:
        return yaml.load(text, Loader=_NoAliases)  # a SafeLoader: no Python objects
    except YamlError:
        raise
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        where = f"line {line}: " if line is not None else ""
        raise YamlError(f"not valid YAML: {where}{e.problem or e.context or 'cannot be parsed'}", line) from None
    except yaml.YAMLError as e:
        raise YamlError(f"not valid YAML: {e}") from None


def _content_type(scope: Scope) -> str:
    for name, value in scope.get("headers") or ():
        if name == b"content-type":
            return value.decode("latin-1").split(";", 1)[0].strip().lower()
    return ""


class YamlBody:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope.get("method") not in ("POST", "PATCH")
                or not _PATHS.match(str(scope.get("path", ""))) or _content_type(scope) not in YAML_TYPES):
            await self.app(scope, receive, send)
            return
        raw = b""
        while True:  # already bounded by gh_server.bodylimit, which runs outside this
            msg = await receive()
            if msg.get("type") != "http.request":
                break
            raw += msg.get("body", b"")
            if not msg.get("more_body", False):
                break
        try:
            value = parse(raw)
        except YamlError as e:
            await _respond(send, 400, {"error": {"type": "invalid_request", "message": f"body: {e}",
                                                 "param": "body", "line": e.line}})
            return
        body = json.dumps(value, default=str).encode()
        headers = [(n, v) for n, v in scope.get("headers") or () if n not in (b"content-type", b"content-length")]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        sent = False

        async def as_json() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app({**scope, "headers": headers}, as_json, send)


async def _respond(send: Send, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
