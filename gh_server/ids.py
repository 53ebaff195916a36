"""User-chosen ids that the API takes as one segment of a URL path (test case keys, agent ids)."""

from __future__ import annotations


def unaddressable(value: str) -> str | None:
    """Why `value` cannot be one path segment of a URL, or None when it can.

    "." and ".." are dot segments: HTTP clients (httpx, curl, browsers) remove them before sending
    (RFC 3986 section 5.2.4), so the SDK's `DELETE /v1/test_sets/ts_1/cases/..` goes out as
    `DELETE /v1/test_sets` and hits the set itself. Any run of dots only is refused, as is a slash
    (the router never matches an escaped one as part of a segment)."""
    if value and set(value) == {"."}:
        return "must not be only dots: HTTP clients drop '.' and '..' from URLs, so it could never be addressed"
    if "/" in value:
        return "must not contain '/': it would not be one segment of a URL"
    return None
