"""Whose fault: `Fail` is the agent's (what it left is missing, unreadable or wrong); any other exception
is ours or the case's, and ends the check with no verdict (exit 1)."""

from __future__ import annotations


class Fail(Exception):
    """The result fails the metric; the message says why (printed to the check's stderr, never a crash)."""

