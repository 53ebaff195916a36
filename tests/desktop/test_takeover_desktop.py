"""A person takes a model agent's attempt over in Debian's Chromium on linux-desktop: through the page they open a
terminal with the key chord ctrl+alt+t, type a command in it and hand the machine back; the agent finishes and
the attempt passes by its check only because of that command, assisted and counted apart (docs/console.md,
"Watching an attempt"; docs/server-api.md, "Takeovers" and "Assisted attempts"). A real gh-server and gh-runner
(tests/startstates' Stack), the model at the scripted model server; the flow is tests/startstates/takeover_page.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page
from startstates.conftest import Stack, await_for
from startstates.takeover_page import Fix, ModelStack, assert_assisted, guest_holds, model_stack, take_over_and_fix

from .conftest import BOOT_TIMEOUT, DESKTOP_TEST_TIMEOUT_S, IMAGE

pytestmark = [pytest.mark.desktop, pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(DESKTOP_TEST_TIMEOUT_S)]

# In the user's home: the terminal is the session's, not the guest agent's (whose /tmp may be private).
FIX = Fix(command="touch /home/user/fixed-by-hand", test="test -e /home/user/fixed-by-hand", needle="touch /home")


@pytest.fixture(scope="module")
def busy(desktop_images_dir: Path) -> Iterator[ModelStack]:
    with model_stack(desktop_images_dir, IMAGE) as ms:
        yield ms


def open_a_terminal_and_type(page: Page, stack: Stack, attempt_id: str, fix: Fix) -> None:
    """As a person: the page's keyboard to the live screen, ctrl+alt+t for a terminal, the command and Enter in
    it (again after clearing the line, should a terminal still drawing its first prompt drop keys)."""
    page.get_by_label("Live screen").click(position={"x": 5, "y": 5})
    page.keyboard.press("Control+Alt+t")
    await_for(lambda: guest_holds(stack, attempt_id, "xdotool search --onlyvisible --class xfce4-terminal"),
              what="a terminal window after ctrl+alt+t from the page", timeout=120)
    await_for(lambda: guest_holds(stack, attempt_id, "xdotool getactivewindow getwindowname | grep -qi terminal"),
              what="the terminal taking the focus", timeout=60)
    for _ in range(3):
        page.keyboard.press("Control+u")
        page.keyboard.type(fix.command)
        page.keyboard.press("Enter")
        try:
            await_for(lambda: guest_holds(stack, attempt_id, fix.test), what="the command run by the terminal",
                      timeout=60)
            return
        except AssertionError:
            continue
    raise AssertionError(f"typing {fix.command!r} in the page's terminal never made {fix.test!r} true")


def test_a_person_mends_the_desktop_in_a_terminal_opened_through_the_page(busy: ModelStack) -> None:
    took = take_over_and_fix(busy, IMAGE, FIX, open_a_terminal_and_type, first_step_ms=BOOT_TIMEOUT * 1000)
    assert_assisted(busy.stack, took, FIX)
    with busy.stack.sdk() as gh:
        gh.test_cases.delete(took.case_id)
