"""What makes a run's results trustworthy, added to `results` and `compare` (docs/server-api.md).

- per agent: the Wilson 95% interval of its pass rate, pass@k and pass^k for k up to its tries;
- per (case, agent): `flaky` when its scored tries disagree, and how the tasks ended;
- infrastructure errors apart: every attempt that ended `error` (retried ones too), as a rate of the
  run's attempts and by phase; never in an agent's denominator (pass_rate = passed / (passed + failed));
- assisted tries (a person took the machine over; gh_server/counts.py) in none of these: not scored, not
  flaky, no interval, no pass@k / pass^k, no axis, and in a paired comparison a try that was assisted
  on either side is not a pair;
- paired differences between two agents of a run, or one agent across two runs: per case and overall,
  with an exact McNemar test on tries paired by case and try order, and a paired bootstrap interval
  of the mean per-case difference, so that "B beats A" comes with its uncertainty.

Everything is additive: the fields the SDK's types name keep their meaning.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from gh_server import calibration, stats, validation
from gh_server.counts import counted_as
from gh_server.models import Attempt, TestRun

# (test_case_id, agent) -> the verdicts of its counted tries, in try order: True passed, False failed,
# None assisted (a person took the machine over: no verdict on the agent, but it holds its try's place,
# so that tries are still paired by their order).
Scored = dict[tuple[str, str], list[bool | None]]


def verdicts(tries: list[bool | None]) -> list[bool]:
    """The agent's own verdicts of a (case, agent): its assisted tries left out."""
    return [t for t in tries if t is not None]


def _interval(passed: int, n: int) -> list[float] | None:
    ci = stats.wilson(passed, n)
    return None if ci is None else [round(ci[0], 4), round(ci[1], 4)]


def columns(t: Any) -> list[Any]:
    """The attempt columns `TrustRow` reads (after the agent), selected with results' own pass over the
    attempts; the numbers are extracted in SQL (no JSON decoding per row in Python)."""
    return [t.c.test_case_id, t.c["try"], t.c.status, t.c.outcome, t.c.is_last,
            t.c.metrics["error_phase"].as_string(), t.c.metrics["task_end"]["reason"].as_string(),
            t.c.check["passed"].as_boolean(), t.c.judge["judge_id"].as_string(), t.c.judge["passed"].as_boolean(),
            t.c.judge["usage"]["seconds"].as_float(), t.c.judge["usage"]["tokens"].as_integer(),
            t.c.metrics["questions"].as_integer(), t.c.id, t.c.metrics["error_cause"].as_string(),
            t.c.metrics["failed_reason"].as_string(), t.c.assisted]


class TrustRow(NamedTuple):
    agent: str
    case_id: str
    try_number: int
    status: str
    outcome: str | None
    is_last: bool
    error_phase: str | None
    task_end: str | None
    checked: bool | None
    judge_id: str | None
    judged: bool | None
    judge_seconds: float | None
    judge_tokens: int | None
    questions: int | None
    attempt_id: str
    error_cause: str | None  # for an error: "case" or "infrastructure" (absent: an error of ours)
    failed_reason: str | None  # `failed` by a rule, not the check's verdict (gh_wire.vocab.FailReason)
    assisted: bool  # a person took the machine over during the task (gh_server/counts.py)


def scored_tries(session: Session, run_ids: list[str]) -> dict[str, Scored]:
    """Per run, the counted tries that were scored (passed or failed), in try order; an assisted one as
    None in its place."""
    t = Attempt.__table__
    stmt = (select(t.c.test_run_id, t.c.test_case_id, t.c.agent_id, t.c.outcome, t.c.assisted)
            .where(t.c.test_run_id.in_(run_ids), t.c.is_last.is_(True), t.c.status == "done",
                   t.c.outcome.in_(("passed", "failed")))
            .order_by(t.c["try"], t.c.created_at))
    out: dict[str, Scored] = {r: defaultdict(list) for r in run_ids}
    for run_id, case_id, agent, outcome, assisted in session.connection().execute(stmt):
        out[run_id][(case_id, agent)].append(_verdict("done", outcome, assisted))
    return out


def scored_scores(session: Session, run_ids: list[str]) -> dict[str, dict[tuple[str, str], list[float]]]:
    """Per run, the scores of the counted tries that were scored and not assisted (errors and assisted
    tries count in no mean), in try order; a try finished before scores were stored reads as its outcome."""
    t = Attempt.__table__
    stmt = (select(t.c.test_run_id, t.c.test_case_id, t.c.agent_id, t.c.outcome, t.c.score)
            .where(t.c.test_run_id.in_(run_ids), t.c.is_last.is_(True), t.c.status == "done",
                   t.c.outcome.in_(("passed", "failed")), t.c.assisted.is_not(True))
            .order_by(t.c["try"], t.c.created_at))
    out: dict[str, dict[tuple[str, str], list[float]]] = {r: defaultdict(list) for r in run_ids}
    for run_id, case_id, agent, outcome, score in session.connection().execute(stmt):
        out[run_id][(case_id, agent)].append(float(score) if score is not None else float(outcome == "passed"))
    return out


def _verdict(status: str, outcome: str | None, assisted: bool | None) -> bool | None:
    """A scored try's place in `Scored`: True passed, False failed, None assisted."""
    counted = counted_as(status, outcome, assisted)
    return None if counted == "assisted" else counted == "passed"


def enrich(session: Session, run: TestRun, res: dict[str, Any], rows: list[TrustRow]) -> dict[str, Any]:
    """Add the statistics to a run's results (in place; also returned). `rows`: every attempt of the run,
    in try order."""
    scored: Scored = defaultdict(list)
    task_ends: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    # Failures by a rule (the agent broke the check's channel), apart from the check's verdicts.
    failed_reasons: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    agent_failed_reasons: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    by_phase: dict[str, int] = defaultdict(int)
    agent_errors: dict[str, int] = defaultdict(int)
    errors = 0
    # The case's own errors (its setup or check at fault) apart from ours: both never count against the
    # agent, but the author must see which are theirs.
    case_by_phase: dict[str, int] = defaultdict(int)
    agent_case_errors: dict[str, int] = defaultdict(int)
    case_errors = 0
    # Calibration reads every label: only when this run has rubric verdicts to mark.
    trust_of = calibration.trust_by_judge(session) if any(r.judge_id for r in rows) else {}
    ax = _Axes()
    asked: list[tuple[str, str, str]] = []
    for (agent, case_id, _try, status, outcome, is_last, phase, end, checked, judge_id, judged,
         judge_s, judge_tok, questions, attempt_id, cause, failed_reason, assisted) in rows:
        # The evaluator's own overhead counts every attempt it was spent on, retried ones too.
        ax.judge_seconds[agent] += float(judge_s or 0)
        ax.judge_tokens[agent] += int(judge_tok or 0)
        if questions:
            asked.append((attempt_id, case_id, agent))
        if is_last and status == "done" and outcome in ("passed", "failed"):
            verdict = _verdict(status, outcome, assisted)
            scored[(case_id, agent)].append(verdict)
            if verdict is not None:  # the axes are the agent's: a person's fix is not its check or rubric
                ax.count(case_id, agent, checked, judge_id, judged, questions, trust_of)
        if status == "done" and outcome == "error" and cause == "case":
            case_errors += 1
            agent_case_errors[agent] += 1
            case_by_phase[phase or "runner"] += 1
        elif status == "done" and outcome == "error":
            errors += 1
            agent_errors[agent] += 1
            by_phase[phase or "runner"] += 1  # an attempt errored by the server (runner lost) has no phase
        if is_last and end:
            task_ends[(case_id, agent)][end] += 1
        if is_last and status == "done" and outcome == "failed" and failed_reason and not assisted:
            failed_reasons[(case_id, agent)][failed_reason] += 1
            agent_failed_reasons[agent][failed_reason] += 1
    valid = validation.case_statuses(session, sorted({r["test_case_id"] for r in res["data"]}))
    per_agent_cases: dict[str, list[tuple[int, int]]] = defaultdict(list)
    flaky_cases: dict[str, int] = defaultdict(int)
    for row in res["data"]:
        key = (row["test_case_id"], row["agent_id"])
        tries = verdicts(scored.get(key, []))
        n, c = len(tries), sum(tries)
        row["flaky"] = 0 < c < n
        row["ci95"] = _interval(c, n)
        row["task_ends"] = dict(task_ends.get(key, {}))
        row["failed_reasons"] = dict(failed_reasons.get(key, {}))
        # A row whose case is not known to be valid is marked: its score may say more about the case.
        row["case_validation"] = valid.get(row["test_case_id"], "unvalidated")
        row["case_valid"] = row["case_validation"] == "valid"
        if n:
            per_agent_cases[row["agent_id"]].append((n, c))
        flaky_cases[row["agent_id"]] += int(row["flaky"])
    for agent, a in res["by_agent"].items():
        a["ci95"] = _interval(a["passed"], a["passed"] + a["failed"])
        a["pass_at_k"], a["pass_hat_k"] = stats.pass_curves(per_agent_cases.get(agent, []))
        a["flaky_cases"] = flaky_cases.get(agent, 0)
        a["infrastructure_errors"] = agent_errors.get(agent, 0)
        a["case_errors"] = agent_case_errors.get(agent, 0)
        a["failed_reasons"] = dict(agent_failed_reasons.get(agent, {}))
    ax.customer_usage(session, asked)
    for row in res["data"]:
        row["rubric"] = ax.rubric_of(row["test_case_id"], row["agent_id"])
    for agent, a in res["by_agent"].items():
        a["axes"] = ax.axes_of(agent, a)
        a["untrusted_verdicts"] = sum(ax.untrusted[k] for k in ax.untrusted if k[1] == agent)
    attempts = len(rows)
    res["totals"]["infrastructure"] = {
        "errors": errors,
        "attempts": attempts,
        "rate": round(errors / attempts, 4) if attempts else None,
        "by_phase": dict(sorted(by_phase.items())),
    }
    res["totals"]["case_errors"] = {
        "errors": case_errors,
        "attempts": attempts,
        "rate": round(case_errors / attempts, 4) if attempts else None,
        "by_phase": dict(sorted(case_by_phase.items())),
    }
    agents = list(run.agents or [])
    if len(agents) > 1:
        first = {cid: t for (cid, a), t in scored.items() if a == agents[0]}
        res["paired_agents"] = {
            "baseline": agents[0],
            "agents": {b: paired(first, {cid: t for (cid, a), t in scored.items() if a == b}, res["data"])
                       for b in agents[1:]},
        }
    return res


def _dd_float() -> defaultdict[str, float]:
    return defaultdict(float)


@dataclass
class _Axes:
    """Structural (check scripts), behavioural (each rubric judge: mean and sd across tries) and efficiency
    (the agent's seconds, steps, questions; the evaluator's judge and customer time and tokens), kept apart."""

    checks: defaultdict[str, list[bool]] = field(default_factory=lambda: defaultdict(list))
    case_checks: defaultdict[tuple[str, str], list[bool]] = field(default_factory=lambda: defaultdict(list))
    # (agent, judge) -> verdicts as 1.0 or 0.0
    verdicts: defaultdict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    row_judges: defaultdict[tuple[str, str], dict[str, bool | None]] = field(default_factory=lambda: defaultdict(dict))
    judged: defaultdict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    untrusted: defaultdict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    questions: defaultdict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    judge_seconds: defaultdict[str, float] = field(default_factory=_dd_float)
    judge_tokens: defaultdict[str, float] = field(default_factory=_dd_float)
    customer_seconds: defaultdict[str, float] = field(default_factory=_dd_float)
    customer_tokens: defaultdict[str, float] = field(default_factory=_dd_float)

    def count(self, case_id: str, agent: str, checked: bool | None, judge_id: str | None, judged: bool | None,
              questions: int | None, trust_of: dict[str, bool | None]) -> None:
        if checked is not None:
            self.checks[agent].append(bool(checked))
            self.case_checks[(case_id, agent)].append(bool(checked))
        if judge_id and judged is not None:
            self.verdicts[(agent, judge_id)].append(1.0 if judged else 0.0)
            self.judged[(case_id, agent)] += 1
            t = trust_of.get(judge_id)
            self.row_judges[(case_id, agent)][judge_id] = t
            if t is not True:
                self.untrusted[(case_id, agent)] += 1
        self.questions[agent].append(int(questions or 0))

    def customer_usage(self, session: Session, asked: list[tuple[str, str, str]]) -> None:
        """The customer model's time and tokens, from the turns of the attempts that asked (few)."""
        if not asked:
            return
        agent_of = {aid: agent for aid, _c, agent in asked}
        for aid, turns in session.execute(select(Attempt.id, Attempt.customer_turns)
                                          .where(Attempt.id.in_(list(agent_of)))):
            for turn in turns or []:
                u = (turn or {}).get("usage") or {}
                self.customer_seconds[agent_of[aid]] += float(u.get("seconds") or 0)
                self.customer_tokens[agent_of[aid]] += int(u.get("tokens") or 0)

    def rubric_of(self, case_id: str, agent: str) -> dict[str, Any] | None:
        n = self.judged.get((case_id, agent), 0)
        if not n:
            return None
        return {"judged": n, "untrusted": self.untrusted.get((case_id, agent), 0),
                "judges": dict(self.row_judges[(case_id, agent)])}

    def axes_of(self, agent: str, tally: dict[str, Any]) -> dict[str, Any]:
        checks = self.checks.get(agent, [])
        cases = [v for (_c, a), v in self.case_checks.items() if a == agent and v]
        behavioural = {}
        for (a, judge_id), v in sorted(self.verdicts.items()):
            if a == agent:
                behavioural[judge_id] = {"n": len(v), "mean": round(statistics.fmean(v), 4),
                                         "sd": round(statistics.stdev(v), 4) if len(v) > 1 else None}
        q = self.questions.get(agent, [])
        return {
            "structural": {"checked": len(checks), "rate": round(sum(checks) / len(checks), 4) if checks else None,
                           "cases": len(cases), "cases_all_passed": sum(1 for v in cases if all(v))},
            "behavioural": behavioural,
            "efficiency": {
                "median_seconds": tally.get("median_seconds"), "p90_seconds": tally.get("p90_seconds"),
                "avg_steps": tally.get("avg_steps"), "avg_questions": round(statistics.fmean(q), 2) if q else None,
                "evaluator": {"judge_seconds": round(self.judge_seconds.get(agent, 0.0), 3),
                              "judge_tokens": int(self.judge_tokens.get(agent, 0)),
                              "customer_seconds": round(self.customer_seconds.get(agent, 0.0), 3),
                              "customer_tokens": int(self.customer_tokens.get(agent, 0))},
            },
        }


def paired(base: dict[str, list[bool | None]], other: dict[str, list[bool | None]],
           data: list[dict[str, Any]]) -> dict[str, Any]:
    """`other` against `base` on the cases both scored: per-case pass-rate differences, their mean with a
    paired bootstrap 95% interval, and an exact McNemar test on tries paired by case and try order. An
    assisted try (None) is no verdict: it is out of its case's rate, and the try it would pair with is
    not a pair."""
    keys = {r["test_case_id"]: r.get("key") for r in data}
    cases = []
    diffs: list[float] = []
    b_only = o_only = 0
    for cid in sorted(set(base) & set(other), key=lambda c: (keys.get(c) or "", c)):
        tb, to = verdicts(base[cid]), verdicts(other[cid])
        if not tb or not to:
            continue
        rb, ro = sum(tb) / len(tb), sum(to) / len(to)
        diffs.append(ro - rb)
        cases.append({"test_case_id": cid, "key": keys.get(cid), "baseline_rate": round(rb, 4),
                      "rate": round(ro, 4), "difference": round(ro - rb, 4)})
        for x, y in zip(base[cid], other[cid], strict=False):
            if x is None or y is None:
                continue
            b_only += int(x and not y)
            o_only += int(y and not x)
    mc = stats.mcnemar_exact(b_only, o_only)
    ci = stats.paired_bootstrap(diffs)
    return {
        "cases": cases,
        "compared": len(cases),
        "mean_difference": round(sum(diffs) / len(diffs), 4) if diffs else None,
        "ci95": None if ci is None else [round(ci[0], 4), round(ci[1], 4)],
        "mcnemar": {"baseline_only": mc.b, "other_only": mc.c, "p_value": round(mc.p_value, 6),
                    "mid_p": round(mc.mid_p, 6)},
    }


def paired_scores(base: dict[str, list[float]], other: dict[str, list[float]],
                  data: list[dict[str, Any]]) -> dict[str, Any]:
    """`other` against `base` on scores, on the cases both scored: per-case mean-score differences, their
    mean with a paired bootstrap 95% interval (as `paired` does for pass rates; no McNemar, which counts
    passes)."""
    keys = {r["test_case_id"]: r.get("key") for r in data}
    cases = []
    diffs: list[float] = []
    for cid in sorted(set(base) & set(other), key=lambda c: (keys.get(c) or "", c)):
        sb, so = base[cid], other[cid]
        if not sb or not so:
            continue
        mb, mo = sum(sb) / len(sb), sum(so) / len(so)
        diffs.append(mo - mb)
        cases.append({"test_case_id": cid, "key": keys.get(cid), "baseline_mean_score": round(mb, 4),
                      "mean_score": round(mo, 4), "difference": round(mo - mb, 4)})
    ci = stats.paired_bootstrap(diffs)
    return {
        "cases": cases,
        "compared": len(cases),
        "mean_difference": round(sum(diffs) / len(diffs), 4) if diffs else None,
        "ci95": None if ci is None else [round(ci[0], 4), round(ci[1], 4)],
    }


def paired_runs(session: Session, runs: list[TestRun], per_run: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each run but the first against the first, per agent both ran."""
    ids = [r.id for r in runs]
    scored = scored_tries(session, ids)
    scores = scored_scores(session, ids)
    base_id = ids[0]
    out: dict[str, Any] = {}
    for r in runs[1:]:
        per_agent: dict[str, Any] = {}
        for agent in r.agents or []:
            base = {cid: t for (cid, a), t in scored[base_id].items() if a == agent}
            mine = {cid: t for (cid, a), t in scored[r.id].items() if a == agent}
            if base and mine:
                data = per_run[r.id]["data"] + per_run[base_id]["data"]
                per_agent[agent] = paired(base, mine, data)
                per_agent[agent]["score"] = paired_scores(
                    {cid: x for (cid, a), x in scores[base_id].items() if a == agent},
                    {cid: x for (cid, a), x in scores[r.id].items() if a == agent}, data)
        out[r.id] = per_agent
    return out
