"""A person takes a model agent's attempt over in Debian's Chromium on linux-tiny, types a command into the live
screen, hands it back, and the agent finishes: the attempt passes by its check only because of what the
person typed, is assisted, and is counted apart from the agent's passes by the API, the console's run page
and the replay page (docs/console.md, "Watching an attempt"; docs/server-api.md, "Takeovers" and
"Assisted attempts"). A real gh-server and gh-runner, the model at the scripted model server; the flow is
tests/startstates/takeover_page.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page

from .conftest import Stack, await_for
from .takeover_page import Fix, ModelStack, assert_assisted, guest_holds, model_stack, take_over_and_fix

pytestmark = pytest.mark.timeout(1800)

# tty1 of linux-tiny is a root shell; the check reads the file the command makes, the agent never does.
FIX = Fix(command="touch /tmp/fixed-by-hand", test="test -e /tmp/fixed-by-hand", needle="touch /tmp")


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
            return
        except AssertionError:
            continue
    raise AssertionError(f"typing {fix.command!r} in the page never made {fix.test!r} true in the guest")


def test_a_person_takes_over_in_the_page_mends_the_machine_and_the_agent_finishes(busy: ModelStack) -> None:
    took = take_over_and_fix(busy, "linux-tiny", FIX, type_at_the_shell, first_step_ms=900_000)
    assert_assisted(busy.stack, took, FIX)
    with busy.stack.sdk() as gh:
        gh.test_cases.delete(took.case_id)
