"""Watching a running attempt, through a real gh-server and gh-runner on linux-tiny (docs/console.md, "Watching an
attempt"; docs/protocol.md, "Live views"): members watch, nine at once all get the screen, and once a secret is
typed the watchers' views end with `masked` and new ones are refused so; in Debian's Chromium, a member watches a
model agent (the scripted model server, tests/gateway/modelserver.py) and sees its words arrive in the "Steps"
list beside the live screen while it runs, then the outcome and the replay."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway.modelserver import Reply, claude, member, model_server, text
from guidinghand import Eager
from kit.browser import chromium, sign_in
from kit.rfb import Closed, Viewer, stalled_viewer
from playwright.sync_api import Page, expect

from gh_server.settings import ModelAgentConfig

from .conftest import Stack, await_for
from .test_live_view import new_key, on_attempt, ws_url
from .test_start_states import check_after

pytestmark = pytest.mark.timeout(1800)

SECRET = "kite-7731-sekret"
KEY_ENV = "GH_WATCH_TEST_MODEL_KEY"
WORDS = "First I look at the console: watch-words-42."
ANSWER = "All done: watch-answer."
VIEWERS = 9  # more than the 8 watchers an attempt must take at once


class Model:
    """The scripted model's turns: one action with its words, then (once the test lets it) the answer."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, path: str, body: dict[str, Any]) -> Reply:
        turns = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        if turns == 0:
            return claude(text(WORDS), member("type", text="echo watched"))
        self.release.wait(600)
        return claude(text(ANSWER))


@pytest.fixture(scope="module")
def model() -> Iterator[tuple[Model, str]]:
    script = Model()
    with model_server(script) as (url, _seen):
        yield script, url
    script.release.set()


@pytest.fixture(scope="module")
def stack(images_dir: Path, model: tuple[Model, str]) -> Iterator[Stack]:
    """The start-state stack with one more agent: a model agent at the scripted server."""
    os.environ[KEY_ENV] = "sk-watch-never-shown"
    agent = ModelAgentConfig(id="scripted", kind="model", api="anthropic", model="scripted",  # type: ignore[arg-type]
                             base_url=model[1], api_key_env=KEY_ENV, screen=(640, 400), retries=1, timeout=600)
    s = Stack(images_dir, agents={"scripted": agent})
    s.start()
    try:
        yield s
    finally:
        s.stop()
        os.environ.pop(KEY_ENV, None)


def view(stack: Stack, aid: str, key: str) -> httpx.Response:
    return httpx.post(f"{stack.base_url}/v1/attempts/{aid}/view", timeout=30,
                      headers={"Authorization": f"Bearer {key}"})


def test_members_watch_nine_at_once_until_a_secret_is_typed(stack: Stack, gh: Eager) -> None:
    gate: Path = stack.gate_dir
    case = gh.test_cases.create("watched by members", "Nothing to do.", "linux-tiny",  # type: ignore[arg-type]
                                check_after("true"), limits={"minutes": 10})
    run = gh.test_runs.create(test_case_ids=[case["test_case_id"]], agents=["gate"])
    viewers: list[Viewer] = []
    try:
        entered = await_for(lambda: list(gate.glob("*.entered")), what="the attempt's task phase", timeout=900)
        aid = entered[0].name.removesuffix(".entered")
        # Three members (a key has at most MAX_WATCHES_PER_KEY_MACHINE watchers of one machine).
        watchers = [new_key(stack, "member")[0] for _ in range(3)]
        watcher = watchers[0]
        for n in range(VIEWERS):
            r = view(stack, aid, watchers[n % len(watchers)])
            assert r.status_code == 200 and r.json()["read_only"] is True, r.text
            viewers.append(Viewer(ws_url(stack, r.json()["url"])))
        # All nine at once: each gets the screen (a first full frame, not all black).
        for v in viewers:
            assert v.handshake() == (720, 400)
            v.update(incremental=False)
            assert v.updates == 1 and any(v.fb)
        # A tenth that asks for full frames and never reads them is dropped; the nine and the agent go on.
        relay = stack.state.extras["live_relay"]
        before = relay.ended["viewer_too_slow"]
        r = view(stack, aid, watcher)
        assert r.status_code == 200, r.text
        with stalled_viewer(ws_url(stack, r.json()["url"])):
            await_for(lambda: relay.ended["viewer_too_slow"] > before, what="the stalled watcher dropped", timeout=120)
        assert on_attempt(stack, aid, "exec", script="true").exit_code == 0  # the agent's requests answer
        for v in viewers:
            v.update(incremental=False)
            assert v.updates == 2
        steps = httpx.get(f"{stack.base_url}/v1/attempts/{aid}/steps", timeout=30,
                          headers={"Authorization": f"Bearer {watcher}"}).json()
        assert steps["masked"] is False and steps["status"] == "running", steps
        # The agent types a secret (its case's secret value, sent to redact, as the simulated customer's
        # type_fact sends it): every watcher's view ends with `masked`...
        on_attempt(stack, aid, "input", events=[{"type": "type", "text": SECRET}], redact=[SECRET])
        for v in viewers:
            assert v.close_reason(timeout=60).reason == "masked"
        # ...a new one is refused so, and the steps say the replay masks (what the page shows instead).
        r = view(stack, aid, watcher)
        assert r.status_code == 200, r.text
        with Viewer(ws_url(stack, r.json()["url"])) as late, pytest.raises(Closed) as refused:
            late.handshake()
        assert refused.value.reason == "masked"
        masked = await_for(lambda: httpx.get(f"{stack.base_url}/v1/attempts/{aid}/steps", timeout=30,
                                             headers={"Authorization": f"Bearer {watcher}"}).json()["masked"],
                           what="the replay's masked frame", timeout=60)
        assert masked is True
        (gate / "release").write_text("go")
    finally:
        (gate / "release").write_text("go")
        for v in viewers:
            v.close()
    gh.test_runs.wait(run["test_run_id"], timeout=600, poll_interval=1)
    assert [a["outcome"] for a in gh.test_runs.list_all_attempts(run["test_run_id"])] == ["passed"]
    for f in [gate / "release", *gate.glob("*.entered")]:
        f.unlink()
    gh.test_cases.delete(case["test_case_id"])


def painted(page: Page) -> bool:
    """Whether the live screen's canvas (noVNC's) has a pixel that is not black."""
    return bool(page.evaluate("""() => {
        const c = document.querySelector('[aria-label="Live screen"] canvas');
        if (!c || !c.width || !c.height) return false;
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        for (let i = 0; i < d.length; i += 4) if (d[i] || d[i + 1] || d[i + 2]) return true;
        return false;
    }"""))


def test_a_member_watches_a_model_agents_steps_arrive_in_the_page(stack: Stack, gh: Eager,
                                                                   model: tuple[Model, str]) -> None:
    script, _url = model
    case = gh.test_cases.create("watched in the page", "Look at the console.", "linux-tiny",  # type: ignore[arg-type]
                                check_after("true"), limits={"minutes": 10})
    run = gh.test_runs.create(test_case_ids=[case["test_case_id"]], agents=["scripted"])
    rid = run["test_run_id"]
    watcher, _ = new_key(stack, "member")
    try:
        with chromium() as browser:
            page = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=stack.base_url).new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            sign_in(page, watcher, f"/test_runs/{rid}")
            # The run's page links its live attempt's page.
            page.get_by_role("link", name="Watch").click(timeout=900_000)
            steps = page.get_by_role("list", name="Steps")
            expect(steps).to_contain_text(WORDS, timeout=900_000)
            expect(steps).to_contain_text("echo watched")
            [attempt] = gh.test_runs.list_all_attempts(rid)
            assert attempt["status"] == "running", attempt  # seen while it runs: the model waits for us
            expect(page.get_by_label("Live screen")).to_be_visible()
            expect(page.get_by_text("Watching (read-only).")).to_be_visible(timeout=240_000)
            await_for(lambda: painted(page), what="the live screen drawn", timeout=120)
            assert page.get_by_role("button", name="Take over").count() == 0  # a member's page has none
            script.release.set()
            # Over: the page shows the outcome and the replay, no live screen.
            expect(page.get_by_role("heading", name="Replay")).to_be_visible(timeout=600_000)
            expect(page.get_by_label("Live screen")).to_have_count(0)
            assert errors == [], f"the console's code threw: {errors}"
    finally:
        script.release.set()
    done = gh.test_runs.wait(rid, timeout=600, poll_interval=1)
    [attempt] = gh.test_runs.list_all_attempts(rid)
    assert attempt["outcome"] == "passed" and attempt["answer"] == ANSWER, (done, attempt)
    gh.test_cases.delete(case["test_case_id"])
