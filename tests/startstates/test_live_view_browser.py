"""The console's live screen on a real guest: Debian's Chromium (Playwright) signs in, opens a hand-made start
state's page, and types into linux-tiny's console through noVNC, the live channel and the hypervisor."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from guidinghand import Eager
from playwright.sync_api import expect, sync_playwright

from .conftest import Stack, await_for

pytestmark = pytest.mark.timeout(900)

CHROMIUM = "/usr/bin/chromium"


def test_a_command_typed_in_the_page_runs_in_the_guest(stack: Stack, gh: Eager) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no {CHROMIUM}: scripts/setup.sh installs Debian's chromium")
    ssid = gh.start_states.create("typed in the page", "linux-tiny")["start_state_id"]
    with sync_playwright() as pw:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium's sandbox refuses to run as root
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 800}, base_url=stack.base_url).new_page()
            page.goto("/")
            page.get_by_label("API key").fill(stack.admin_key)
            page.get_by_role("button", name="Sign in").click()
            expect(page.get_by_role("button", name="Sign out")).to_be_visible(timeout=30_000)
            page.goto(f"/start_states/{ssid}")
            # The first view on a fresh runner waits for the machine (and its warm snapshot) to be made.
            expect(page.get_by_text("Connected: click the screen to type.")).to_be_visible(timeout=180_000)
            screen = page.get_by_label("Live screen")
            for _ in range(4):  # a console not ready yet drops keys: retype after a while
                screen.click()
                page.keyboard.type("touch /tmp/from-the-page")
                page.keyboard.press("Enter")
                try:
                    await_for(lambda: stack.guest_exec(ssid, "test -f /tmp/from-the-page").exit_code == 0,
                              what="the typed command's file", timeout=30)
                    break
                except AssertionError:
                    continue
            else:
                raise AssertionError("typing in the page never ran the command in the guest")
        finally:
            browser.close()
    row = await_for(lambda: gh.start_states.retrieve(ssid).get("inputs"), what="the page's input recorded")[0]
    assert row["key_events"] >= len("touch /tmp/from-the-page") + 1 and row["pointer_events"] >= 1
    gh.start_states.close(ssid)
    await_for(lambda: stack.daemon.busy == 0, what="the machine closed on the runner")
