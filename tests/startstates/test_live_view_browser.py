"""The console's live screen on a real guest: Debian's Chromium (Playwright) signs in, opens a hand-made start
state's page, types into linux-tiny's console through noVNC, the live channel and the hypervisor, presses
Save, opens it again, types, presses Close; a case on the saved version sees what was typed before Save and
not what was typed before Close (docs/console.md, "Start states")."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from guidinghand import Eager
from kit.browser import chromium, sign_in
from playwright.sync_api import Page, expect

from .conftest import Stack, await_for
from .test_start_states import make_case, outcomes, run

pytestmark = pytest.mark.timeout(1500)

DOCS = Path(__file__).resolve().parents[2] / "docs"
CONNECTED = "Connected: click the screen to type."
# The first view on a fresh runner waits for the machine (and its warm snapshot) to be made.
FIRST_FRAME_MS = 240_000


@pytest.fixture
def page(stack: Stack) -> Iterator[Page]:
    with chromium() as browser:
        p = browser.new_context(viewport={"width": 1280, "height": 800}, base_url=stack.base_url).new_page()
        errors: list[str] = []
        p.on("pageerror", lambda e: errors.append(str(e)))
        sign_in(p, stack.admin_key)
        yield p
        assert errors == [], f"the console's code threw: {errors}"


def type_in_page(page: Page, stack: Stack, ssid: str, command: str, test: str) -> None:
    """Click the live screen and type `command` + Enter as a person would, until `test` holds in the guest (a
    console not ready yet drops keys: retype after a while)."""
    screen = page.get_by_label("Live screen")
    for _ in range(4):
        screen.click()
        page.keyboard.type(command)
        page.keyboard.press("Enter")
        try:
            await_for(lambda: stack.guest_exec(ssid, test).exit_code == 0, what=f"{test!r} in {ssid}", timeout=30)
            return
        except AssertionError:
            continue
    raise AssertionError(f"typing {command!r} in the page never made {test!r} true in the guest")


def test_typed_in_the_page_saved_and_close_discards(stack: Stack, gh: Eager, page: Page) -> None:
    ssid = gh.start_states.create("typed in the page", "linux-tiny")["start_state_id"]
    page.goto(f"/start_states/{ssid}")
    expect(page.get_by_text(CONNECTED)).to_be_visible(timeout=FIRST_FRAME_MS)
    type_in_page(page, stack, ssid, "touch /root/from-the-page", "test -f /root/from-the-page")
    if os.environ.get("GH_CONSOLE_SCREENSHOTS") == "1":
        page.screenshot(path=str(DOCS / "console-live.png"))

    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("button", name="Open")).to_be_enabled(timeout=600_000)  # saved: ready again
    assert gh.start_states.retrieve(ssid)["version"] == 1
    expect(page.get_by_label("Live screen")).to_have_count(0)  # no machine, no screen
    # A view's input is one row on the start state, written when the view ends (the save ended it).
    row = await_for(lambda: gh.start_states.retrieve(ssid).get("inputs"), what="the page's input recorded")[0]
    assert row["key_events"] >= len("touch /root/from-the-page") + 1 and row["pointer_events"] >= 1
    assert "from-the-page" not in repr(gh.start_states.retrieve(ssid))  # counts, never the text

    page.get_by_role("button", name="Open").click()
    expect(page.get_by_text(CONNECTED)).to_be_visible(timeout=FIRST_FRAME_MS)
    type_in_page(page, stack, ssid, "touch /root/discarded", "test -f /root/discarded")
    page.get_by_role("button", name="Close").click()
    expect(page.get_by_role("button", name="Open")).to_be_enabled(timeout=300_000)
    ready = gh.start_states.retrieve(ssid)
    assert ready["status"] == "ready" and ready["version"] == 1, ready
    await_for(lambda: stack.daemon.busy == 0, what="the machine closed on the runner")

    kept = make_case(gh, "typed in the page is there", ssid, "test -f /root/from-the-page")
    dropped = make_case(gh, "closed without saving is not", ssid, "test -f /root/discarded")
    r = run(gh, [kept, dropped])
    assert outcomes(gh, r["test_run_id"]) == {kept: "passed", dropped: "failed"}
    for c in (kept, dropped):
        gh.test_cases.delete(c)
    gh.start_states.delete(ssid)
