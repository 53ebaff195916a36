"""Input through the hypervisor on a real desktop (docs/desktop-guests.md): the absolute pointer maps 1:1
to the screen, key chords reach the window manager and applications, the wheel reaches a GUI
application, and text the keymap cannot type is refused by name with nothing typed."""

from __future__ import annotations

import pytest

from gh_wire.input import ClickEvent, KeyEvent, MoveEvent, ScrollEvent, TypeEvent
from providers.base import InputNotSupported
from providers.qemu import QemuMachine

from .conftest import DESKTOP_TEST_TIMEOUT_S
from .gui import colours, mouse_location, sh, start_probe, until

pytestmark = [pytest.mark.desktop, pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(DESKTOP_TEST_TIMEOUT_S),
              pytest.mark.asyncio(loop_scope="session")]

TOLERANCE_PX = 2


async def _screen(desktop: QemuMachine) -> tuple[int, int]:
    await desktop.screenshot()
    assert desktop._screen_size is not None
    return desktop._screen_size


def _targets(w: int, h: int) -> list[tuple[int, int]]:
    return [(0, 0), (w - 1, 0), (0, h - 1), (w - 1, h - 1), (w // 2, h // 2)]


async def test_the_screen_is_a_desktop_at_the_manifests_size(desktop: QemuMachine) -> None:
    png = await desktop.screenshot()
    display = desktop.image.manifest.display
    assert display is not None
    assert desktop._screen_size == (display.width, display.height)
    assert colours(png) > 50, "the screen looks like a console or a blank screen, not a desktop"


async def test_the_pointer_lands_within_2px_at_the_corners_and_the_centre(desktop: QemuMachine) -> None:
    w, h = await _screen(desktop)
    for x, y in _targets(w, h):
        await desktop.send_input([MoveEvent(x=x, y=y)])
        gx, gy = await mouse_location(desktop)
        assert abs(gx - x) <= TOLERANCE_PX and abs(gy - y) <= TOLERANCE_PX, f"aimed at ({x},{y}), X has ({gx},{gy})"


async def test_clicks_land_in_a_gui_application_where_aimed(desktop: QemuMachine) -> None:
    w, h = await _screen(desktop)
    targets = _targets(w, h)
    out = "/tmp/gh-test-clicks"
    await start_probe(desktop, "click", out, len(targets))
    try:
        await desktop.send_input([ClickEvent(x=x, y=y) for x, y in targets])
        await until(desktop, f"[ $(wc -l < {out}) -ge {len(targets)} ]", 30, "the probe seeing every click")
        got = [tuple(int(v) for v in line.split()) for line in (await sh(desktop, f"cat {out}")).splitlines()]
    finally:
        await sh(desktop, "pkill -f 'gh-desktop-probe click'; true")
    for (x, y), (gx, gy, button) in zip(targets, got, strict=True):
        assert abs(gx - x) <= TOLERANCE_PX and abs(gy - y) <= TOLERANCE_PX and button == 1, (x, y, gx, gy, button)


async def test_the_wheel_reaches_a_gui_application(desktop: QemuMachine) -> None:
    w, h = await _screen(desktop)
    out = "/tmp/gh-test-scroll"
    await start_probe(desktop, "scroll", out, 5)
    try:
        # NOTE: one direction per batch. QEMU's USB tablet sums the wheel steps it has not yet
        # reported into one report, so opposite steps sent back to back could cancel out.
        await desktop.send_input([ScrollEvent(x=w // 2, y=h // 2, dy=3)])
        await until(desktop, f"[ $(wc -l < {out}) -ge 3 ]", 30, "the probe seeing three steps down")
        await desktop.send_input([ScrollEvent(x=w // 2, y=h // 2, dy=-2)])
        await until(desktop, f"[ $(wc -l < {out}) -ge 5 ]", 30, "the probe seeing two steps up")
        assert (await sh(desktop, f"cat {out}")).split() == ["down", "down", "down", "up", "up"]
    finally:
        await sh(desktop, "pkill -f 'gh-desktop-probe scroll'; true")


async def test_typed_text_reaches_a_focused_text_field(desktop: QemuMachine) -> None:
    out = "/tmp/gh-test-typed"
    await start_probe(desktop, "entry", out)
    try:
        await desktop.send_input([TypeEvent(text="Hello, Desktop! ~|{}<>?\n")])
        await until(desktop, f"test -s {out}", 30, "the text field receiving Return")
        assert (await sh(desktop, f"cat {out}")) == "Hello, Desktop! ~|{}<>?\n"
    finally:
        await sh(desktop, "pkill -f 'gh-desktop-probe entry'; true")


async def test_text_the_keymap_cannot_type_is_refused_by_name_and_nothing_is_typed(desktop: QemuMachine) -> None:
    out = "/tmp/gh-test-refused"
    await start_probe(desktop, "entry", out)
    try:
        with pytest.raises(InputNotSupported, match=r"'é' \(U\+00E9\)"):
            await desktop.send_input([TypeEvent(text="caf"), TypeEvent(text="é\n")])
        # Nothing of the sequence was sent: the field is empty when Return is pressed now.
        await desktop.send_input([KeyEvent(keys=["Return"])])
        await until(desktop, f"test -e {out}", 30, "the text field receiving Return")
        assert (await sh(desktop, f"cat {out}")) == "\n"
    finally:
        await sh(desktop, "pkill -f 'gh-desktop-probe entry'; true")


async def test_ctrl_alt_t_opens_a_terminal(desktop: QemuMachine) -> None:
    await sh(desktop, "pkill -x xfce4-terminal; true")
    try:
        await desktop.send_input([KeyEvent(keys=["ctrl", "alt", "t"])])
        await until(desktop, "xdotool search --onlyvisible --class xfce4-terminal >/dev/null", 120,
                    "a terminal window after ctrl+alt+t")
    finally:
        await sh(desktop, "pkill -x xfce4-terminal; true")


async def test_alt_tab_switches_windows_and_ctrl_s_saves_in_mousepad(desktop: QemuMachine) -> None:
    doc = "/home/user/Documents/gh-chord-test.txt"
    await sh(desktop, f"rm -f {doc}; : > {doc}; setsid mousepad {doc} >/dev/null 2>&1 &")
    probe = "/tmp/gh-test-alttab"
    try:
        await until(desktop, "xdotool search --onlyvisible --class mousepad >/dev/null", 120, "Mousepad's window")
        await start_probe(desktop, "entry", probe)  # now the probe has the focus, Mousepad is behind it
        assert "gh-desktop-probe" in await sh(desktop, "xdotool getactivewindow getwindowname")
        await desktop.send_input([KeyEvent(keys=["alt", "tab"])])
        await until(desktop, "xdotool getactivewindow getwindowname | grep -qi mousepad", 30,
                    "alt+tab bringing Mousepad to the front")
        await desktop.send_input([TypeEvent(text="saved with ctrl+s"), KeyEvent(keys=["ctrl", "s"])])
        await until(desktop, f"grep -qx 'saved with ctrl+s' {doc}", 30, "ctrl+s saving the document")
    finally:
        await sh(desktop, f"pkill -x mousepad; pkill -f 'gh-desktop-probe entry'; rm -f {doc}; true")
