"""The API's one timestamp format, below every layer that writes one (serialize re-exports it), so that
a service such as validation stamps its verdicts without importing serialize (which reaches results)."""

from __future__ import annotations

from datetime import UTC, datetime


def ts(value: datetime | None) -> str | None:
    """ISO 8601 in UTC with milliseconds and a Z (2026-01-31T12:00:00.000Z), as the Evals API writes them."""
    if value is None:
        return None
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
