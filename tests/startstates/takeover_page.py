"""A person's takeover of a model agent's attempt, done in the console as a person does it, and what it
leaves behind, read from the outside (docs/console.md, "Watching an attempt"; docs/server-api.md,
"Takeovers" and "Assisted attempts"). Shared by the linux-tiny test
(tests/startstates/test_takeover_browser.py) and the desktop one (tests/desktop/test_takeover_desktop.py).

The agent is a model agent at the scripted model server (tests/gateway/modelserver.py): it presses Shift
every turn, which changes nothing on the machine, until the test lets it answer. The case's check passes only
when the person's command ran, so a pass is the person's doing, and the agent's finish after the hand-back is
the test's decision, not a race.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from gateway.modelserver import Seen, UntilAnswer, claude, member, model_server, text
from kit.browser import chromium, sign_in
from playwright.sync_api import Page, expect

from gh_server.settings import ModelAgentConfig

from .conftest import Stack, await_for
from .test_live_view import in_guest, new_key
from .test_start_states import check_after

AGENT = "busy-model"
KEY_ENV = "GH_TAKEOVER_TEST_MODEL_KEY"
WORDS = "Nothing to change yet: takeover-words-5."
ANSWER = "Done: the machine is as it should be."
CONNECTED = "Connected: click the screen to type."
WATCHING = "Watching (read-only)."


@dataclass
class Fix:
    """What the person does: `command` typed (never recorded: `needle`, a part of it found nowhere else, must
    appear in nothing the attempt shows), after which `test` holds in the guest (the case's check)."""

    command: str
    test: str
    needle: str


@dataclass
class ModelStack:
    stack: Stack
    model: UntilAnswer
    seen: Seen


@contextmanager
def model_stack(images_dir: Path, image: str) -> Iterator[ModelStack]:
    """A real gh-server and gh-runner on `image` with one more agent, `AGENT`: a model agent at a scripted
    model that presses Shift each turn until told to answer."""
    model = UntilAnswer(lambda: claude(text(WORDS), member("key", text="shift")), lambda: claude(text(ANSWER)),
                        pace=1.5)
    with model_server(model) as (url, seen):
        os.environ[KEY_ENV] = "sk-takeover-never-shown"
        # Turns come every few seconds until the test answers, minutes later under TCG: room for them all.
        agent = ModelAgentConfig(id=AGENT, kind="model", api="anthropic", model="scripted",  # type: ignore[arg-type]
                                 base_url=url, api_key_env=KEY_ENV, screen=(640, 400), retries=1, timeout=600,
                                 max_steps=2000)
        s = Stack(images_dir, image=image, agents={AGENT: agent})
        s.start()
        try:
            yield ModelStack(s, model, seen)
        finally:
            model.answer_now()  # a turn waiting for the go-ahead returns
            s.stop()
            os.environ.pop(KEY_ENV, None)


def guest_holds(stack: Stack, attempt_id: str, test: str) -> bool:
    """Whether the shell condition `test` holds on the attempt's machine (asked by the runner, not as the agent:
    the agent's execs are frozen while a person holds the machine)."""
    return in_guest(stack, attempt_id, test) == 0


TypeFix = Callable[[Page, Stack, str, Fix], None]


@dataclass
class Took:
    attempt_id: str
    run_id: str
    case_id: str
    holder: str  # the admin key's name, as "Held by" shows it
    key: str


def take_over_and_fix(ms: ModelStack, image: str, fix: Fix, type_fix: TypeFix, *, first_step_ms: float) -> Took:
    """A run of the busy model on a case checked by `fix.test`; in Chromium an admin opens the run, follows
    "Watch", sees the model's steps arrive, presses "Take over", does `type_fix` in the live screen, sees
    "Held by" them, presses "Hand back"; the agent asks its model again, which then answers; the page
    shows the replay. Asserts the agent made no model call while held."""
    stack, seen = ms.stack, ms.seen
    gh = stack.sdk()
    success: Any = check_after(fix.test)
    case = gh.test_cases.create("mended by hand", "Keep an eye on the machine.", image,  # type: ignore[arg-type]
                                success, limits={"minutes": 10})
    rid = str(gh.test_runs.create(test_case_ids=[case["test_case_id"]], agents=[AGENT])["test_run_id"])
    holder = f"fixer-{secrets.token_hex(3)}"
    key, _ = new_key(stack, "admin", holder)
    desk = stack.state.gateway.takeovers
    try:
        with chromium() as browser:
            page = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=stack.base_url).new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            sign_in(page, key, f"/test_runs/{rid}")
            page.get_by_role("link", name="Watch").click(timeout=first_step_ms)
            [attempt] = gh.test_runs.list_all_attempts(rid)
            aid = str(attempt["attempt_id"])
            expect(page).to_have_url(re.compile(rf"/attempts/{aid}$"))
            steps = page.get_by_role("list", name="Steps")
            expect(steps).to_contain_text(WORDS, timeout=first_step_ms)
            expect(page.get_by_text(WATCHING)).to_be_visible(timeout=300_000)

            page.get_by_role("button", name="Take over").click()
            expect(page.get_by_text(CONNECTED)).to_be_visible(timeout=120_000)
            expect(page.get_by_text(f"Held by {holder}").first).to_be_visible(timeout=30_000)
            # The agent's next machine request waits at the hold: from here on its loop cannot reach the model.
            await_for(lambda: desk.waiting.get(aid, 0) >= 1, what="the agent's next action held", timeout=300)
            asked = len(seen.requests)
            assert not guest_holds(stack, aid, fix.test), "the machine was mended before the person typed"
            type_fix(page, stack, aid, fix)
            assert len(seen.requests) == asked, "the agent asked its model while the person held the machine"
            assert desk.waiting.get(aid, 0) >= 1

            page.get_by_role("button", name="Hand back").click()
            expect(page.get_by_text(WATCHING)).to_be_visible(timeout=120_000)
            expect(page.get_by_text("the agent has the machine")).to_be_visible(timeout=30_000)
            # The agent goes on: its held request is answered (a fresh screen, or its input `taken_over`: which
            # one it was waiting with is a matter of timing) and it asks its model again.
            await_for(lambda: len(seen.requests) > asked, what="the agent's next turn after the hand-back",
                      timeout=300)
            ms.model.answer_now()
            expect(page.get_by_role("heading", name="Replay")).to_be_visible(timeout=600_000)
            expect(page.get_by_label("Live screen")).to_have_count(0)
            assert errors == [], f"the console's code threw: {errors}"
    finally:
        ms.model.answer_now()
        gh.close()
    return Took(aid, rid, str(case["test_case_id"]), holder, key)


def api(stack: Stack, path: str) -> dict[str, Any]:
    r = httpx.get(f"{stack.base_url}{path}", timeout=60, headers={"Authorization": f"Bearer {stack.admin_key}"})
    assert r.status_code == 200, r.text
    return dict(r.json())


def assert_assisted(stack: Stack, took: Took, fix: Fix) -> None:
    """From the outside: the attempt passed by its check and is assisted, the hold one span handed back with
    the person's counts (never the text), the results count it apart from the agent's passes, and the
    console's run page and the replay page say so."""
    with stack.sdk() as gh:
        done = gh.test_runs.wait(took.run_id, timeout=600, poll_interval=1)
    assert done["status"] == "completed", done
    a = api(stack, f"/v1/attempts/{took.attempt_id}")
    assert a["outcome"] == "passed" and a["check"]["after"] == "True" and a["assisted"] is True, a
    assert a["answer"] == ANSWER and a["task_end"]["reason"] == "finished", a
    assert a["takeover"] is None and a["live_url"] is None and a["metrics"]["held_seconds"] > 0, a
    [hold] = a["takeovers"]
    assert hold["by"] == took.holder and hold["ended_by"] == "handed_back" and hold["ended_at"], hold
    counts = hold["counts"]
    assert counts["typed"] >= len(fix.command) and counts["keys"] >= 1 and counts["clicks"] >= 1, hold
    assert {"kind": "key", "keys": "Return"} in [{"kind": e["kind"], "keys": e.get("keys")} for e in hold["events"]]
    assert fix.needle not in json.dumps(a), "the person's typed text is on the attempt"

    results = api(stack, f"/v1/test_runs/{took.run_id}/results")
    totals, mine = results["totals"], results["by_agent"][AGENT]
    assert (totals["assisted"], totals["passed"], totals["failed"], totals["pass_rate"]) == (1, 0, 0, None), totals
    assert (mine["assisted"], mine["passed"], mine["pass_rate"]) == (1, 0, None), mine
    run = api(stack, f"/v1/test_runs/{took.run_id}")
    assert run["progress"]["assisted"] == 1 and run["progress"]["passed"] == 0, run["progress"]
    assert not run["pass_rate"].get(AGENT), run["pass_rate"]

    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=stack.base_url).new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        sign_in(page, took.key, f"/test_runs/{took.run_id}")
        expect(page.locator("dd .progress")).to_have_text(
            "1 attempts · 0 queued · 0 running · 0 passed · 0 failed · 0 error · 1 assisted", timeout=30_000)
        # The replay: the assisted badge, the hold a band of the timeline, the person's steps listed.
        page.goto(a["replay_url"])
        expect(page.locator("#assisted")).to_be_visible()
        expect(page.get_by_role("img", name=re.compile(
            rf"^takeover 1: {took.holder} took over at .*, handed back at .*: \d+ keys?, \d+ clicks?, "
            rf"\d+ characters? typed$"))).to_be_visible()
        expect(page.get_by_role("heading", name="Human steps")).to_be_visible()
        human = page.locator("#human")
        expect(human).to_contain_text(f"{took.holder}: key Return")
        expect(human).to_contain_text(re.compile(rf"{took.holder}: typed \d+ characters"))
        expect(human).to_contain_text(re.compile(rf"{took.holder}: click left at \d+,\d+"))
        assert fix.needle not in page.content(), "the person's typed text is on the replay page"
        assert errors == [], f"the page's code threw: {errors}"
