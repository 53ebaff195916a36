"""The selftest's guest probes without a guest: the evdev decoding (struct input_event on x86_64,
linux/input.h) and the PowerShell set's consistency with the WinRM wrapper that runs it."""

from __future__ import annotations

import base64
import struct

from gh_runner.selftest_probes import POWERSHELL, SH, evdev_click
from providers.base import ScriptResult
from providers.qemu.winrm import wrapper_script


def _ev(etype: int, code: int, value: int) -> bytes:
    return struct.pack("<qqHHi", 1700000000, 5, etype, code, value)


def _res(raw: bytes) -> ScriptResult:
    return ScriptResult(exit_code=0, stdout=f"events={base64.b64encode(raw).decode()}\n", stderr="")


def test_the_first_left_press_is_placed_at_the_last_absolute_position_before_it() -> None:
    raw = (_ev(3, 0, 100) + _ev(3, 1, 200) + _ev(0, 0, 0)        # a move, SYN
           + _ev(3, 0, 10923) + _ev(3, 1, 21845) + _ev(0, 0, 0)  # to 1/3, 2/3 of the tablet
           + _ev(1, 0x110, 1) + _ev(0, 0, 0) + _ev(1, 0x110, 0))  # BTN_LEFT down, up
    assert evdev_click(_res(raw), (721, 401)) == (240, 267)
    assert evdev_click(_res(_ev(3, 0, 5) + _ev(1, 0x110, 0)), (720, 400)) is None  # a release is no click
    assert evdev_click(ScriptResult(exit_code=0, stdout="", stderr=""), (720, 400)) is None


def test_powershell_probes_use_only_what_the_wrapper_defines_and_are_balanced() -> None:
    wrapper = wrapper_script(r"C:\Windows\Temp\gh-0", {})
    for name in ("typing_prepare", "click_prepare"):
        text = getattr(POWERSHELL, name)
        assert "Start-GhInteractive" in text and "function Start-GhInteractive" in wrapper
    for text in (POWERSHELL.user_setting, POWERSHELL.typing_prepare, POWERSHELL.click_prepare,
                 POWERSHELL.typing_read, POWERSHELL.click_read, wrapper):
        assert text.count("{") == text.count("}") and text.count("(") == text.count(")"), text
    assert "S-1-16-12288" in POWERSHELL.user_setting  # High Mandatory Level
    assert "HKCU:" in POWERSHELL.user_setting and "HKCU:" in POWERSHELL.read_setting
    assert SH.typed_line("abc") == "echo abc > /tmp/gh-selftest-typed"
