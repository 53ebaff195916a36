"""Access log lines without query strings: a replay URL's `?token=` opens that replay to whoever reads
the log (journald, a log shipper). uvicorn logs `get_path_with_query_string(scope)` as one of the
record's arguments ("%s - \\"%s %s HTTP/%s\\" %d" for HTTP, "%s - \\"WebSocket %s\\" ..." for websockets);
the filter cuts every such argument at its "?"."""

from __future__ import annotations

import logging

ACCESS_LOGGERS = ("uvicorn.access", "uvicorn.error")  # uvicorn logs websocket handshakes on uvicorn.error


class DropQueryStrings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and record.args:
            record.args = tuple(_path_only(a) for a in record.args)
        return True


def _path_only(arg: object) -> object:
    if isinstance(arg, str) and arg.startswith("/") and "?" in arg:
        return arg.split("?", 1)[0] + "?…"
    return arg


def install() -> None:
    """Idempotent: create_app may run more than once in a process (tests, `gh-runner local`)."""
    for name in ACCESS_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropQueryStrings) for f in logger.filters):
            logger.addFilter(DropQueryStrings())
