"""The results page: a run's cases x agents matrix with pass rates and interval bars, flaky
and broken cases marked, its agents' statistics, infrastructure errors and assisted tries (counted
apart), the timeline, the run compared with the one before it, the recent runs, and every try linked
to its replay.

One self-contained HTML file: the data is embedded as JSON and the style and script inline, so the
same page is served by gh-server (GET /v1/test_runs/{id}/report) and written by `gh-runner local` as
report.html beside report.json, which opens from disk with no server and no network.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gh_server import queue_wait, serialize
from gh_server import results as res
from gh_server.models import Attempt, RunCase, TestRun
from gh_server.serialize import ts

STATIC_DIR = Path(__file__).parent / "static"
RECENT_RUNS = 20

Link = Callable[[str], str | None]  # an id (attempt or run) -> its URL


def _embed_json(data: Any) -> str:
    # Inside <script>: "<" escaped so no string can close the tag or open a comment.
    return json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _previous(session: Session, run: TestRun) -> TestRun | None:
    """The latest earlier run that tried at least one of this run's cases."""
    mine = set(session.scalars(select(RunCase.test_case_id).where(RunCase.test_run_id == run.id)))
    earlier = session.scalars(select(TestRun).where(TestRun.created_at < run.created_at)
                              .order_by(TestRun.created_at.desc()).limit(RECENT_RUNS)).all()
    for other in earlier:
        theirs = set(session.scalars(select(RunCase.test_case_id).where(RunCase.test_run_id == other.id)))
        if mine & theirs:
            return other
    return None


def page_data(session: Session, run: TestRun, replay_link: Link, run_link: Link) -> dict[str, Any]:
    results = res.results(session, run)
    attempts: dict[str, list[dict[str, Any]]] = {}
    rows = session.scalars(select(Attempt).where(Attempt.test_run_id == run.id)
                           .order_by(Attempt.try_number, Attempt.created_at)).all()
    waits = queue_wait.reasons_for(session, rows)  # why each queued one is still queued
    for a in rows:
        wait = waits.get(a.id)
        attempts.setdefault(f"{a.test_case_id}|{a.agent_id}", []).append(
            {"attempt_id": a.id, "try": a.try_number, "retry_of": a.retry_of, "status": a.status,
             "outcome": a.outcome, "assisted": bool(a.assisted), "error_cause": serialize.error_cause(a),
             "score": serialize.attempt_score(a),
             "replay": replay_link(a.id),
             "queued_reason": wait.as_dict() if wait is not None else None})
    compare = None
    prev = _previous(session, run)
    if prev is not None:
        cmp = res.compare(session, [prev, run])
        compare = {"baseline": prev.id, "baseline_url": run_link(prev.id), "paired": cmp["paired"].get(run.id, {})}
    progress = res.progress_for(session, [run])
    recent = session.scalars(select(TestRun).order_by(TestRun.created_at.desc()).limit(RECENT_RUNS)).all()
    rates = res.progress_for(session, recent)
    runs = [{"test_run_id": r.id, "name": r.name, "status": r.status, "created_at": ts(r.created_at),
             "pass_rate": rates[r.id][1], "url": run_link(r.id)} for r in recent]
    return {
        "run": {"test_run_id": run.id, "name": run.name, "status": run.status, "agents": list(run.agents or []),
                "created_at": ts(run.created_at), "progress": progress[run.id][0]},
        "results": results,
        "attempts": attempts,
        "compare": compare,
        "runs": runs,
    }


def render(data: dict[str, Any]) -> str:
    template = (STATIC_DIR / "report.html").read_text(encoding="utf-8")
    title = f"Results {data['run'].get('name') or data['run']['test_run_id']}"
    # </style> or </script> cannot appear in our own assets; the data is escaped by _embed_json.
    return (template
            .replace("{{title}}", html.escape(title))
            .replace("{{style}}", (STATIC_DIR / "report.css").read_text(encoding="utf-8"))
            .replace("{{script}}", (STATIC_DIR / "report.js").read_text(encoding="utf-8"))
            .replace("{{data}}", _embed_json(data)))
