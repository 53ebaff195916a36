"""Waiting for a condition another process or task makes true: a poll with a deadline, never a bare sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(cond: Callable[[], bool], timeout: float, what: str, every: float = 0.1) -> None:
    """Return once `cond()` holds, checking every `every` seconds.

    Raises:
        AssertionError: it did not hold within `timeout` seconds (naming `what`).
    """
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(every)
