"""`GET /v1/attempts/{id}/steps?after=SEQ` (gh_server/api/attempt_steps.py): the watch page's steps, redacted as the
replay is, bounded, after a sequence number; with the hold in progress, whether the replay masks, and frames a
console session loads by their plain URL. SQLite and PostgreSQL (the `server` fixture)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from gh_server.models import Attempt, ReplayFrame

from .conftest import Server

SECRET = "hunter2-kite"
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16


def make_attempt(server: Server) -> str:
    c = server.admin
    case = c.test_cases.create("watched steps", "Sign in.", "linux-tiny",  # type: ignore[arg-type]
                               {"check_script": "true"}, customer={"facts": {"pw": {"secret": SECRET}}})
    run = c.test_runs.create(test_case_ids=[case["test_case_id"]], agents=["noop"])
    [attempt] = c.test_runs.list_all_attempts(run["test_run_id"])
    return str(attempt["attempt_id"])


def add_frames(server: Server, aid: str, events: list[dict[str, Any] | None], start: int = 0) -> None:
    t0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    with server.state.db.begin() as s:
        row = s.get(Attempt, aid)
        assert row is not None
        row.status, row.started_at, row.runner_id = "running", t0, "rn_elsewhere"
        for i, event in enumerate(events, start):
            s.add(ReplayFrame(attempt_id=aid, seq=i, at=t0 + timedelta(seconds=i),
                              label=(event or {}).get("type", "change"), event=event, png=PNG))


def steps(server: Server, aid: str, after: int | None = None, key: str | None = None) -> httpx.Response:
    q = "" if after is None else f"?after={after}"
    return httpx.get(f"{server.base_url}/v1/attempts/{aid}/steps{q}", timeout=30,
                     headers={"Authorization": f"Bearer {key or server.member_key}"})


def test_a_member_reads_the_steps_after_a_seq_redacted(server: Server) -> None:
    aid = make_attempt(server)
    said = {"type": "screen", "note": {"text": f"I will type {SECRET} now", "action": {"type": "type", "text": SECRET}}}
    add_frames(server, aid, [None, said, {"type": "exec", "script": "ls", "exit_code": 2, "stdout_tail": SECRET}])
    r = steps(server, aid)
    assert r.status_code == 200, r.text
    body = r.json()
    assert {k: body[k] for k in ("object", "attempt_id", "status", "phase", "time_left_s", "takeover", "masked")} == {
        "object": "attempt_steps", "attempt_id": aid, "status": "running", "phase": "task", "time_left_s": None,
        "takeover": None, "masked": False}
    assert [(st["seq"], st["t"], st["label"]) for st in body["data"]] == [(0, 0.0, "change"), (1, 1.0, "screen"),
                                                                          (2, 2.0, "exec")]
    assert body["data"][0]["event"] is None and body["data"][0]["at"] == "2026-01-01T12:00:00.000Z"
    assert body["data"][1]["event"]["note"] == {"text": "I will type ••• now",
                                                "action": {"type": "type", "text": "•••"}}
    assert body["data"][2]["event"]["exit_code"] == 2 and body["data"][2]["event"]["stdout_tail"] == "•••"
    assert SECRET not in r.text
    assert body["data"][1]["src"] == f"/v1/attempts/{aid}/replay/frames/1"
    # After a seq: only what came since; nothing new is an empty list, not an error.
    assert [st["seq"] for st in steps(server, aid, after=1).json()["data"]] == [2]
    assert steps(server, aid, after=2).json()["data"] == []
    assert steps(server, aid, after=-2).status_code == 400
    assert steps(server, "at_nope").status_code == 404
    no_key = httpx.get(f"{server.base_url}/v1/attempts/{aid}/steps", timeout=30)
    assert no_key.status_code == 401


def test_an_answer_holds_at_most_200_frames(server: Server) -> None:
    aid = make_attempt(server)
    add_frames(server, aid, [{"type": "screen"}] * 250)
    first = steps(server, aid).json()["data"]
    assert [st["seq"] for st in first] == list(range(200))
    assert [st["seq"] for st in steps(server, aid, after=first[-1]["seq"]).json()["data"]] == list(range(200, 250))


def test_masked_and_the_hold_in_progress(server: Server) -> None:
    aid = make_attempt(server)
    add_frames(server, aid, [{"type": "screen"}])
    assert steps(server, aid).json()["masked"] is False
    # The runner marks the first masked frame (gh_runner/replay.py): from then the replay masks.
    add_frames(server, aid, [{"type": "type", "text": "•••", "masked": True}, None], start=1)
    with server.state.db.begin() as s:
        row = s.get(Attempt, aid)
        assert row is not None
        row.takeovers = [
            {"by": "bob", "started_at": "2026-01-01T12:00:05.000Z", "ended_at": "2026-01-01T12:00:09.000Z"},
            {"by": "alice", "by_key_id": "ak_1", "started_at": "2026-01-01T12:01:00.000Z", "ended_at": None}]
    body = steps(server, aid, after=0).json()
    assert body["masked"] is True and [st["seq"] for st in body["data"]] == [1, 2]
    assert body["takeover"] == {"by": "alice", "started_at": "2026-01-01T12:01:00.000Z",
                                "cap_at": "2026-01-01T12:31:00.000Z"}  # the server's 30 minutes
    with server.state.db.begin() as s:
        row = s.get(Attempt, aid)
        assert row is not None
        row.takeovers = [{**row.takeovers[1], "ended_at": "2026-01-01T12:02:00.000Z"}]  # type: ignore[index]
        row.status, row.outcome = "done", "passed"
    over = steps(server, aid).json()
    assert (over["takeover"], over["status"], over["phase"], over["masked"]) == (None, "done", "done", True)


def test_the_frames_open_with_the_console_session(server: Server) -> None:
    """The watch page loads `src` as it is: its session cookie opens the frame (a GET: no CSRF token)."""
    aid = make_attempt(server)
    add_frames(server, aid, [{"type": "screen"}])
    src = steps(server, aid).json()["data"][0]["src"]
    with httpx.Client(base_url=server.base_url, timeout=30) as browser:
        assert browser.get(src).status_code == 401
        r = browser.post("/v1/console/session", json={"api_key": server.member_key})
        assert r.status_code == 200, r.text
        frame = browser.get(src)
        assert frame.status_code == 200 and frame.content == PNG
        assert browser.get(f"/v1/attempts/{aid}/steps").status_code == 200
        browser.delete("/v1/console/session", headers={"X-CSRF-Token": r.json()["csrf_token"]})
        assert browser.get(src).status_code == 401
