"""Results you can trust (docs/server-api.md): case validation of a run, people's labels, judge calibration."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from gh_server import calibration as cal
from gh_server import replays, report_page, validation
from gh_server.api.common import DB, Member, Principal
from gh_server.errors import conflict, invalid, not_found
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
    if a.assisted:
        # A label calibrates a judge of the agent's work; a person held this machine (gh_server/counts.py).
        raise conflict(f"Attempt {attempt_id} is assisted (a person took its machine over): its verdict is not the "
                       "agent's, so it cannot be labelled for judge calibration.", code="assisted")
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


def _report_link(request: Request, run_id: str) -> str:
    st = request.app.state.gh
    token = replays.sign_token(replays.signing_key(st.settings), "report:" + run_id)
    return f"{st.settings.base_url.rstrip('/')}/v1/test_runs/{run_id}/report?token={token}"


@router.get("/v1/test_runs/{test_run_id}/report_url", summary="A link that opens the run's results page in a browser")
def report_url(test_run_id: str, request: Request, s: Session = DB, _p: Principal = Member) -> dict[str, Any]:
    if s.get(TestRun, test_run_id) is None:
        raise not_found("test run", test_run_id)
    return {"object": "test_run_report", "test_run_id": test_run_id, "url": _report_link(request, test_run_id)}


@router.get("/v1/test_runs/{test_run_id}/report", include_in_schema=False)
def report(test_run_id: str, request: Request, s: Session = DB) -> Response:
    """The results page. A browser cannot send the API key, so the link carries a signed token for this
    run (from report_url; it expires like a replay_url); a bearer API key works too."""
    st = request.app.state.gh
    token = request.query_params.get("token") or ""
    ok = bool(token) and replays.verify_token(replays.signing_key(st.settings), "report:" + test_run_id, token)
    if not ok and not _api_key_ok(request, s):
        return JSONResponse({"error": {"type": "authentication", "message": "this report link is invalid or has "
                                       "expired; get a fresh one from GET /v1/test_runs/{id}/report_url"}},
                            status_code=401)
    run = s.get(TestRun, test_run_id)
    if run is None:
        return JSONResponse({"error": {"type": "not_found", "message": f"no test run {test_run_id!r}"}},
                            status_code=404)
    base = st.settings.base_url

    def replay(attempt_id: str) -> str:
        return replays.replay_url(st.settings, base, attempt_id)

    data = report_page.page_data(s, run, replay, lambda rid: _report_link(request, rid))
    return HTMLResponse(report_page.render(data), headers={"Cache-Control": "no-store",
                                                           "Referrer-Policy": "no-referrer"})


def _api_key_ok(request: Request, s: Session) -> bool:
    import hashlib

    from sqlalchemy import select

    from gh_server.models import ApiKey

    auth = request.headers.get("authorization", "")
    if auth[:7].lower() != "bearer " or not auth[7:].strip():
        return False
    digest = hashlib.sha256(auth[7:].strip().encode()).hexdigest()
    return s.execute(select(ApiKey.id).where(ApiKey.key_hash == digest, ApiKey.revoked_at.is_(None))).first() \
        is not None
