"""Case validation: is a case worth scoring agents on?

A validation run is an ordinary run of the cases against the built-ins `noop` and `reference`, N tries
each, every try on a fresh machine (`gh-runner validate CASES.yaml --repeat N`, or POST /v1/test_runs
with agents [noop, reference]). When such a run completes, each case's validation is recorded on it
(the results and the page mark it); GET /v1/test_runs/{id}/validation reads the same. A case is:

- `valid`: on every machine the check before printed False (the setup broke it, deterministically),
  `noop` failed every try and `reference` passed every try;
- `broken`: one of those went wrong on every machine that showed it (the check is True before the task
  on every machine, noop always passes, reference always fails, the setup or the check always crashes);
- `flaky`: one of them went wrong on some machines only (a setup that is not deterministic, a check
  that races, a fix that works sometimes);
- `unvalidated`: not enough of it ran to tell (errors of our side on every try, or no run yet).

Every attempt counts as a sample, retried ones too: each is a fresh machine that ran the setup and the
check before. A try a person took over (assisted, gh_server/counts.py) says nothing of noop or
reference: its setup and check before still count, its verdict does not.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gh_server import counts
from gh_server.models import Attempt, RunCase, TestCase, TestRun, utcnow
from gh_server.timestamps import ts  # not serialize: it reaches results, which reads validation

AGENTS = ("noop", "reference")


class Status(StrEnum):
    VALID = "valid"
    BROKEN = "broken"
    FLAKY = "flaky"
    UNVALIDATED = "unvalidated"


class Reason(StrEnum):
    CHECK_BEFORE_TRUE = "check_before_true"  # the setup did not break the machine
    CHECK_BEFORE_SCORED = "check_before_scored"  # the untouched machine already scores above 0 (partly done)
    CHECK_BEFORE_CRASHED = "check_before_crashed"  # the check before printed garbage, crashed or timed out
    SETUP_FAILED = "setup_failed"
    NOOP_PASSED = "noop_passed"
    REFERENCE_FAILED = "reference_failed"
    NOT_SCORED = "not_scored"  # no try of noop or reference reached a verdict


_SAY = {
    Reason.CHECK_BEFORE_TRUE: "the check printed True before the task (the setup did not break the machine)",
    Reason.CHECK_BEFORE_SCORED: "the check scored above 0 before the task (the setup left part of it done)",
    Reason.CHECK_BEFORE_CRASHED: "the check before did not print True, False or a score",
    Reason.SETUP_FAILED: "the setup script failed",
    Reason.NOOP_PASSED: "noop passed (the check passes a machine nobody fixed)",
    Reason.REFERENCE_FAILED: "reference failed (the known fix does not pass the check)",
    Reason.NOT_SCORED: "no try of {agent} reached a verdict",
}


@dataclass(frozen=True)
class Sample:
    """One attempt of a validation run, as validation reads it."""

    agent: str
    outcome: str | None  # passed | failed | error | None (not finished)
    is_last: bool
    error_phase: str | None
    before: str | None  # the check before's printed verdict line, if it ran
    assisted: bool = False  # a person took the machine over: its verdict is not the agent's
    before_score: float | None = None  # the check's score before the task (checkpoints: their mean)


def _last_line(text: str | None) -> str | None:
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    return lines[-1] if lines else None


def classify(samples: list[Sample]) -> dict[str, Any]:
    """{status, runs, reasons}: `runs` is the number of machines examined; each reason says how many of
    how many machines (or tries) showed it."""
    reasons: list[dict[str, Any]] = []
    broken = flaky = False

    def note(reason: Reason, count: int, of: int) -> None:
        nonlocal broken, flaky
        if count == 0 or of == 0:
            return
        broken = broken or count == of
        flaky = flaky or count < of
        reasons.append({"reason": str(reason), "count": count, "of": of, "message": f"{_SAY[reason]}: {count} of {of}"})

    done = [x for x in samples if x.outcome is not None]
    before = [x for x in done if x.before is not None or x.error_phase == "check_before"]
    done_before = [x for x in before if x.before == "True" or x.before_score == 1.0]
    note(Reason.CHECK_BEFORE_TRUE, len(done_before), len(before))
    note(Reason.CHECK_BEFORE_SCORED, sum(1 for x in before if 0.0 < (x.before_score or 0.0) < 1.0), len(before))
    note(Reason.CHECK_BEFORE_CRASHED,
         sum(1 for x in before if x.error_phase == "check_before" and x not in done_before), len(before))
    setups = [x for x in done if x.before is not None or x.error_phase in ("setup", "check_before")]
    note(Reason.SETUP_FAILED, sum(1 for x in setups if x.error_phase == "setup"), len(setups))
    scored: dict[str, list[str]] = defaultdict(list)
    for x in done:
        if x.is_last and counts.scored("done", x.outcome, x.assisted):
            scored[x.agent].append(str(x.outcome))
    noop, ref = scored.get("noop", []), scored.get("reference", [])
    note(Reason.NOOP_PASSED, noop.count("passed"), len(noop))
    note(Reason.REFERENCE_FAILED, ref.count("failed"), len(ref))
    status = Status.BROKEN if broken else Status.FLAKY if flaky else Status.VALID
    if status == Status.VALID:
        missing = [a for a in AGENTS if not scored.get(a)]
        if missing:
            for a in missing:
                reasons.append({"reason": str(Reason.NOT_SCORED), "count": 0, "of": 0,
                                "message": _SAY[Reason.NOT_SCORED].format(agent=a)})
            status = Status.UNVALIDATED
    return {"status": str(status), "runs": len(done), "reasons": reasons}


def _samples(session: Session, run_id: str) -> dict[str, list[Sample]]:
    t = Attempt.__table__
    stmt = select(t.c.test_case_id, t.c.agent_id, t.c.status, t.c.outcome, t.c.is_last,
                  t.c.metrics["error_phase"].as_string(), t.c.check, t.c.assisted).where(t.c.test_run_id == run_id)
    out: dict[str, list[Sample]] = defaultdict(list)
    for case_id, agent, status, outcome, is_last, phase, check, assisted in session.connection().execute(stmt):
        if agent not in AGENTS:
            continue
        before = _last_line((check or {}).get("before")) if isinstance(check, dict) else None
        before_score = (check or {}).get("before_score") if isinstance(check, dict) else None
        out[case_id].append(Sample(agent, outcome if status == "done" else None, bool(is_last), phase, before,
                                   bool(assisted), before_score))
    return out


def can_validate(run: TestRun) -> bool:
    """A run that tried both noop and reference: its completion records its cases' validation."""
    return all(a in (run.agents or []) for a in AGENTS)


def run_validation(session: Session, run: TestRun, *, record: bool) -> dict[str, Any]:
    """Each case of a run with noop and reference, classified; with `record` (the run is finished), the
    verdict is stored on each case that still exists, unless a later validation run is already there."""
    rcs = session.execute(select(RunCase.test_case_id, RunCase.case).where(RunCase.test_run_id == run.id)
                          .order_by(RunCase.position)).all()
    samples = _samples(session, run.id)
    at = run.finished_at or utcnow()
    data = []
    for case_id, frozen in rcs:
        v = {**classify(samples.get(case_id, [])), "at": ts(at), "test_run_id": run.id}
        data.append({"test_case_id": case_id, "key": (frozen or {}).get("key"), "validation": v})
        if record:
            row = session.get(TestCase, case_id)
            if row is not None and _newer(at, row.validation):
                row.validation = v
    counts = {s.value: sum(1 for d in data if d["validation"]["status"] == s.value) for s in Status}
    return {"object": "test_run_validation", "test_run_id": run.id, "finished": run.finished_at is not None,
            "data": data, "counts": counts}


def _newer(at: datetime, current: dict[str, Any] | None) -> bool:
    return not current or not current.get("at") or str(current["at"]) <= (ts(at) or "")  # ISO-8601 UTC sorts as text


def case_statuses(session: Session, case_ids: list[str]) -> dict[str, str]:
    """The recorded validation status of each case ("unvalidated" when none)."""
    rows = session.execute(select(TestCase.id, TestCase.validation).where(TestCase.id.in_(case_ids))).all()
    got = {cid: str((v or {}).get("status") or Status.UNVALIDATED) for cid, v in rows}
    return {cid: got.get(cid, str(Status.UNVALIDATED)) for cid in case_ids}
