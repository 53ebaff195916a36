"""The replay page and its routes: signed links, redaction, frames, offline export, and the page
loading in headless Chromium (a screenshot is kept in the test output dir)."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from PIL import Image
from sqlalchemy import select

from gh_server import models, replays
from gh_server.app import create_state
from gh_server.db import upgrade
from gh_server.settings import Settings
from gh_server.state import ServerState

from . import chromium

SECRET = "blue-kite-42"
T0 = datetime(2026, 11, 1, 12, 0, 0, tzinfo=UTC)


def _png(colour: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (320, 200), colour).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture()
def state() -> Iterator[ServerState]:
    d = tempfile.mkdtemp(prefix="gh-replays-", dir="/var/tmp")
    st = create_state(Settings(data_dir=Path(d), start_background_tasks=False))
    upgrade(st.engine)
    try:
        yield st
    finally:
        st.engine.dispose()
        shutil.rmtree(d, ignore_errors=True)


def _seed(st: ServerState) -> str:
    case = {"key": "ASK-01", "name": "Wi-Fi password", "prompt": "What is my Wi-Fi password?",
            "customer": {"facts": {"Wi-Fi password": {"secret": SECRET}, "network": "HomeNet"}}}
    with st.db.begin() as s:
        s.add(models.TestRun(id="tr_r1", agents=["reference"], status="completed"))
        s.flush()
        rc = models.RunCase(test_run_id="tr_r1", test_case_id="tc_1", case=case,
                            start_state={"kind": "image", "image": "linux-tiny"})
        s.add(rc)
        s.flush()
        s.add(models.Attempt(
            id="at_r1", test_run_id="tr_r1", run_case_id=rc.id, test_case_id="tc_1", agent_id="reference",
            try_number=1, status="done", outcome="passed", answer=f"the password is {SECRET}",
            check={"before": "False", "after": "True", "passed": True},
            metrics={"phase_seconds": {"machine": 1.5, "ready": 3.0, "setup": 0.2, "check_before": 0.1,
                                       "task": 4.0, "check_after": 0.1, "teardown": 0.5},
                     "machine_origin": "lazy"},
            started_at=T0, finished_at=T0 + timedelta(seconds=10),
        ))
        s.flush()
        frames = [("first", None, (200, 0, 0)),
                  ("input", {"type": "type", "text": f"pw {SECRET}"}, (0, 200, 0)),
                  ("input", {"type": "click", "x": 10, "y": 20, "button": "left"}, (0, 0, 200)),
                  ("last", None, (200, 200, 200))]
        for seq, (label, event, colour) in enumerate(frames):
            s.add(models.ReplayFrame(attempt_id="at_r1", seq=seq, at=T0 + timedelta(seconds=5 + seq),
                                     label=label, event=event, png=_png(colour)))
    return "at_r1"


def _client(st: ServerState) -> TestClient:
    app = FastAPI()
    app.state.gh = st
    replays.install(app, st)
    return TestClient(app)


def test_tokens_are_scoped_to_an_attempt_and_expire() -> None:
    key = b"k" * 32
    tok = replays.sign_token(key, "at_a", ttl=60, now=1000)
    assert replays.verify_token(key, "at_a", tok, now=1059)
    assert not replays.verify_token(key, "at_a", tok, now=1061)  # expired
    assert not replays.verify_token(key, "at_b", tok, now=1000)  # another attempt
    assert not replays.verify_token(b"x" * 32, "at_a", tok, now=1000)  # another server's key
    exp, sig = tok.split(".")
    assert not replays.verify_token(key, "at_a", f"{int(exp) + 3600}.{sig}", now=1000)  # extended by hand
    assert not replays.verify_token(key, "at_a", "garbage", now=1000)


def test_signing_key_is_shared_through_the_data_dir(state: ServerState) -> None:
    k1 = replays.signing_key(state.settings)
    k2 = replays.signing_key(Settings(data_dir=state.settings.data_dir))
    assert k1 == k2 and len(k1) == 32
    assert (state.settings.data_dir / "replay-signing-key").stat().st_mode & 0o777 == 0o600


def test_page_needs_a_valid_token_or_api_key(state: ServerState) -> None:
    aid = _seed(state)
    client = _client(state)
    assert client.get(f"/v1/attempts/{aid}/replay").status_code == 401
    r = client.get(f"/v1/attempts/{aid}/replay?token=1.abc")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication"
    other = replays.replay_url(state.settings, "http://t", "at_other").split("?")[1]
    assert client.get(f"/v1/attempts/{aid}/replay?{other}").status_code == 401
    plain = "gh_live_member-key-for-the-replay-test"
    with state.db.begin() as s:
        s.add(models.ApiKey(id="ak_m", name="member", role="member", prefix=plain[:12],
                            key_hash=hashlib.sha256(plain.encode()).hexdigest()))
    r = client.get(f"/v1/attempts/{aid}/replay", headers={"Authorization": f"Bearer {plain}"})
    assert r.status_code == 200
    assert client.get("/v1/attempts/at_nope/replay", headers={"Authorization": f"Bearer {plain}"}).status_code == 404


def _embedded(html: str) -> dict[str, Any]:
    start = html.index('id="replay-data">') + len('id="replay-data">')
    return dict(json.loads(html[start:html.index("</script>", start)]))


def test_page_embeds_the_timeline_and_never_a_secret(state: ServerState) -> None:
    aid = _seed(state)
    client = _client(state)
    url = replays.replay_url(state.settings, "http://testserver", aid)
    r = client.get(url.removeprefix("http://testserver"))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert SECRET not in r.text
    data = _embedded(r.text)
    assert data["outcome"] == "passed" and data["check"]["after"] == "True"
    assert [f["label"] for f in data["frames"]] == ["first", "input", "input", "last"]
    assert [f["t"] for f in data["frames"]] == [5.0, 6.0, 7.0, 8.0]
    assert data["frames"][1]["event"]["text"] == "pw •••"
    assert data["answer"] == "the password is •••"
    assert [p["name"] for p in data["phases"]][:3] == ["machine", "ready", "setup"]
    assert data["phases"][2]["start"] == 4.5
    assert data["machine"] == "lazy"
    # The page links back to its run: a link signed for that run (as report_url gives), not the attempt's.
    run_path, _, run_token = data["run_url"].partition("?token=")
    assert run_path == "/v1/test_runs/tr_r1/report"
    assert replays.verify_token(replays.signing_key(state.settings), "report:tr_r1", run_token)
    assert not replays.verify_token(replays.signing_key(state.settings), aid, run_token)
    # Each frame URL carries the page's token, so the browser can load it.
    token = url.split("token=")[1]
    png = client.get(data["frames"][2]["src"])
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(png.content)).getpixel((5, 5)) == (0, 0, 200)
    assert token in data["frames"][2]["src"]
    assert client.get(f"/v1/attempts/{aid}/replay/frames/2").status_code == 401
    assert client.get(f"/v1/attempts/{aid}/replay/frames/9?token={token}").status_code == 404
    assert client.get("/v1/replay-assets/replay.js").status_code == 200
    assert client.get("/v1/replay-assets/..%2Fsettings.py").status_code == 404


def test_embedded_data_cannot_close_the_script_tag(state: ServerState) -> None:
    aid = _seed(state)
    with state.db.begin() as s:
        s.get(models.Attempt, aid).error = "</script><script>alert(1)</script>"  # type: ignore[union-attr]
    client = _client(state)
    html = client.get(replays.replay_url(state.settings, "", aid)).text
    assert "<script>alert(1)" not in html
    assert _embedded(html)["error"] == "</script><script>alert(1)</script>"


@pytest.mark.timeout(300)
def test_exported_replay_loads_in_headless_chromium(state: ServerState) -> None:
    if chromium.chromium() is None:
        pytest.fail("chromium is not installed: apt-get install chromium")
    aid = _seed(state)
    out = Path(tempfile.mkdtemp(prefix="gh-replay-export-", dir="/var/tmp"))
    try:
        with state.db() as s:
            page = replays.export_replay(s, aid, out, out.parent / (out.name + "-report.html"))
        assert page is not None and page.is_file()
        assert sorted(p.name for p in (page.parent / "frames").iterdir()) == ["0.png", "1.png", "2.png", "3.png"]
        assert SECRET not in page.read_text()
        loaded = chromium.load(page.as_uri(), chromium.OUTPUT_DIR / "replay-export.png")
        assert 'data-ready="1"' in loaded.dom  # the script ran to the end
        assert "frame 1/4" in loaded.dom and "ASK-01" in loaded.dom
        assert "machine: restored from a memory image, read as it is touched (lazy)" in loaded.dom
        # Back to the run: report.html, relative to the exported page.
        back = re.search(r'<a id="run-link" class="back" href="([^"]+)">← run tr_r1</a>', loaded.dom)
        assert back is not None, loaded.dom[:2000]
        assert (page.parent / back.group(1)).resolve() == (out.parent / (out.name + "-report.html")).resolve()
        assert SECRET not in loaded.dom
        with Image.open(loaded.screenshot) as im:
            assert im.size[0] >= 800
            # The first frame (red) is on screen: the image loaded from disk.
            colours = im.convert("RGB").getcolors(maxcolors=1 << 24) or []
            assert any(isinstance(c, tuple) and c[0] > 150 and c[1] < 60 and c[2] < 60 for _n, c in colours)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_a_model_agents_steps_show_in_the_page(state: ServerState) -> None:
    """The page shows a step's words and action under its frame, a click drawn where it landed,
    and an exec's script, exit code and output."""
    if chromium.chromium() is None:
        pytest.fail("chromium is not installed: apt-get install chromium")
    aid = _seed(state)
    note = {"agent": "model", "step": 1, "text": "I'll restart the service.", "action": {"type": "click"}}
    with state.db.begin() as s:
        for f in s.scalars(select(models.ReplayFrame).where(models.ReplayFrame.attempt_id == aid)):
            s.delete(f)
        s.flush()
        frames = [("input", {"type": "click", "x": 160, "y": 100, "button": "left", "note": note}),
                  ("exec", {"type": "exec", "script": "service app restart", "exit_code": 0, "timed_out": False,
                            "stdout_tail": "app restarted", "stderr_tail": ""})]
        for seq, (label, event) in enumerate(frames):
            s.add(models.ReplayFrame(attempt_id=aid, seq=seq, at=T0 + timedelta(seconds=5 + seq), label=label,
                                     event=event, png=_png((0, 0, 200))))
    out = Path(tempfile.mkdtemp(prefix="gh-replay-export-", dir="/var/tmp"))
    try:
        with state.db() as s:
            page = replays.export_replay(s, aid, out)
        assert page is not None
        loaded = chromium.load(page.as_uri(), chromium.OUTPUT_DIR / "replay-model-steps.png")
        assert 'data-ready="1"' in loaded.dom
        assert "step 1: click" in loaded.dom and "I'll restart the service." in loaded.dom
        assert re.search(r'id="click-marker" style="[^"]*display: block', loaded.dom), loaded.dom[-2000:]
        assert "exec (exit 0)" in loaded.dom  # the exec frame on the timeline
        with Image.open(loaded.screenshot) as im:
            colours = im.convert("RGB").getcolors(maxcolors=1 << 24) or []
            # The marker's red ring is drawn over the blue frame.
            assert any(isinstance(c, tuple) and c[0] > 200 and c[1] < 80 and c[2] < 80 for _n, c in colours)
    finally:
        shutil.rmtree(out, ignore_errors=True)
