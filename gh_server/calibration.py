"""Judge calibration: how often each rubric judge agrees with people.

People label attempts (`POST /v1/attempts/{id}/labels` {passed, note}); for each judge (by the model
that judged) we compare its verdicts with the labels: labelled (labels on rubric attempts of the runs
it judged), compared (those it gave a verdict on), agreed, rate, Cohen's kappa with its 95% interval,
and `trusted`: None under MIN_LABELS compared labels, False under MIN_AGREEMENT, True otherwise. Results
mark the rubric verdicts of a judge that is not trusted; they are reported, never dropped.

An assisted attempt (a person took its machine over, gh_server/counts.py) is never in calibration: it
cannot be labelled (409 `assisted`), and a label on one would not be read here either.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gh_server import stats
from gh_server.models import Attempt, AttemptLabel, RunCase

MIN_LABELS = 10
MIN_AGREEMENT = 0.8


def trusted(compared: int, agreed: int) -> bool | None:
    if compared < MIN_LABELS:
        return None
    return agreed / compared >= MIN_AGREEMENT


def calibration(session: Session) -> dict[str, Any]:
    rows = session.execute(
        select(Attempt.id, Attempt.test_run_id, Attempt.judge, RunCase.case, AttemptLabel.passed)
        .join(RunCase, RunCase.id == Attempt.run_case_id)
        .join(AttemptLabel, AttemptLabel.attempt_id == Attempt.id)
        .where(Attempt.assisted.is_(False))
    ).all()
    runs_of: dict[str, set[str]] = defaultdict(set)
    judged_runs = session.execute(select(Attempt.test_run_id, Attempt.judge).where(Attempt.judge.is_not(None))).all()
    for run_id, judge in judged_runs:
        if isinstance(judge, dict) and judge.get("judge_id"):
            runs_of[str(judge["judge_id"])].add(run_id)
    out = []
    for judge_id in sorted(runs_of):
        labelled = compared = agreed = 0
        table = [0, 0, 0, 0]  # judge yes & person yes, judge yes only, person yes only, both no
        for _aid, run_id, judge, case, label in rows:
            if run_id not in runs_of[judge_id] or not ((case or {}).get("success") or {}).get("rubric"):
                continue
            labelled += 1
            if not isinstance(judge, dict) or judge.get("judge_id") != judge_id:
                continue
            compared += 1
            said = bool(judge.get("passed"))
            agreed += int(said == bool(label))
            table[0 if said and label else 1 if said else 2 if label else 3] += 1
        k = stats.cohen_kappa(*table)
        out.append({
            "judge_id": judge_id,
            "labelled": labelled,
            "compared": compared,
            "agreed": agreed,
            "rate": round(agreed / compared, 4) if compared else None,
            "kappa": None if k.kappa is None else round(k.kappa, 4),
            "kappa_ci95": None if k.low is None or k.high is None else [round(k.low, 4), round(k.high, 4)],
            "trusted": trusted(compared, agreed),
        })
    return {"object": "judge_calibration", "min_labels": MIN_LABELS, "min_agreement": MIN_AGREEMENT,
            "labels": len(rows), "data": out}


def trust_by_judge(session: Session) -> dict[str, bool | None]:
    return {j["judge_id"]: j["trusted"] for j in calibration(session)["data"]}
