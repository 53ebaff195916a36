"""The warm snapshot of linux-desktop is taken with the session up (docs/desktop-guests.md): a machine
restored from it is a signed-in desktop at once (no session wait), its clock is the host's, the
session survives the restore (X, the panel and xfconf answer, the screen is a desktop), and a
start state saved from it restores to the same signed-in desktop."""

from __future__ import annotations

import secrets
import time

import pytest

from providers.base import MachineOrigin, MachineSource
from providers.qemu import QemuMachine, QemuProvider

from .conftest import BOOT_TIMEOUT, DESKTOP_TEST_TIMEOUT_S, IMAGE
from .gui import colours, sh

pytestmark = [pytest.mark.desktop, pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(DESKTOP_TEST_TIMEOUT_S),
              pytest.mark.asyncio(loop_scope="session")]

CLOCK_TOLERANCE_S = 2.0


def clock_right(before: float, guest_now: str, after: float) -> bool:
    """The guest's clock, read by a script, within the tolerance of the host's while that script ran
    (bracketed by host readings: on a loaded host the answer takes seconds to come back)."""
    return before - CLOCK_TOLERANCE_S <= float(guest_now) <= after + CLOCK_TOLERANCE_S


async def test_a_machine_from_the_warm_snapshot_is_a_signed_in_desktop_at_once(desktop: QemuMachine) -> None:
    assert desktop.origin in (MachineOrigin.LAZY, MachineOrigin.RESTORED)
    session = desktop.image.manifest.session
    assert session is not None
    # The very first script after the restore: the session is there, not coming up.
    res = await desktop.run_script(session.ready_check, timeout=60)
    assert res.exit_code == 0, f"the session was not up right after the restore: {res.stderr}"
    before = time.time()
    out = await sh(desktop, "date +%s.%N; xdpyinfo | grep -c dimensions; pgrep -u user -x xfwm4 >/dev/null && echo wm")
    after = time.time()
    guest_now, screens, wm = out.split()
    assert clock_right(before, guest_now, after), (before, guest_now, after)
    assert screens == "1" and wm == "wm"
    assert colours(await desktop.screenshot()) > 50


async def test_a_start_state_saved_from_a_desktop_restores_signed_in_with_its_changes(
        desktop_provider: QemuProvider, desktop: QemuMachine) -> None:
    src = await desktop_provider.create_machine(f"at_{secrets.token_hex(4)}", MachineSource(image=IMAGE),
                                                timeout=BOOT_TIMEOUT)
    assert isinstance(src, QemuMachine)
    state_id = f"ss_{secrets.token_hex(4)}"
    try:
        await src.wait_ready(BOOT_TIMEOUT)
        await sh(src, "xfconf-query -c xfwm4 -p /general/theme -s Daloa; echo kept > ~/Desktop/note.txt")
        await src.save(state_id, 1, with_memory=True)
    finally:
        await src.destroy()
    m = await desktop_provider.create_machine(f"at_{secrets.token_hex(4)}",
                                              MachineSource(image=IMAGE, start_state_id=state_id, version=1),
                                              timeout=BOOT_TIMEOUT)
    assert isinstance(m, QemuMachine)
    try:
        await m.wait_ready(BOOT_TIMEOUT)
        before = time.time()
        out = await sh(m, "xfconf-query -c xfwm4 -p /general/theme; cat ~/Desktop/note.txt; date +%s")
        after = time.time()
        theme, note, guest_now = out.split()
        assert (theme, note) == ("Daloa", "kept")
        assert clock_right(before, guest_now, after), (before, guest_now, after)
    finally:
        await m.destroy()
        await desktop_provider.delete_version(state_id, 1)
