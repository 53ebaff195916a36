"""The result outbox (gh_runner/outbox.py) with a plain store, link and clock: journal, resend, ack."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from gh_runner.outbox import ResultOutbox
from gh_wire.protocol import AttemptFinished, AttemptResult

T = TypeVar("T")
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def result(aid: str) -> AttemptResult:
    return AttemptResult(attempt_id=aid, outcome="passed", started_at=NOW, finished_at=NOW)


class Store:
    def __init__(self, pending: list[AttemptResult] = (), full: bool = False) -> None:  # type: ignore[assignment]
        self.results = {r.attempt_id: r for r in pending}
        self.full = full

    def finish(self, r: AttemptResult) -> None:
        if self.full:
            raise OSError(28, "No space left on device")
        self.results[r.attempt_id] = r

    def ack(self, aid: str) -> bool:
        return self.results.pop(aid, None) is not None

    def has_result(self, aid: str) -> bool:
        return aid in self.results

    def pending_results(self) -> list[AttemptResult]:
        return list(self.results.values())


class Harness:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.sent: list[str] = []
        self.now = 100.0
        self.outbox = ResultOutbox(store, self.run_io, self.send, lambda: self.now, resend_after=30.0)

    async def run_io(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    async def send(self, msg: Any) -> bool:
        assert isinstance(msg, AttemptFinished)
        self.sent.append(msg.result.attempt_id)
        return True


async def test_a_result_is_journaled_before_it_is_sent_and_resent_until_acked() -> None:
    h = Harness(Store())
    assert await h.outbox.put(result("at_1")) is None
    assert h.store.has_result("at_1") and h.sent == []  # journaled, not yet sent
    await h.outbox.send("at_1")
    await h.outbox.resend_due()
    assert h.sent == ["at_1"]  # not due yet
    h.now += 30
    await h.outbox.resend_due()
    assert h.sent == ["at_1", "at_1"]
    assert await h.outbox.ack("at_1") and h.outbox.pending == 0 and not h.store.has_result("at_1")
    assert not await h.outbox.ack("at_1")  # a repeated ack: nothing
    h.now += 60
    await h.outbox.resend_due()
    assert h.sent == ["at_1", "at_1"]


async def test_results_journaled_by_an_earlier_run_are_sent_at_once_on_a_new_link() -> None:
    h = Harness(Store([result("at_old")]))
    await h.outbox.load()
    assert "at_old" in h.outbox and h.outbox.pending == 1
    await h.outbox.send_all()
    assert h.sent == ["at_old"]


async def test_a_result_the_disk_cannot_hold_is_still_kept_and_sent() -> None:
    h = Harness(Store(full=True))
    error = await h.outbox.put(result("at_full"))
    assert isinstance(error, OSError) and error.errno == 28
    await h.outbox.send("at_full")
    assert h.sent == ["at_full"] and h.outbox.pending == 1


async def test_an_ack_for_a_result_only_the_journal_still_has_drops_it() -> None:
    h = Harness(Store([result("at_j")]))  # journaled, the outbox never loaded it (acked during start-up)
    assert await h.outbox.ack("at_j") and not h.store.has_result("at_j")
