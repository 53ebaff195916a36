"""Scripts on linux-desktop run as the signed-in user, inside the graphical session, elevated with
sudo (docs/desktop-guests.md): what a setup, check or agent exec sees."""

from __future__ import annotations

import pytest

from providers.qemu import QemuMachine

from .conftest import DESKTOP_TEST_TIMEOUT_S
from .gui import sh, until

pytestmark = [pytest.mark.desktop, pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(DESKTOP_TEST_TIMEOUT_S),
              pytest.mark.asyncio(loop_scope="session")]


async def test_a_script_runs_as_the_signed_in_user_in_the_session_and_elevates_with_sudo(
        desktop: QemuMachine) -> None:
    out = await sh(desktop, 'echo "$(id -un) $(id -u) $HOME $DISPLAY $XDG_RUNTIME_DIR $DBUS_SESSION_BUS_ADDRESS"\n'
                            'echo "shell=$BASH_VERSION"\n'
                            "sudo -n id -u\n")
    who, shell, elevated = out.strip().splitlines()
    assert who == "user 1000 /home/user :0 /run/user/1000 unix:path=/run/user/1000/bus"
    assert shell.startswith("shell=5.")  # the manifest's shell: bash
    assert elevated == "0"


async def test_a_per_user_setting_changed_by_a_script_is_the_sessions_own(desktop: QemuMachine) -> None:
    before = (await sh(desktop, "xfconf-query -c xsettings -p /Net/ThemeName")).strip()
    try:
        await sh(desktop, "xfconf-query -c xsettings -p /Net/ThemeName -s Adwaita-dark")
        # Read back in another script, and in the user's own file that xfconfd writes for the session.
        assert (await sh(desktop, "xfconf-query -c xsettings -p /Net/ThemeName")).strip() == "Adwaita-dark"
        await until(desktop, "grep -q 'Adwaita-dark' ~/.config/xfce4/xfconf/xfce-perchannel-xml/xsettings.xml",
                    30, "xfconfd saving the user's setting")
        out = await sh(desktop, "stat -c %U ~/.config/xfce4/xfconf/xfce-perchannel-xml/xsettings.xml")
        assert out.strip() == "user"
    finally:
        await sh(desktop, f"xfconf-query -c xsettings -p /Net/ThemeName -s {before}")


async def test_a_window_a_script_opens_is_on_the_users_screen(desktop: QemuMachine) -> None:
    await sh(desktop, "setsid mousepad /tmp/gh-window-test.txt >/dev/null 2>&1 &")
    try:
        await until(desktop, "xdotool search --onlyvisible --class mousepad >/dev/null", 120,
                    "a Mousepad window on the user's display")
    finally:
        await sh(desktop, "pkill -x mousepad; true")
