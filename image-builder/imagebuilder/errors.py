"""The one error type a build raises: a plain message an operator can act on."""

from __future__ import annotations


class BuildError(Exception):
    """A build step failed; the message says which and what to do about it."""
