"""Results you can trust (issue 16): case validation of a run, people's labels, judge calibration."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from gh_server import calibration as cal
from gh_server import validation
from gh_server.api.common import DB, Member, Principal
from gh_server.errors import invalid, not_found
from gh_server.models import Attempt, AttemptLabel, TestRun, utcnow
from gh_server.serialize import ts

router = APIRouter(tags=["trust"])


class LabelBody(BaseModel):
    passed: bool = Field(description="whether a person judges that the agent solved the case")
    note: str = Field(default="", max_length=8000)


@router.get("/v1/test_runs/{test_run_id}/validation",
            summary="Case validation from a run of noop and reference: valid, broken, flaky or unvalidated")
def run_validation(test_run_id: str, s: Session = DB, _p: Principal = Member) -> dict[str, Any]:
    run = s.get(TestRun, test_run_id)
    if run is None:
        raise not_found("test run", test_run_id)
    missing = [a for a in validation.AGENTS if a not in (run.agents or [])]
    if missing:
        raise invalid("test_run_id", f"run {run.id} did not try {' and '.join(missing)}: a validation run "
                                     "has agents noop and reference")
    finished = run.status in ("completed", "cancelled")
    out = validation.run_validation(s, run, record=finished and run.status == "completed")
    s.commit()
    return out


@router.post("/v1/attempts/{attempt_id}/labels", summary="A person's verdict on an attempt (judge calibration)")
def label_attempt(attempt_id: str, body: LabelBody, s: Session = DB, p: Principal = Member) -> dict[str, Any]:
    a = s.get(Attempt, attempt_id)
    if a is None:
        raise not_found("attempt", attempt_id)
    if a.status != "done":
        raise invalid("attempt_id", f"attempt {attempt_id} is {a.status}: only a finished attempt can be labelled")
    row = s.get(AttemptLabel, attempt_id)
    if row is None:
        row = AttemptLabel(attempt_id=attempt_id, passed=body.passed)
        s.add(row)
    row.passed, row.note, row.labelled_by, row.created_at = body.passed, body.note, p.key_id, utcnow()
    s.commit()
    return {"object": "attempt_label", "attempt_id": attempt_id, "passed": row.passed, "note": row.note,
            "judge": a.judge, "created_at": ts(row.created_at)}


@router.get("/v1/judges/calibration", summary="Each rubric judge against people's labels: agreement and kappa")
def judges_calibration(s: Session = DB, _p: Principal = Member) -> dict[str, Any]:
    return cal.calibration(s)
