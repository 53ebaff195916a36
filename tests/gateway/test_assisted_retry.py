"""An assisted attempt is never retried for being assisted (docs/server-api.md, "Assisted attempts"): its
check's verdict stands; one that ended `error` is ours and retried as every error is, the retry a fresh
try nobody has touched. Through the intake's own write path on a real SQLite schema."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gh_server.attempts import completion, intake
from gh_server.models import Attempt
from gh_wire import protocol

from .test_scheduler_unit import dbs, seed

__all__ = ["dbs"]  # the fixture, used by name


def _held(s: Session, aid: str) -> None:
    """What a takeover writes: the attempt is running on its runner, and a person held it."""
    s.query(Attempt).filter_by(id=aid).update({"status": "checking", "runner_id": "rn_a", "assisted": True,
                                               "takeovers": [{"by": "alice", "started_at": "2026-12-03T10:00:00Z"}]})
    s.commit()


@pytest.mark.parametrize("outcome", ["passed", "failed"])
def test_an_assisted_verdict_is_final(dbs: sessionmaker[Session], outcome: str) -> None:
    with dbs() as s:
        (aid,) = seed(s)
        _held(s, aid)
        applied = intake.apply_result(s, "rn_a", protocol.AttemptResult(attempt_id=aid, outcome=outcome))
        s.commit()
        assert applied.applied and applied.outcome == outcome and applied.retry_id is None
        assert s.query(Attempt).count() == 1  # nothing re-queued
        a = s.get(Attempt, aid)
        assert a is not None and a.assisted is True and a.is_last is True and a.outcome == outcome
        assert completion.complete_runs(s, ["tr_1"]) == ["tr_1"]
        progress, rate = completion.run_summary(s, "tr_1")
        assert progress["assisted"] == 1 and progress[outcome] == 0 and rate == {"noop": None}


def test_an_assisted_error_is_retried_as_ours(dbs: sessionmaker[Session]) -> None:
    with dbs() as s:
        (aid,) = seed(s)
        _held(s, aid)
        applied = intake.apply_result(s, "rn_a", protocol.AttemptResult(attempt_id=aid, outcome="error",
                                                                        error="the runner lost the machine"))
        s.commit()
        assert applied.retry_id is not None
        retry = s.get(Attempt, applied.retry_id)
        assert retry is not None and retry.assisted is False and retry.is_last is True and retry.takeovers is None
        first = s.get(Attempt, aid)
        assert first is not None and first.assisted is True and first.is_last is False  # stays marked
