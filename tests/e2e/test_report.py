"""The results table, the Wilson interval and the JSON report of `gh-runner local` (pure code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gh_local.report import (
    build_report,
    render_table,
    rows_from_attempts,
    summarize_agents,
    wilson_interval,
    write_report,
)


def test_wilson_known_values() -> None:
    # Reference values (Wilson 1927; as computed by statsmodels proportion_confint(method="wilson")).
    iv = wilson_interval(5, 10)
    assert iv is not None
    assert iv.low == pytest.approx(0.2366, abs=1e-4)
    assert iv.high == pytest.approx(0.7634, abs=1e-4)
    iv = wilson_interval(0, 10)
    assert iv is not None and iv.low == 0.0 and iv.high == pytest.approx(0.2775, abs=1e-4)
    iv = wilson_interval(10, 10)
    assert iv is not None and iv.high == 1.0 and iv.low == pytest.approx(0.7225, abs=1e-4)
    assert wilson_interval(0, 0) is None


def test_wilson_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError):
        wilson_interval(3, 2)
    with pytest.raises(ValueError):
        wilson_interval(-1, 2)


@given(st.integers(min_value=1, max_value=500).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_contains_the_estimate_and_stays_in_bounds(kn: tuple[int, int]) -> None:
    k, n = kn
    iv = wilson_interval(k, n)
    assert iv is not None
    assert 0.0 <= iv.low <= k / n + 1e-12
    assert k / n - 1e-12 <= iv.high <= 1.0
    assert iv.high - iv.low < 1.0


def _attempt(aid: str, key: str, agent: str, outcome: str, secs: float | None = 10.0, **kw: object) -> dict:
    a = {"attempt_id": aid, "test_case_id": "tc_" + key, "key": key, "agent_id": agent, "try": 1,
         "outcome": outcome, "status": "done", "retry_of": None, "replay_url": f"http://x/{aid}/replay",
         "started_at": "2026-01-01T00:00:00Z",
         "finished_at": None if secs is None else f"2026-01-01T00:00:{int(secs):02d}Z"}
    a.update(kw)
    return a


ATTEMPTS = [
    _attempt("at_1", "B-1", "noop", "failed", 4),
    _attempt("at_2", "B-1", "noop", "failed", 6),
    _attempt("at_3", "B-1", "reference", "passed", 10),
    _attempt("at_4", "B-1", "reference", "error", None),
    _attempt("at_5", "A-1", "noop", "failed", 5),
    _attempt("at_6", "A-1", "reference", "passed", 20),
]


def test_rows_count_each_outcome_and_keep_the_file_order() -> None:
    rows = rows_from_attempts(ATTEMPTS, case_order=["B-1", "A-1"])
    assert [(r.key, r.agent_id) for r in rows] == [("B-1", "noop"), ("B-1", "reference"),
                                                   ("A-1", "noop"), ("A-1", "reference")]
    b_noop, b_ref = rows[0], rows[1]
    assert (b_noop.tries, b_noop.passed, b_noop.failed, b_noop.error) == (2, 0, 2, 0)
    assert b_noop.median_seconds == 5.0
    assert (b_ref.tries, b_ref.passed, b_ref.failed, b_ref.error) == (2, 1, 0, 1)
    assert b_ref.median_seconds == 10.0  # the errored try has no end time and is left out


def test_pass_rate_leaves_errors_out() -> None:
    summaries = {s.agent_id: s for s in summarize_agents(rows_from_attempts(ATTEMPTS), ["noop", "reference"])}
    assert summaries["noop"].pass_rate == 0.0
    assert summaries["reference"].pass_rate == 1.0  # 2 passed, 1 error: the error is ours
    assert summaries["reference"].error == 1
    ci = summaries["reference"].ci95
    assert ci is not None and ci.high == 1.0 and 0.0 < ci.low < 1.0


def test_assisted_tries_are_counted_apart() -> None:
    """A try a person took over is neither passed nor failed for the agent; an assisted error stays an error."""
    attempts = [*ATTEMPTS, _attempt("at_7", "A-1", "reference", "failed", 30, assisted=True),
                _attempt("at_8", "A-1", "noop", "passed", 40, assisted=True),
                _attempt("at_9", "A-1", "noop", "error", None, assisted=True)]
    rows = {(r.key, r.agent_id): r for r in rows_from_attempts(attempts)}
    a_ref, a_noop = rows[("A-1", "reference")], rows[("A-1", "noop")]
    assert (a_ref.tries, a_ref.passed, a_ref.failed, a_ref.error, a_ref.assisted) == (2, 1, 0, 0, 1)
    assert a_ref.median_seconds == 20.0  # the held try's time is not the agent's
    assert (a_noop.tries, a_noop.passed, a_noop.failed, a_noop.error, a_noop.assisted) == (3, 0, 1, 1, 1)
    summaries = {s.agent_id: s for s in summarize_agents(list(rows.values()), ["noop", "reference"])}
    assert summaries["reference"].pass_rate == 1.0 and summaries["reference"].assisted == 1
    assert summaries["noop"].pass_rate == 0.0 and summaries["noop"].assisted == 1
    text = render_table(list(rows.values()), list(summaries.values()))
    assert any(line.split()[:2] == ["noop", "0%"] and "[1 assisted]" in line for line in text.splitlines())
    report = build_report({"test_run_id": "tr_1", "agents": ["noop", "reference"]}, None, attempts)
    assert report["agents"]["noop"]["assisted"] == 1 and report["attempts"][-1]["assisted"] is True


def test_agent_without_scored_tries_has_no_rate() -> None:
    rows = rows_from_attempts([_attempt("at_9", "A", "x", "error", None)])
    (s,) = summarize_agents(rows, ["x"])
    assert s.pass_rate is None and s.ci95 is None
    assert "n/a" in render_table(rows, [s])


def test_table_shows_every_row_and_each_agents_rate() -> None:
    rows = rows_from_attempts(ATTEMPTS, ["B-1", "A-1"])
    text = render_table(rows, summarize_agents(rows, ["noop", "reference"]))
    lines = text.splitlines()
    assert lines[0].split() == ["case", "agent", "tries", "passed", "failed", "error", "assisted", "score",
                                "median", "s"]
    assert lines[2].split() == ["B-1", "noop", "2", "0", "2", "0", "0", "0.000", "5.0"]
    assert any(line.split()[:2] == ["noop", "0%"] for line in lines)
    assert any(line.split()[:2] == ["reference", "100%"] and "[1 error]" in line for line in lines)


def test_scores_make_each_rows_and_agents_mean_score() -> None:
    """A try's `score` (docs/agents.md, "Scores"), or its outcome from an older server; errors and
    assisted tries in no mean. The agent's interval is Wilson's with the scores' sum as the passes."""
    attempts = [_attempt("at_1", "S-1", "x", "failed", 4, score=0.5, checkpoints=[{"name": "a", "score": 0.5}]),
                _attempt("at_2", "S-1", "x", "passed", 4, score=1.0),
                _attempt("at_3", "S-2", "x", "failed", 4),  # no score: its outcome's, 0
                _attempt("at_4", "S-2", "x", "failed", 4, score=0.25),
                _attempt("at_5", "S-2", "x", "error", None),
                _attempt("at_6", "S-2", "x", "failed", 4, score=0.75, assisted=True)]
    rows = rows_from_attempts(attempts, ["S-1", "S-2"])
    assert [r.mean_score for r in rows] == [0.75, 0.125]
    (s,) = summarize_agents(rows, ["x"])
    assert s.mean_score == 0.4375 and s.pass_rate == 0.25
    assert s.mean_score_ci == wilson_interval(1.75, 4)
    text = render_table(rows, [s])
    assert text.splitlines()[2].split()[7] == "0.750"
    assert any(line.split()[:2] == ["x", "0.438"] for line in text.splitlines())
    report = build_report({"test_run_id": "tr_1", "agents": ["x"]}, None, attempts)
    assert report["agents"]["x"]["mean_score"] == 0.4375
    assert report["agents"]["x"]["mean_score_ci"] == [round(s.mean_score_ci.low, 4), round(s.mean_score_ci.high, 4)]
    first = report["attempts"][0]
    assert first["score"] == 0.5 and first["checkpoints"] == [{"name": "a", "score": 0.5}]


def test_report_round_trips_and_lists_retries(tmp_path: Path) -> None:
    retried = _attempt("at_0", "B-1", "reference", "error", None)
    run = {"test_run_id": "tr_1", "status": "completed", "agents": ["noop", "reference"]}
    report = build_report(run, {"object": "test_run_results"}, ATTEMPTS, [retried, *ATTEMPTS],
                          case_order=["B-1", "A-1"], replays="http://x/replays")
    path = tmp_path / "out" / "report.json"
    write_report(path, report)
    back = json.loads(path.read_text())
    assert back["test_run_id"] == "tr_1"
    assert [a["attempt_id"] for a in back["attempts"]] == [a["attempt_id"] for a in ATTEMPTS]
    assert [a["attempt_id"] for a in back["retried_attempts"]] == ["at_0"]
    assert back["agents"]["noop"]["pass_rate"] == 0.0
    assert back["agents"]["reference"]["ci95"][1] == 1.0
    assert sum(r["tries"] for r in back["rows"]) == len(ATTEMPTS)
    assert list(path.parent.iterdir()) == [path]  # no temp file left behind
