"""Why a queued attempt is still queued: which runners are online and what none of them has.

Every queued attempt carries a `queued_reason` in the API (attempt objects), on the results page and,
at most once a minute, in the log: one of `QueueWait` and a sentence naming the runners online and
what is missing (the image, the start-state version, the label, a runner that reads scores, a free
slot). It is worked out when asked, from the runners' last hello, with the scheduler's own matching
rule (`runner_can_run`), so it never says a runner could take an attempt that the scheduler would not offer it.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gh_server.attempts.completion import complete_runs
from gh_server.attempts.lease import load_runner_caps, needs_scores
from gh_server.attempts.matching import Candidate, RunnerCaps, runner_can_run
from gh_server.attempts.states import fail_attempt
from gh_server.models import Attempt, RunCase, Runner, TestRun, utcnow
from gh_wire.vocab import QueueWait

log = logging.getLogger("gh_server.queue")

QUEUE_TIMEOUT_CHECK_S = 5.0  # how often queue timeouts are looked for (they end within this of their bound)
ONLINE_WINDOW_S = 60.0  # as settings.online_window_seconds: a runner heard from this recently is online
LOG_EVERY_S = 60.0


@dataclass(frozen=True)
class QueuedReason:
    code: QueueWait
    message: str
    runners_online: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"code": str(self.code), "message": self.message, "runners_online": list(self.runners_online)}


def _names(runners: Sequence[RunnerCaps]) -> str:
    shown = ", ".join(r.name for r in runners[:5])
    return shown + (f" and {len(runners) - 5} more" if len(runners) > 5 else "")


def _online(runners: Sequence[RunnerCaps]) -> str:
    return f"{len(runners)} runner{'s' if len(runners) != 1 else ''} online ({_names(runners)})"


def explain(c: Candidate, runners: Sequence[RunnerCaps]) -> QueuedReason:
    """Why `c` is not running yet, given the runners online."""
    names = tuple(r.name for r in runners)
    if not runners:
        return QueuedReason(QueueWait.NO_RUNNER, "no runner is online: start one (gh-runner --server URL "
                                                 "--token-file FILE), or wait for one to reconnect")
    online = _online(runners)
    if c.required_runner_id is not None and all(r.runner_id != c.required_runner_id for r in runners):
        return QueuedReason(QueueWait.PINNED_RUNNER_OFFLINE,
                            f"{online}; it must run on runner {c.required_runner_id}, which holds its start state "
                            "and is offline", names)
    pool = [r for r in runners if c.required_runner_id in (None, r.runner_id)]
    labelled = [r for r in pool if (bool(r.images) if c.runs_on == "vm" else c.runs_on in r.labels)]
    if not labelled:
        have = sorted({lab for r in pool for lab in r.labels})
        what = ("none advertises an image (runs_on vm needs a hypervisor)" if c.runs_on == "vm" else
                f"none has the label {c.runs_on!r} (their labels: {', '.join(have) or 'none'})")
        return QueuedReason(QueueWait.NO_LABEL, f"{online}; {what}", names)
    able = [r for r in labelled if runner_can_run(c, r)]
    ss = c.start_state or {}
    if not able and c.scored:
        old = [r for r in labelled if runner_can_run(replace(c, scored=False), r)]
        if old:
            return QueuedReason(QueueWait.NO_SCORES,
                                f"{online}; this case may score between 0 and 1 (checkpoints, or an OSWorld "
                                f"check), and {_names(old)} run{'s' if len(old) == 1 else ''} a gh-runner from "
                                "before scores, which reads a check's 0.5 as the case's error: upgrade it", names)
    if not able:
        if ss.get("kind") == "state":
            return QueuedReason(QueueWait.NO_VERSION,
                                f"{online}; none holds start state {ss.get('start_state_id')} version "
                                f"{ss.get('version')}", names)
        have = sorted({i for r in labelled for i in r.images})
        return QueuedReason(QueueWait.NO_IMAGE, f"{online}; none has the image {ss.get('image')!r} (they have: "
                                                f"{', '.join(have) or 'none'})", names)
    free = [r for r in able if r.free > 0]
    if not free:
        return QueuedReason(QueueWait.NO_FREE_SLOT,
                            f"{online}; every slot of {_names(able)} is busy: it runs when one frees", names)
    return QueuedReason(QueueWait.NEXT_PASS, f"{online}; {_names(free)} can take it: the next lease pass "
                                             "offers it (older attempts first)", names)


def online_runner_ids(session: Session, window_s: float = ONLINE_WINDOW_S) -> list[str]:
    """Runners connected (a gateway session holds them) and heard from within `window_s`."""
    since = utcnow() - timedelta(seconds=window_s)
    return list(session.scalars(select(Runner.id).where(
        Runner.session_id.is_not(None), Runner.revoked_at.is_(None), Runner.last_seen_at >= since)))


def reasons_for(session: Session, attempts: Iterable[Attempt],
                window_s: float = ONLINE_WINDOW_S) -> dict[str, QueuedReason]:
    """`queued_reason` of each queued attempt among `attempts` (the runners are read once)."""
    queued = [a for a in attempts if a.status == "queued"]
    if not queued:
        return {}
    caps = load_runner_caps(session, online_runner_ids(session, window_s))
    sources: dict[int, tuple[dict[str, Any], bool]] = {
        rid: (dict(ss or {}), needs_scores(dict(case or {})))
        for rid, ss, case in session.execute(select(RunCase.id, RunCase.start_state, RunCase.case).where(
            RunCase.id.in_({a.run_case_id for a in queued}))).all()}
    out = {}
    for a in queued:
        source, scored = sources.get(a.run_case_id, ({}, False))
        out[a.id] = explain(Candidate(a.id, a.runs_on, source, a.required_runner_id, scored=scored), caps)
    return out


def log_waiting(session: Session, older_than_s: float = LOG_EVERY_S, window_s: float = ONLINE_WINDOW_S) -> int:
    """One log line per run and reason for attempts queued longer than `older_than_s` (the scheduler
    calls it once a minute); returns how many attempts it spoke for."""
    since = utcnow() - timedelta(seconds=older_than_s)
    rows = session.scalars(select(Attempt).where(Attempt.status == "queued", Attempt.created_at <= since)
                           .limit(5000)).all()
    reasons = reasons_for(session, rows, window_s)
    counts: Counter[tuple[str, QueueWait, str]] = Counter()
    for a in rows:
        r = reasons[a.id]
        counts[(a.test_run_id, r.code, r.message)] += 1
    for (run_id, code, message), n in sorted(counts.items()):
        log.warning("run %s: %d attempt%s queued over %.0f s (%s): %s", run_id, n, "s" if n != 1 else "",
                    older_than_s, code, message)
    return len(rows)


def expire_queued(session: Session, window_s: float = ONLINE_WINDOW_S) -> list[str]:
    """Attempts queued past their run's `queue_timeout` end as `error` saying why they waited (not
    retried: a retry would wait for the same thing); their runs are completed when nothing is left.
    Returns the attempts ended."""
    now = utcnow()
    runs = session.execute(select(TestRun.id, TestRun.queue_timeout_seconds).where(
        TestRun.status.in_(("queued", "running")), TestRun.queue_timeout_seconds.is_not(None))).all()
    ended: list[str] = []
    touched: set[str] = set()
    for run_id, limit_s in runs:
        limit = float(limit_s or 0)
        since = now - timedelta(seconds=limit)
        late = session.scalars(select(Attempt).where(Attempt.test_run_id == run_id, Attempt.status == "queued",
                                                     Attempt.created_at <= since).limit(5000)).all()
        if not late:
            continue
        reasons = reasons_for(session, late, window_s)
        for a in late:
            why = reasons[a.id]
            error = f"queued longer than the run's queue_timeout ({limit:g} s): {why.message}"
            row = session.get(Attempt, a.id)
            failed = fail_attempt(session, a.id, error, retry=False, now=now, expect_status="queued")
            if failed is not None and row is not None:
                # Why it waited, kept with the error (the page and the API show it); ours, never the case's.
                row.metrics = {**(row.metrics or {}), "error_phase": "queue", "error_cause": "infrastructure",
                               "queued_reason": why.as_dict()}
                ended.append(a.id)
                touched.add(run_id)
    if touched:
        complete_runs(session, touched)
    return ended
