"""The result outbox: every finished attempt's result, journaled, sent, re-sent until acknowledged.

Delivery is at least once (docs/protocol.md, "Results"): a result is written to the journal (fsync)
before it is first sent; it is sent again after every reconnect (`send_all`) and every
`resend_after` seconds while the link is up (`resend_due`), until the server's `result_ack`
(`ack`) drops it from the journal. The server applies a result once per attempt id, so a resend
is harmless.

The outbox does no I/O of its own: the journal (`ResultStore`), the thread that writes it
(`run_io`), the link (`send`) and the clock are given to it, so it is tested with plain objects.
Its imports are kept to pure modules (tests/test_layers.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from gh_wire.protocol import AttemptFinished, AttemptResult

T = TypeVar("T")


class ResultStore(Protocol):
    """What the outbox needs of the journal (`gh_runner.journal.Journal`)."""

    def finish(self, result: AttemptResult) -> None: ...
    def ack(self, attempt_id: str) -> bool: ...
    def has_result(self, attempt_id: str) -> bool: ...
    def pending_results(self) -> list[AttemptResult]: ...


class RunIO(Protocol):
    """Runs a blocking journal call off the event loop and returns its value."""

    def __call__(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]: ...


class ResultOutbox:
    def __init__(self, store: ResultStore, run_io: RunIO, send: Callable[[Any], Awaitable[bool]],
                 clock: Callable[[], float], resend_after: float) -> None:
        self._store = store
        self._run_io = run_io
        self._send = send
        self._clock = clock
        self.resend_after = resend_after
        self._unacked: dict[str, AttemptResult] = {}
        self._last_sent: dict[str, float] = {}

    @property
    def pending(self) -> int:
        """Results journaled (or meant to be) and not yet acknowledged."""
        return len(self._unacked)

    def __contains__(self, attempt_id: object) -> bool:
        return attempt_id in self._unacked

    async def load(self) -> None:
        """At start: the results a previous run journaled and the server never acknowledged."""
        for r in await self._run_io(self._store.pending_results):
            self._unacked[r.attempt_id] = r

    async def put(self, result: AttemptResult) -> OSError | None:
        """Journal `result` (fsync) and keep it until acknowledged. Returns the error when it could
        not be journaled: it is kept and sent all the same (the server may well acknowledge it before
        anything else goes wrong), but it is lost if the runner stops first."""
        error: OSError | None = None
        try:
            await self._run_io(self._store.finish, result)
        except OSError as e:
            error = e
        self._unacked[result.attempt_id] = result
        return error

    def interrupted(self, attempt_id: str) -> bool:
        """Whether the result kept for `attempt_id` is the report of an attempt a previous process left."""
        result = self._unacked.get(attempt_id)
        return result is not None and result.interrupted

    async def send(self, attempt_id: str) -> None:
        """Send (again) the result of `attempt_id`, if it is still unacknowledged."""
        result = self._unacked.get(attempt_id)
        if result is None:
            return
        self._last_sent[attempt_id] = self._clock()
        await self._send(AttemptFinished(result=result))

    async def send_all(self) -> None:
        """Everything unacknowledged, now (after a welcome: the link is new)."""
        for aid in list(self._unacked):
            await self.send(aid)

    async def resend_due(self) -> None:
        """Everything unacknowledged that was last sent `resend_after` seconds ago or more."""
        now = self._clock()
        for aid in list(self._unacked):
            if now - self._last_sent.get(aid, float("-inf")) >= self.resend_after:
                await self.send(aid)

    async def ack(self, attempt_id: str) -> bool:
        """The server has the result: drop it from the journal. False for an ack of nothing (acks
        are idempotent and may be repeated). Raises OSError when the journal could not drop it
        (the result is no longer re-sent; a restart would send it once more, harmlessly)."""
        if self._unacked.pop(attempt_id, None) is None and not await self._run_io(self._store.has_result, attempt_id):
            return False
        self._last_sent.pop(attempt_id, None)
        await self._run_io(self._store.ack, attempt_id)
        return True
