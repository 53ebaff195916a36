"""Logging: structlog to stderr as JSON lines (journald, log shippers) or console text (a terminal).

Every line about an attempt carries `attempt_id`: the daemon binds it as a context variable in the
attempt's task, so anything logged from that task (the daemon, the attempt module, the provider)
gets it without passing a logger around.

The redaction processor runs last before rendering: it drops values of keys that name secrets
(token, authorization, password, ...), and replaces any occurrence of a registered secret value
(the runner token, values a machine request marks `redact`) or anything shaped like a runner token
or bearer credential, wherever it appears in a line.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import Iterable, MutableMapping
from typing import Any, TextIO

import structlog

REDACTED = "[redacted]"
_SECRET_KEYS = re.compile(r"(token|authorization|password|passwd|secret|api_?key|credential|cookie)", re.I)
_SECRET_SHAPES = re.compile(r"(gh_rn_[A-Za-z0-9_\-]+|gh_sk_[A-Za-z0-9_\-]+|(?i:bearer)\s+[A-Za-z0-9._~+/=\-]+)")
_MIN_SECRET_LEN = 4  # shorter values would redact ordinary words


class Redactor:
    """Holds the secret values to scrub; thread-safe because log lines may come from executor threads."""

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._lock = threading.Lock()
        self._pattern: re.Pattern[str] | None = None

    def add(self, *values: str | None) -> None:
        with self._lock:
            changed = False
            for v in values:
                if v and len(v) >= _MIN_SECRET_LEN and v not in self._values:
                    self._values.add(v)
                    changed = True
            if changed:
                # Longest first so a secret that contains another is replaced whole.
                ordered = sorted(self._values, key=len, reverse=True)
                self._pattern = re.compile("|".join(re.escape(v) for v in ordered))

    def discard(self, values: Iterable[str]) -> None:
        with self._lock:
            self._values.difference_update(values)
            ordered = sorted(self._values, key=len, reverse=True)
            self._pattern = re.compile("|".join(re.escape(v) for v in ordered)) if ordered else None

    def scrub(self, text: str) -> str:
        pattern = self._pattern
        if pattern is not None:
            text = pattern.sub(REDACTED, text)
        return _SECRET_SHAPES.sub(REDACTED, text)

    def _clean(self, value: Any, depth: int = 0) -> Any:
        if isinstance(value, str):
            return self.scrub(value)
        if depth > 6:
            return value
        if isinstance(value, dict):
            return {k: (REDACTED if isinstance(k, str) and _SECRET_KEYS.search(k) else self._clean(v, depth + 1))
                    for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._clean(v, depth + 1) for v in value]
        if isinstance(value, BaseException):
            return self.scrub(f"{type(value).__name__}: {value}")
        return value

    def __call__(self, _logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        for key in list(event_dict):
            if key != "event" and _SECRET_KEYS.search(key):
                event_dict[key] = REDACTED
            else:
                event_dict[key] = self._clean(event_dict[key])
        return event_dict


redactor = Redactor()


def _exc_to_text(_logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    # Rendered before redaction, so a token in a traceback is scrubbed like any other text.
    return structlog.processors.format_exc_info(_logger, _name, event_dict)


def configure_logging(fmt: str = "console", level: str = "info", stream: TextIO | None = None) -> None:
    """Set up structlog for the process. Call once, early (the CLI does)."""
    out = stream or sys.stderr
    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _exc_to_text,
        redactor,
        renderer,
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper(), logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    # Libraries log through the standard library: keep their warnings, in the same stream.
    # force: a later call (gh-runner local moves the logs above its progress bar) replaces the stream.
    logging.basicConfig(stream=out, level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", force=True)
    logging.getLogger("websockets").setLevel(logging.ERROR)


def get_logger(name: str = "gh_runner", **bound: Any) -> Any:
    return structlog.get_logger(name).bind(**bound)


def bind_attempt(attempt_id: str) -> None:
    """Bind the attempt id for everything logged from the current task (and tasks it starts)."""
    structlog.contextvars.bind_contextvars(attempt_id=attempt_id)
