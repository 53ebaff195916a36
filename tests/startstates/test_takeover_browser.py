"""A person takes a model agent's attempt over in Debian's Chromium on linux-tiny, types a command into the live
screen, hands it back, and the agent finishes: the attempt passes by its check only because of what the
person typed, is assisted, and is counted apart from the agent's passes by the API, the console's run page
and the replay page (docs/console.md, "Watching an attempt"; docs/server-api.md, "Takeovers" and
"Assisted attempts"). A real gh-server and gh-runner, the model at the scripted model server; the flow is
tests/startstates/takeover_page.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page

from gh_wire.vocab import HumanKey

from .conftest import Stack, await_for
from .takeover_page import Fix, ModelStack, assert_assisted, guest_holds, model_stack, take_over_and_fix

pytestmark = pytest.mark.timeout(1800)

# tty1 of linux-tiny is a root shell; the check reads the file the command makes, the agent never does.
FIX = Fix(command="touch /tmp/fixed-by-hand", test="test -e /tmp/fixed-by-hand", needle="touch /tmp")
BEYOND_ASCII = ("€", "ж")
KEYSYMS = (0x20AC, 0x06D6, 0xFFB4, 0xFFB2)  # what noVNC sends for them and for keypad 4 and 2 (keysymdef.h)


@pytest.fixture(scope="module")
def busy(images_dir: Path) -> Iterator[ModelStack]:
    with model_stack(images_dir, "linux-tiny") as ms:
        yield ms


def type_at_the_shell(page: Page, stack: Stack, attempt_id: str, fix: Fix) -> None:
    """Click the live screen and type the command + Enter as a person would, until it ran (a console not
    ready yet drops keys: retype after a while)."""
    screen = page.get_by_label("Live screen")
    for _ in range(4):
        screen.click()
        page.keyboard.type(fix.command)
        page.keyboard.press("Enter")
        try:
            await_for(lambda: guest_holds(stack, attempt_id, fix.test), what="the person's command run", timeout=30)
            break
        except AssertionError:
            continue
    else:
        raise AssertionError(f"typing {fix.command!r} in the page never made {fix.test!r} true in the guest")
    # Keys beyond ASCII, as the page's noVNC sends them: the euro sign (AltGr+E on a German layout) and Cyrillic
    # zhe (a Russian layout's ; key), as Chromium tells the page a real keyboard's press (Playwright's keyboard
    # knows a US layout only), then keypad 4 and keypad 2.
    steps = stack.state.gateway.takeovers.holds[attempt_id].steps
    typed = steps.typed
    cdp = page.context.new_cdp_session(page)
    for key, code, vk in (("€", "KeyE", 69), ("ж", "Semicolon", 186)):
        for kind in ("keyDown", "keyUp"):
            cdp.send("Input.dispatchKeyEvent", {"type": kind, "key": key, "code": code, "windowsVirtualKeyCode": vk,
                                                **({"text": key} if kind == "keyDown" else {})})
    for key in ("Numpad4", "Numpad2"):
        page.keyboard.press(key)
    await_for(lambda: steps.typed == typed + 4, what="the four keys counted as typed", timeout=30)
    page.keyboard.press("Control+U")  # the shell's line is empty again: a chord, named `ctrl+u`


def assert_no_keysym(stack: Stack, attempt_id: str) -> None:
    """Nothing a member reads of the attempt (its object, its replay page) holds what those keys were."""
    r = httpx.get(f"{stack.base_url}/v1/attempts/{attempt_id}", timeout=60,
                  headers={"Authorization": f"Bearer {stack.admin_key}"})
    assert r.status_code == 200, r.text
    [hold] = r.json()["takeovers"]
    assert {e["keys"] for e in hold["events"] if e["kind"] == "key"} <= {*HumanKey, "ctrl+u"}, hold["events"]
    replay = httpx.get(r.json()["replay_url"], timeout=60)
    assert replay.status_code == 200 and "handed_back" in replay.text
    for shown in (r.text, replay.text):
        for sym in KEYSYMS:
            assert f"0x{sym:04x}" not in shown.lower() and f'"{sym}"' not in shown, hex(sym)
        assert not set(BEYOND_ASCII) & set(shown)


def test_a_person_takes_over_in_the_page_mends_the_machine_and_the_agent_finishes(busy: ModelStack) -> None:
    took = take_over_and_fix(busy, "linux-tiny", FIX, type_at_the_shell, first_step_ms=900_000)
    assert_assisted(busy.stack, took, FIX)
    assert_no_keysym(busy.stack, took.attempt_id)
    with busy.stack.sdk() as gh:
        gh.test_cases.delete(took.case_id)
