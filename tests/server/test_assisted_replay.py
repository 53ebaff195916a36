"""An assisted attempt's replay, read in Chromium (Debian's, through Playwright): each takeover is a span of
the timeline (who, from when to when, how it ended) and the person's steps are listed as a person's:
counts, named keys and clicks, never the text typed. The exported replay (`gh-runner local`) keeps them."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from kit.browser import chromium
from playwright.sync_api import expect
from replaypage import replay_data

from gh_common import png
from gh_server import replays
from gh_server.models import Attempt, ReplayFrame

from .conftest import Server
from .test_test_runs import _attempts, _case, _finish

T0 = datetime(2026, 12, 3, 10, 0, 0, tzinfo=UTC)


def _at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


HOLD = {"by": "alice", "by_key_id": "key_1", "started_at": _at(20), "ended_at": _at(50), "ended_by": "handed_back",
        "held_seconds": 30.0, "counts": {"keys": 1, "clicks": 1, "typed": 7},
        "events": [{"at": _at(22), "kind": "click", "x": 10, "y": 20, "button": "left"},
                   # A typed event carries a count; were anything else there, the replay would not show it.
                   {"at": _at(25), "kind": "typed", "count": 7, "text": "hunter2"},
                   {"at": _at(26), "kind": "key", "keys": "Return"}],
        "events_dropped": 0}


def _assisted_attempt(server: Server) -> str:
    _case(server, "AS-R")
    rid = server.admin.test_runs.create(test_case_ids=["AS-R"], agents=["noop"], repeat=1)["test_run_id"]
    (a,) = _attempts(server, rid)
    _finish(server, a.id, "passed")
    frame = png.encode_rgb(bytes([40, 40, 40]) * 16 * 12, (16, 12))
    with server.state.db.begin() as s:
        row = s.get(Attempt, a.id)
        assert row is not None
        row.started_at, row.finished_at = T0, T0 + timedelta(seconds=70)
        row.metrics = {**(row.metrics or {}), "phase_seconds": {"machine": 5, "task": 60, "check_after": 5},
                       "held_seconds": 30.0}
        row.assisted, row.takeovers = True, [HOLD]
        for seq, t in enumerate((6, 18, 55)):
            s.add(ReplayFrame(attempt_id=a.id, seq=seq, at=T0 + timedelta(seconds=t), label="step", event=None,
                              png=frame))
    return a.id


def test_the_replay_shows_each_takeover_and_the_persons_steps(server: Server, tmp_path: Path) -> None:
    aid = _assisted_attempt(server)
    url = server.admin.attempts.retrieve(aid)["replay_url"]
    with chromium() as browser:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        expect(page.locator("body[data-ready='1']")).to_have_count(1)
        expect(page.locator("#assisted")).to_be_visible()
        said = ("alice took over at 20.0 s, handed back at 50.0 s (30.0 s held): "
                "1 key, 1 click, 7 characters typed")
        span = page.get_by_role("img", name=f"takeover 1: {said}")
        expect(span).to_be_visible()
        # The span sits where the hold was: 20 s to 50 s of the attempt's 70 s.
        timeline = page.locator("#timeline").bounding_box()
        box = span.bounding_box()
        assert timeline is not None and box is not None
        assert abs((box["x"] - timeline["x"]) / timeline["width"] - 20 / 70) < 0.03
        assert abs(box["width"] / timeline["width"] - 30 / 70) < 0.03
        human = page.locator("#human-box")
        expect(human.get_by_role("heading", name="Human steps")).to_be_visible()
        expect(human.locator(".hold-head")).to_have_text(said)
        expect(human.locator("ol.human-steps li")).to_have_text([
            "22.0 s — alice: click left at 10,20", "25.0 s — alice: typed 7 characters", "26.0 s — alice: key Return"])
        expect(page.locator("#marks span.human")).to_have_count(3)
        assert "hunter2" not in page.content()
        page.screenshot(path=str(tmp_path / "replay.png"))
        assert errors == [], errors

    with server.state.db() as s:
        exported = replays.export_replay(s, aid, tmp_path / "replays")
    assert exported is not None
    data = replay_data(exported)
    assert data["assisted"] is True
    (hold,) = data["takeovers"]
    assert (hold["by"], hold["start"], hold["end"], hold["ended_by"]) == ("alice", 20.0, 50.0, "handed_back")
    assert [e["kind"] for e in hold["events"]] == ["click", "typed", "key"]
    assert hold["events"][1] == {"at": _at(25), "t": 25.0, "kind": "typed", "count": 7}
    assert not re.search("hunter2", exported.read_text())
