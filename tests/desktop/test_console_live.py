"""The console's live screen on linux-desktop, driven as a person would in Debian's Chromium (Playwright): a
terminal opened by a key chord through the page, a command typed into it, and a click on the scaled screen
landing in the guest where it was aimed (noVNC -> gh-server's relay -> the runner's view socket -> QEMU's
display, docs/console.md). A real gh-server and gh-runner (tests/startstates' Stack) hold the machine."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from guidinghand import Eager
from kit.browser import chromium, sign_in
from playwright.sync_api import Page, expect
from startstates.conftest import Stack, await_for

from .conftest import BOOT_TIMEOUT, DESKTOP_TEST_TIMEOUT_S, IMAGE

pytestmark = [pytest.mark.desktop, pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(DESKTOP_TEST_TIMEOUT_S)]

CONNECTED = "Connected: click the screen to type."
# The canvas is scaled to the page: one page pixel is scale guest pixels, so a click lands within that
# (rounded both ways) plus the pointer's own 2 px tolerance (tests/desktop/test_input.py).
TOLERANCE_PX = 2


@pytest.fixture(scope="module")
def desktop_stack(desktop_images_dir: Path) -> Iterator[Stack]:
    s = Stack(desktop_images_dir, image=IMAGE)
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def page(desktop_stack: Stack) -> Iterator[Page]:
    with chromium() as browser:
        p = browser.new_context(viewport={"width": 1280, "height": 800}, base_url=desktop_stack.base_url).new_page()
        sign_in(p, desktop_stack.admin_key)
        yield p


def guest(stack: Stack, ssid: str, script: str) -> str:
    """A script on the open machine as the signed-in user (beside the page: the test's own eyes)."""
    res = stack.guest_exec(ssid, script)
    assert res.exit_code == 0, (script, res)
    return str(res.stdout)


def session_up(stack: Stack, ssid: str) -> bool:
    try:
        return bool(stack.guest_exec(ssid, "xdotool search --onlyvisible --class xfdesktop >/dev/null").exit_code == 0)
    except Exception:  # the machine is still being made: ask again
        return False


def test_a_key_chord_typing_and_a_click_through_the_page(desktop_stack: Stack, page: Page) -> None:
    stack = desktop_stack
    gh: Eager = stack.sdk()
    ssid = gh.start_states.create("desktop in the page", IMAGE)["start_state_id"]
    try:
        # A person opens the page once the desktop is up: under TCG its first boot (and the runner's warm
        # snapshot of it) takes minutes, longer than a view waits for a machine still being made.
        await_for(lambda: session_up(stack, ssid), what="the signed-in session", timeout=BOOT_TIMEOUT, every=5)
        page.goto(f"/start_states/{ssid}")
        expect(page.get_by_text(CONNECTED)).to_be_visible(timeout=300_000)
        screen = page.get_by_label("Live screen")
        canvas = screen.locator("canvas")
        expect(canvas).to_be_visible()

        # A key chord: the window manager opens a terminal, which takes the keyboard.
        guest(stack, ssid, "pkill -x xfce4-terminal; rm -f /home/user/typed-in-the-page; true")
        screen.click(position={"x": 5, "y": 5})  # the page's keyboard goes to the live screen
        page.keyboard.press("Control+Alt+t")
        await_for(lambda: stack.guest_exec(ssid, "xdotool search --onlyvisible --class xfce4-terminal").exit_code == 0,
                  what="a terminal window after ctrl+alt+t from the page", timeout=120)
        await_for(lambda: stack.guest_exec(ssid, "xdotool getactivewindow getwindowname | grep -qi terminal")
                  .exit_code == 0, what="the terminal taking the focus", timeout=60)
        # In the user's home: the terminal is the session's, not the guest agent's (whose /tmp may be private).
        typed = "/home/user/typed-in-the-page"
        for _ in range(3):  # a terminal still drawing its first prompt may drop keys: clear the line, retype
            page.keyboard.press("Control+u")
            # As a person types ">": Shift held with the "." key. (Playwright's type(">") sends the key
            # without Shift, and noVNC passes QEMU the key's scancode, so the guest would see ".".)
            page.keyboard.type("echo typed-in-the-page ")
            page.keyboard.press("Shift+Period")
            page.keyboard.type(f" {typed}")
            page.keyboard.press("Enter")
            try:
                await_for(lambda: stack.guest_exec(ssid, f"grep -qx typed-in-the-page {typed}").exit_code == 0,
                          what="the command typed in the page run by the terminal", timeout=60)
                break
            except AssertionError:
                continue
        else:
            shot = gh.start_states.screen(ssid)
            (Path(os.environ.get("TMPDIR", "/tmp")) / "gh-console-live-typed.png").write_bytes(shot)
            raise AssertionError("typing in the page never ran the command in the terminal "
                                 "(the guest's screen: $TMPDIR/gh-console-live-typed.png)")
        guest(stack, ssid, "pkill -x xfce4-terminal; true")

        # A click on the scaled screen: where the page shows a guest pixel, the guest gets it.
        w, h = canvas.evaluate("c => [c.width, c.height]")
        box = canvas.bounding_box()
        assert box is not None and box["width"] < w, (box, w)  # the 1280-wide page scales the desktop down
        out = "/tmp/gh-console-click"
        guest(stack, ssid, f"rm -f {out} {out}.ready; setsid gh-desktop-probe click {out} 1 >/dev/null 2>&1 &")
        await_for(lambda: stack.guest_exec(ssid, f"test -e {out}.ready").exit_code == 0,
                  what="the click probe's window getting the focus", timeout=90)
        gx, gy = (w * 3) // 5, (h * 2) // 5
        page.mouse.click(box["x"] + (gx + 0.5) * box["width"] / w, box["y"] + (gy + 0.5) * box["height"] / h)
        got = await_for(lambda: stack.guest_exec(ssid, f"cat {out}").stdout.strip(), what="the probe seeing the click",
                        timeout=60)
        x, y, button = (int(v) for v in got.split())
        scale = w / box["width"]
        assert abs(x - gx) <= scale + TOLERANCE_PX and abs(y - gy) <= scale + TOLERANCE_PX and button == 1, \
            f"aimed at ({gx},{gy}) through a canvas scaled by {scale:.2f}, the guest got ({x},{y}) button {button}"
        guest(stack, ssid, "pkill -f 'gh-desktop-probe click'; true")
    finally:
        gh.start_states.close(ssid)
        await_for(lambda: stack.daemon.busy == 0, what="the machine closed on the runner", timeout=300)
        gh.close()
