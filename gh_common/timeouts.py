"""The one way this code bounds a wait.

`asyncio.wait_for` is banned (ruff TID251): on Python 3.11 it can swallow a cancellation that lands
as its inner awaitable completes, so a caller that was cancelled (an attempt's `cancel`, a shutting
down loop) would carry on as if nothing happened. `asyncio.timeout` does not: at the deadline it
cancels the current task and turns that one cancellation, and only that one, into `TimeoutError`.

Use `timeout(seconds)` around a block, and `within(seconds, awaitable)` where a bounded await is an
expression. Cancelling the caller cancels what it awaits in both, and the `CancelledError` propagates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")

timeout = asyncio.timeout


async def within(seconds: float | None, aw: Awaitable[T]) -> T:
    """Await `aw` for at most `seconds` (None: no bound).

    Raises:
        TimeoutError: the deadline passed; `aw` was cancelled (a task or future is cancelled too).
        asyncio.CancelledError: the caller was cancelled; `aw` was cancelled with it.
    """
    async with asyncio.timeout(seconds):
        return await aw
