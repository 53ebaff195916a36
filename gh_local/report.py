"""What `gh-runner local` prints and writes at the end of a run: the results table, each agent's
pass rate with a 95% confidence interval, and the JSON report.

Pure functions over the API's objects (`test_run`, `test_run_results`, `attempt`), so the same
code reads a run from the embedded control plane or from any gh-server. A try a person took over and
the check then scored is `assisted`, counted apart as the server counts it (gh_server/counts.py).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gh_server.counts import counted_as

Z_95 = 1.959963984540054  # two-sided 95% normal quantile


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


def wilson_interval(successes: float, n: int, z: float = Z_95) -> Interval | None:
    """Wilson score interval for a binomial proportion; None when there is no trial.

    Chosen over the normal approximation because runs are small (a few tries per case) and pass
    rates sit near 0 or 1, where the normal interval collapses to a point or leaves [0, 1].
    """
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return None
    p = successes / n
    z2 = z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    # At 0 or n successes the bound is exactly 0 or 1; rounding would otherwise print 99.99...%.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Interval(low, high)


def attempt_score(a: Mapping[str, Any]) -> float | None:
    """A scored try's score (docs/agents.md, "Scores"); from its outcome when the server sent none."""
    if a.get("score") is not None:
        return float(a["score"])
    return {"passed": 1.0, "failed": 0.0}.get(str(a.get("outcome")))


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class Row:
    """One case with one agent."""

    key: str
    agent_id: str
    tries: int
    passed: int
    failed: int
    error: int
    median_seconds: float | None
    assisted: int = 0  # a person took the machine over: scored by the check, never the agent's verdict
    mean_score: float | None = None  # of the passed and failed tries (no error, no assisted try)
    score_sum: float = 0.0  # their scores' sum, for the agent's mean and interval


@dataclass(frozen=True)
class AgentSummary:
    agent_id: str
    tries: int
    passed: int
    failed: int
    error: int
    pass_rate: float | None  # passed / (passed + failed): errors and assisted tries are never the agent's
    ci95: Interval | None
    assisted: int = 0
    mean_score: float | None = None  # of the passed and failed tries, like the pass rate
    mean_score_ci: Interval | None = None  # Wilson's, with the scores' sum as the passes (as the server)


def _median(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(statistics.median(vals)) if vals else None


def rows_from_attempts(attempts: Sequence[Mapping[str, Any]], case_order: Sequence[str] = ()) -> list[Row]:
    """Rows per (case, agent) from the last attempt of each try (the ones `is_last` lists).

    Computed here rather than copied from `results` so the table and the JSON report come from one
    list of attempts; the e2e tests check that both agree with the server's `results`.
    """
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for a in attempts:
        key = str(a.get("key") or a.get("test_case_id"))
        groups.setdefault((key, str(a["agent_id"])), []).append(a)
    order = {k: i for i, k in enumerate(case_order)}
    rows = []
    for (key, agent), items in groups.items():
        counted = [_counted(a) for a in items]
        scores = [sc for a, c in zip(items, counted, strict=True)
                  if c in ("passed", "failed") and (sc := attempt_score(a)) is not None]
        rows.append(Row(
            key=key, agent_id=agent, tries=len(items),
            passed=counted.count("passed"), failed=counted.count("failed"), error=counted.count("error"),
            # The agent's time: a try a person held is not.
            median_seconds=_median(s for a, c in zip(items, counted, strict=True)
                                   if c != "assisted" and (s := attempt_seconds(a)) is not None),
            assisted=counted.count("assisted"),
            mean_score=_mean(scores), score_sum=sum(scores),
        ))
    rows.sort(key=lambda r: (order.get(r.key, len(order)), r.key, r.agent_id))
    return rows


def _counted(a: Mapping[str, Any]) -> str | None:
    """What a listed attempt counts as (passed, failed, error, assisted); None when it has no outcome."""
    return counted_as("done" if a.get("outcome") else None, a.get("outcome"), bool(a.get("assisted")))


def attempt_seconds(a: Mapping[str, Any]) -> float | None:
    """Wall seconds of an attempt: from its start to its end, when both are known."""
    from datetime import datetime

    start, end = a.get("started_at"), a.get("finished_at")
    if not start or not end:
        return None
    try:
        t0 = datetime.fromisoformat(str(start).replace("Z", "+00:00"))
        t1 = datetime.fromisoformat(str(end).replace("Z", "+00:00"))
    except ValueError:
        return None
    return max(0.0, (t1 - t0).total_seconds())


def summarize_agents(rows: Sequence[Row], agents: Sequence[str] = ()) -> list[AgentSummary]:
    totals: dict[str, list[int]] = {a: [0, 0, 0, 0, 0] for a in agents}
    score_sums: dict[str, float] = {}
    for r in rows:
        score_sums[r.agent_id] = score_sums.get(r.agent_id, 0.0) + r.score_sum
        t = totals.setdefault(r.agent_id, [0, 0, 0, 0, 0])
        t[0] += r.tries
        t[1] += r.passed
        t[2] += r.failed
        t[3] += r.error
        t[4] += r.assisted
    out = []
    for agent, (tries, passed, failed, error, assisted) in totals.items():
        scored = passed + failed
        out.append(AgentSummary(
            agent_id=agent, tries=tries, passed=passed, failed=failed, error=error,
            pass_rate=(passed / scored) if scored else None, ci95=wilson_interval(passed, scored),
            assisted=assisted,
            mean_score=(score_sums.get(agent, 0.0) / scored) if scored else None,
            mean_score_ci=wilson_interval(min(float(scored), score_sums.get(agent, 0.0)), scored),
        ))
    return out


def _fmt_seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:.1f}"


def _fmt_rate(s: AgentSummary) -> str:
    if s.pass_rate is None or s.ci95 is None:
        return "n/a (no scored tries)"
    ci = f"95% CI {s.ci95.low * 100:.0f}%-{s.ci95.high * 100:.0f}%"
    return f"{s.pass_rate * 100:.0f}%  ({ci}, n={s.passed + s.failed})"


def _fmt_score(s: AgentSummary) -> str:
    if s.mean_score is None or s.mean_score_ci is None:
        return "n/a (no scored tries)"
    return (f"{s.mean_score:.3f}  (95% CI {s.mean_score_ci.low:.3f}-{s.mean_score_ci.high:.3f}, "
            f"n={s.passed + s.failed})")


def render_table(rows: Sequence[Row], summaries: Sequence[AgentSummary]) -> str:
    """The plain-text table printed at the end of `gh-runner local`."""
    header = ("case", "agent", "tries", "passed", "failed", "error", "assisted", "score", "median s")
    body = [(r.key, r.agent_id, str(r.tries), str(r.passed), str(r.failed), str(r.error), str(r.assisted),
             "-" if r.mean_score is None else f"{r.mean_score:.3f}", _fmt_seconds(r.median_seconds)) for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        cols = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in cols)

    out = [line(header), line(["-" * w for w in widths])]
    out += [line(b) for b in body]
    out.append("")
    out.append("pass rate per agent (errors and assisted tries are not counted for or against the agent):")
    name_w = max((len(s.agent_id) for s in summaries), default=5)
    for s in summaries:
        extra = f"  [{s.error} error{'s' if s.error != 1 else ''}]" if s.error else ""
        extra += f"  [{s.assisted} assisted]" if s.assisted else ""
        out.append(f"  {s.agent_id.ljust(name_w)}  {_fmt_rate(s)}{extra}")
    out.append("")
    out.append("mean score per agent (a try scores in [0, 1] and passes at 1; the same tries as the pass rate):")
    for s in summaries:
        out.append(f"  {s.agent_id.ljust(name_w)}  {_fmt_score(s)}")
    return "\n".join(out)


# Who an error is for (the attempt's `error_cause`): the case's author, or us (the platform). Both stay
# errors and never count against the agent; a server that does not tell them apart leaves it unset.
CAUSE_LABELS = {
    "case": "your case (the setup failed, or the check printed no True, False or score in [0, 1] as it must)",
    "infrastructure": "ours (machine, guest channel, runner, hypervisor or model endpoint)",
    None: "cause not recorded",
}


def _cause(a: Mapping[str, Any]) -> str | None:
    c = a.get("error_cause")
    return str(c) if c in ("case", "infrastructure") else None


def _reason(a: Mapping[str, Any]) -> str:
    err = a.get("error")
    if isinstance(err, Mapping):
        err = err.get("message") or err.get("reason") or json.dumps(err, sort_keys=True)
    return str(err or "no reason recorded").strip().splitlines()[0][:300]


def group_errors(attempts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The tries that ended in error, grouped by cause (your case first) and then by reason."""
    order = {"case": 0, "infrastructure": 1, None: 2}
    groups: dict[tuple[str | None, str], list[Mapping[str, Any]]] = {}
    for a in attempts:
        if a.get("outcome") == "error":
            groups.setdefault((_cause(a), _reason(a)), []).append(a)
    out = []
    for (cause, reason), items in sorted(groups.items(), key=lambda kv: (order[kv[0][0]], -len(kv[1]), kv[0][1])):
        out.append({"cause": cause, "reason": reason, "count": len(items),
                    "tries": [{"key": a.get("key") or a.get("test_case_id"), "agent_id": a.get("agent_id"),
                               "try": a.get("try"), "attempt_id": a.get("attempt_id")} for a in items]})
    return out


def render_errors(attempts: Sequence[Mapping[str, Any]]) -> str:
    """The errors block printed after the table ("" when no try ended in error)."""
    groups = group_errors(attempts)
    if not groups:
        return ""
    n = sum(g["count"] for g in groups)
    out = [f"errors: {n} of {len(attempts)} tr{'y' if len(attempts) == 1 else 'ies'} (not counted against "
           "any agent):"]
    cause: object = object()
    for g in groups:
        if g["cause"] != cause:
            cause = g["cause"]
            total = sum(x["count"] for x in groups if x["cause"] == cause)
            out.append(f"  {CAUSE_LABELS[g['cause']]}: {total}")
        where = ", ".join(f"{t['key']}/{t['agent_id']} try {t['try']}" for t in g["tries"][:6])
        more = f", +{g['count'] - 6} more" if g["count"] > 6 else ""
        out.append(f"    {g['count']}x {g['reason']}")
        out.append(f"       {where}{more}")
    return "\n".join(out)


def _attempt_entry(a: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("attempt_id", "test_case_id", "key", "agent_id", "try", "retry_of", "status", "outcome", "assisted",
            "score", "checkpoints", "error", "error_cause", "check", "metrics", "replay_url", "replay_path",
            "runner_id", "started_at", "finished_at")
    entry = {k: a.get(k) for k in keep}
    entry["seconds"] = attempt_seconds(a)
    return entry


def build_report(
    run: Mapping[str, Any],
    results: Mapping[str, Any] | None,
    attempts: Sequence[Mapping[str, Any]],
    all_attempts: Sequence[Mapping[str, Any]] = (),
    *,
    case_order: Sequence[str] = (),
    replays: str | None = None,
    partial: bool = False,
) -> dict[str, Any]:
    """The JSON report: the run, one row per case and agent, agents' pass rates with their 95% CI,
    the errors grouped by cause and reason, every counted attempt (with its replay) and the retried
    ones. `partial`: only the tries that finished before the run was interrupted."""
    rows = rows_from_attempts(attempts, case_order)
    summaries = summarize_agents(rows, run.get("agents") or ())
    counted = {a.get("attempt_id") for a in attempts}
    return {
        "object": "gh_runner_local_report",
        "test_run_id": run.get("test_run_id"),
        "status": run.get("status"),
        "partial": partial,
        "created_at": run.get("created_at"),
        "finished_at": run.get("finished_at"),
        "rows": [r.__dict__ for r in rows],
        "agents": {
            s.agent_id: {
                "tries": s.tries, "passed": s.passed, "failed": s.failed, "error": s.error,
                "assisted": s.assisted, "pass_rate": s.pass_rate,
                "ci95": None if s.ci95 is None else [round(s.ci95.low, 4), round(s.ci95.high, 4)],
                "mean_score": s.mean_score,
                "mean_score_ci": None if s.mean_score_ci is None
                else [round(s.mean_score_ci.low, 4), round(s.mean_score_ci.high, 4)],
            }
            for s in summaries
        },
        "errors": group_errors(attempts),
        "results": dict(results) if results is not None else None,
        "attempts": [_attempt_entry(a) for a in attempts],
        "retried_attempts": [_attempt_entry(a) for a in all_attempts if a.get("attempt_id") not in counted],
        "replays": replays,
    }


REPORT_DECIMALS = 3  # milliseconds for times, a tenth of a percent for rates


def rounded(value: Any, decimals: int = REPORT_DECIMALS) -> Any:
    """`value` with every float rounded: a report says 5.95 s, not 5.9495000000000005."""
    if isinstance(value, float):
        return round(value, decimals)
    if isinstance(value, Mapping):
        return {k: rounded(v, decimals) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(v, decimals) for v in value]
    return value


def write_report(path: Path, report: Mapping[str, Any]) -> None:
    """Write atomically, so an interrupted run never leaves half a report behind; floats rounded."""
    report = rounded(report)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".report-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
