"""Whose fault: `Fail` is the agent's (what it left is missing, unreadable or wrong); any other exception
is ours or the case's, and ends the check with no verdict (exit 1)."""

from __future__ import annotations


class Fail(Exception):
    """The result fails the metric; the message says why (printed to the check's stderr, never a crash)."""


def full(score: float | bool | None) -> bool:
    """A metric passes on a full score, as OSWorld's 1.0; None (OSWorld's "could not get it") is a failure."""
    if score is None:
        return False
    return float(score) >= 1.0 - 1e-9
