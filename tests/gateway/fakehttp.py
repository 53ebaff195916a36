"""Tiny HTTP servers in a thread for the boundaries the server calls out to: an OpenAI-compatible chat
endpoint (judge, customer) and an HTTP agent. They record what they were sent."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]]


@contextmanager
def serve(reply: Reply, raw: list[tuple[bytes, dict[str, str]]] | None = None,
          ) -> Iterator[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    """`raw`, when given, gets the exact bodies and headers (for signature checks)."""
    seen: list[tuple[str, dict[str, Any]]] = []
    bodies: list[tuple[bytes, dict[str, str]]] = raw if raw is not None else []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            data = self.rfile.read(int(self.headers.get("content-length", "0")))
            bodies.append((data, dict(self.headers.items())))
            body = json.loads(data or b"{}")
            seen.append((self.path, body))
            status, out = reply(self.path, body)
            data = json.dumps(out).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()
        t.join(timeout=10)


def chat_reply(content: str) -> Reply:
    def reply(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if not path.endswith("/chat/completions"):
            return 404, {"error": "no such route"}
        return 200, {"choices": [{"message": {"role": "assistant", "content": content}}]}
    return reply
