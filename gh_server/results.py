"""Run progress, pass rates, results and comparisons, computed from `attempts` in SQL-sized passes.

Results count the last attempt of each try (`is_last`): an error that was retried counts as its retry.
Errors never count against an agent: pass_rate = passed / (passed + failed). An attempt a person took
over and the check then scored counts as `assisted`, apart like errors (gh_server/counts.py).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gh_server import stats, trust
from gh_server.counts import COUNTED, Counted, counted_as, new_progress
from gh_server.models import Attempt, RunCase, TestRun, utcnow
from gh_server.timestamps import ts
from gh_wire.vocab import ACTIVE

QUEUED = ("queued",)


def rate(passed: int, failed: int) -> float | None:
    scored = passed + failed
    return round(passed / scored, 4) if scored else None


def score_or_outcome(score: float | None, outcome: str | None) -> float:
    """A scored try's score; one finished before scores were stored (migration 0012) reads as its outcome."""
    return float(score) if score is not None else (1.0 if outcome == "passed" else 0.0)


def mean_score(scores: list[float]) -> dict[str, Any]:
    """`mean_score` of the scored tries (no error, no assisted try) and `mean_score_ci`, its 95% interval:
    Wilson's, with the scores' sum as the successes (gh_server/stats.py, score_interval)."""
    if not scores:
        return {"mean_score": None, "mean_score_ci": None}
    ci = stats.score_interval(scores)
    return {"mean_score": round(sum(scores) / len(scores), 4),
            "mean_score_ci": None if ci is None else [round(ci[0], 4), round(ci[1], 4)]}


Computed = tuple[dict[str, int], dict[str, float | None], dict[str, float | None]]


def progress_for(session: Session, runs: Iterable[TestRun]) -> dict[str, Computed]:
    """(progress, pass_rate, mean_score) of each run, from one grouped query; mean_score per agent over
    the same tries as its pass rate (a try finished before scores were stored reads as its outcome)."""
    runs = list(runs)
    ids = [r.id for r in runs]
    out: dict[str, Computed] = {}
    if not ids:
        return out
    rows = session.execute(
        select(Attempt.test_run_id, Attempt.agent_id, Attempt.status, Attempt.outcome, Attempt.assisted,
               func.count(), func.sum(Attempt.score), func.count(Attempt.score))
        .where(Attempt.test_run_id.in_(ids), Attempt.is_last.is_(True))
        .group_by(Attempt.test_run_id, Attempt.agent_id, Attempt.status, Attempt.outcome, Attempt.assisted)
    ).all()
    prog: dict[str, dict[str, int]] = {i: new_progress() for i in ids}
    per_agent: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    score_sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for run_id, agent, status, outcome, assisted, n, score_sum, with_score in rows:
        p = prog[run_id]
        p["total"] += n
        if status in QUEUED:
            p["queued"] += n
        elif status in ACTIVE:
            p["running"] += n
        elif (counted := counted_as(status, outcome, assisted)) is not None:
            p[counted] += n
            if counted == "passed":
                per_agent[run_id][agent][0] += n
            elif counted == "failed":
                per_agent[run_id][agent][1] += n
            if counted in ("passed", "failed"):
                unscored = n - int(with_score or 0)  # finished before scores: 1 passed, 0 failed
                score_sums[run_id][agent] += float(score_sum or 0.0) + (unscored if counted == "passed" else 0)
    for r in runs:
        agents = list(r.agents or [])
        pr = {a: rate(*per_agent[r.id][a]) if a in per_agent[r.id] else None for a in agents}
        ms: dict[str, float | None] = {}
        for a in agents:
            scored = sum(per_agent[r.id][a]) if a in per_agent[r.id] else 0
            ms[a] = round(score_sums[r.id][a] / scored, 4) if scored else None
        out[r.id] = (prog[r.id], pr, ms)
    return out


def _tally() -> dict[str, Any]:
    return {"tries": 0, **dict.fromkeys(COUNTED, 0)}


TALLIED = ("tries", *COUNTED)  # what a row adds to its agent's, tag's and category's tally


def _stats(seconds: list[float], steps: list[int], active: float) -> dict[str, Any]:
    s = sorted(seconds)
    p90 = s[min(len(s) - 1, round(0.9 * (len(s) - 1)))] if s else None
    return {
        "active_seconds": round(active),
        "median_seconds": round(statistics.median(s), 1) if s else None,
        "p90_seconds": round(p90, 1) if p90 is not None else None,
        "avg_steps": round(sum(steps) / len(steps), 1) if steps else None,
        "price_cents": None,
    }


def _attempt_rows(session: Session, run_id: str) -> list[Any]:
    t = Attempt.__table__
    metrics = t.c.metrics
    # Core, not ORM: for a 5,000-attempt run the ORM's row loading costs more than the query itself.
    stmt = select(
        t.c.run_case_id,
        t.c.agent_id,
        t.c.status,
        t.c.outcome,
        t.c.seconds,
        # Only the numbers results need, extracted in SQL (no JSON decoding per row in Python).
        metrics["active_seconds"].as_float(),
        metrics["steps"].as_integer(),
        metrics["cost_cents"].as_integer(),
        t.c.finished_at,
        t.c.score,
        t.c.is_last,
        *trust.columns(t),  # what the trust additions read, in the same pass
    ).where(t.c.test_run_id == run_id).order_by(t.c["try"], t.c.created_at)
    return list(session.connection().execute(stmt).all())


def _cases(session: Session, run_id: str) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for rc_id, case_id, position, case in session.execute(
        select(RunCase.id, RunCase.test_case_id, RunCase.position, RunCase.case).where(RunCase.test_run_id == run_id)
    ):
        case = case or {}
        out[rc_id] = {
            "test_case_id": case_id,
            "key": case.get("key"),
            "name": case.get("name", ""),
            "category": case.get("category"),
            "tags": list(case.get("tags") or []),
            "position": position,
        }
    return out


def results(session: Session, run: TestRun) -> dict[str, Any]:
    cases = _cases(session, run.id)
    rows = _attempt_rows(session, run.id)
    agents = list(run.agents or [])
    pair: dict[tuple[int, str], dict[str, Any]] = {}
    pair_secs: dict[tuple[int, str], list[float]] = defaultdict(list)
    pair_steps: dict[tuple[int, str], list[int]] = defaultdict(list)
    pair_active: dict[tuple[int, str], float] = defaultdict(float)
    pair_cost: dict[tuple[int, str], int | None] = {}
    finished: list[tuple[datetime, Counted]] = []
    total_attempts = 0
    trust_rows = [trust.TrustRow(r[1], *r[11:]) for r in rows]
    pair_scores: dict[tuple[int, str], list[float]] = defaultdict(list)
    for r, tr in zip(rows, trust_rows, strict=True):
        rc_id, agent, status, outcome, seconds, active, steps, cost, finished_at, score, is_last = r[:11]
        assisted = tr.assisted
        total_attempts += 1
        k = (rc_id, agent)
        p = pair.setdefault(k, {**_tally(), "cancelled": 0})
        # Time and cost also count retried errors; scored times count only the tries that count.
        pair_active[k] += float(active or 0)
        if cost is not None:
            pair_cost[k] = (pair_cost.get(k) or 0) + int(cost)
        if not is_last:
            continue
        p["tries"] += 1
        if status == "cancelled":
            p["cancelled"] += 1
        elif (counted := counted_as(status, outcome, assisted)) is not None:
            p[counted] += 1
            if finished_at is not None:
                finished.append((finished_at, counted))
            # The agent's times and steps: a person's hold is not the agent's time (nor an error's).
            if counted in ("passed", "failed"):
                pair_scores[k].append(score_or_outcome(score, outcome))
                if seconds is not None:
                    pair_secs[k].append(float(seconds))
                pair_steps[k].append(int(steps or 0))
    data: list[dict[str, Any]] = []
    by_agent: dict[str, dict[str, Any]] = {}
    agent_secs: dict[str, list[float]] = defaultdict(list)
    agent_scores: dict[str, list[float]] = defaultdict(list)
    group_scores: dict[tuple[str, str, str], list[float]] = defaultdict(list)  # (by, group, agent)
    agent_steps: dict[str, list[int]] = defaultdict(list)
    agent_active: dict[str, float] = defaultdict(float)
    by_tag: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    by_category: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    order = {a: i for i, a in enumerate(agents)}
    for (rc_id, agent), p in sorted(
        pair.items(), key=lambda kv: (cases.get(kv[0][0], {}).get("position", 0), kv[0][0], order.get(kv[0][1], 99))
    ):
        c = cases.get(rc_id, {"test_case_id": None, "key": None, "name": "", "category": None, "tags": []})
        k = (rc_id, agent)
        row = {
            "test_case_id": c["test_case_id"],
            "key": c["key"],
            "name": c["name"],
            "category": c["category"],
            "tags": c["tags"],
            "agent_id": agent,
            **{f: p[f] for f in (*TALLIED, "cancelled")},
            "all_passed": p["tries"] > 0 and p["passed"] == p["tries"],  # an assisted try is not passed
            **_stats(pair_secs[k], pair_steps[k], pair_active[k]),
            "cost_cents": pair_cost.get(k),
            **mean_score(pair_scores[k]),
        }
        data.append(row)
        a = by_agent.setdefault(agent, {**_tally(), "cost_cents": None})
        for f in TALLIED:
            a[f] += p[f]
        if pair_cost.get(k) is not None:  # what a model agent spent (its price times its tokens), retries too
            a["cost_cents"] = (a["cost_cents"] or 0) + int(pair_cost[k] or 0)
        agent_scores[agent].extend(pair_scores[k])
        agent_secs[agent].extend(pair_secs[k])
        agent_steps[agent].extend(pair_steps[k])
        agent_active[agent] += pair_active[k]
        for tag in c["tags"]:
            t = by_tag[tag].setdefault(agent, _tally())
            for f in TALLIED:
                t[f] += p[f]
            group_scores[("tag", tag, agent)].extend(pair_scores[k])
        if c["category"]:
            t = by_category[c["category"]].setdefault(agent, _tally())
            for f in TALLIED:
                t[f] += p[f]
            group_scores[("category", c["category"], agent)].extend(pair_scores[k])
    for agent, a in by_agent.items():
        a.update(_stats(agent_secs[agent], agent_steps[agent], agent_active[agent]))
        a["pass_rate"] = rate(a["passed"], a["failed"])
        a.update(mean_score(agent_scores[agent]))
    for by, group in (("tag", by_tag), ("category", by_category)):
        for name, per_agent in group.items():
            for agent, t in per_agent.items():
                t["pass_rate"] = rate(t["passed"], t["failed"])
                t.update(mean_score(group_scores[(by, name, agent)]))
    tot = _tally()
    for a in by_agent.values():
        for f in TALLIED:
            tot[f] += a[f]
    wall = None
    if run.started_at is not None:
        end = run.finished_at or utcnow()
        wall = int((end - run.started_at).total_seconds())
    totals = {
        **tot,
        "attempts": total_attempts,
        "pass_rate": rate(tot["passed"], tot["failed"]),
        **mean_score([x for xs in agent_scores.values() for x in xs]),
        "active_seconds": round(sum(agent_active.values())),
        "price_cents": None,
        "started_at": ts(run.started_at),
        "finished_at": ts(run.finished_at),
        "wall_seconds": wall,
    }
    out = {
        "object": "test_run_results",
        "test_run_id": run.id,
        "data": data,
        "by_agent": by_agent,
        "by_tag": dict(by_tag),
        "by_category": dict(by_category),
        "totals": totals,
        "timeline": timeline(run, finished),
    }
    # Intervals, pass@k, flaky, infrastructure errors apart, axes: from the same rows.
    return trust.enrich(session, run, out, trust_rows)


def timeline(run: TestRun, finished: list[tuple[datetime, Counted]], steps: int = 40) -> list[dict[str, Any]]:
    """Cumulative tries finished by each of about 40 points from the run's start."""
    start = run.started_at or run.created_at
    if start is None or not finished:
        return []
    end = run.finished_at or max(f for f, _ in finished)
    span = max((end - start).total_seconds(), 0.0)
    n = steps if span > 0 else 1
    finished.sort(key=lambda x: x[0])
    out: list[dict[str, Any]] = []
    counts: dict[str, int] = dict.fromkeys(COUNTED, 0)
    i = 0
    for step in range(1, n + 1):
        t = start + timedelta(seconds=span * step / n) if span > 0 else end
        while i < len(finished) and (finished[i][0] <= t or step == n):
            counts[finished[i][1]] += 1
            i += 1
        out.append({"t": ts(t), **counts})
    return out


def compare(session: Session, runs: list[TestRun]) -> dict[str, Any]:
    per_run = {r.id: results(session, r) for r in runs}
    baseline = runs[0].id
    compared = []
    for r in runs:
        res = per_run[r.id]
        compared.append(
            {
                "test_run_id": r.id,
                "name": r.name or "",
                "test_set_id": r.test_set_id,
                "status": r.status,
                "agents": list(r.agents or []),
                "created_at": ts(r.created_at),
                "totals": res["totals"],
                "by_agent": res["by_agent"],
            }
        )
    cases: dict[str, dict[str, Any]] = {}
    for r in runs:
        for row in per_run[r.id]["data"]:
            cid = row["test_case_id"]
            c = cases.setdefault(
                cid,
                {
                    "test_case_id": cid,
                    "key": row["key"],
                    "name": row["name"],
                    "category": row["category"],
                    "tags": row["tags"],
                    "results": {},
                    "changes": {},
                },
            )
            c["results"].setdefault(r.id, {})[row["agent_id"]] = {
                **{f: row[f] for f in TALLIED},
                "median_seconds": row["median_seconds"],
                "price_cents": row["price_cents"],
            }
    changes: dict[str, dict[str, int]] = {}
    for r in runs[1:]:
        counts = {"compared": 0, "improved": 0, "regressed": 0, "unchanged": 0}
        for c in cases.values():
            base = c["results"].get(baseline, {})
            mine = c["results"].get(r.id, {})
            for agent, res in mine.items():
                b = base.get(agent)
                if b is None:
                    continue
                rb, rm = rate(b["passed"], b["failed"]), rate(res["passed"], res["failed"])
                if rb is None or rm is None:
                    continue
                counts["compared"] += 1
                if rm > rb:
                    counts["improved"] += 1
                    c["changes"].setdefault(r.id, {})[agent] = "improved"
                elif rm < rb:
                    counts["regressed"] += 1
                    c["changes"].setdefault(r.id, {})[agent] = "regressed"
                else:
                    counts["unchanged"] += 1
        changes[r.id] = counts
    return {
        "object": "test_run_comparison",
        "baseline": baseline,
        "runs": compared,
        "changes": changes,
        "cases": list(cases.values()),
        "paired": trust.paired_runs(session, runs, per_run),  # per run but the baseline, per agent
    }
