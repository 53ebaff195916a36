"""The scripts `gh-runner selftest` runs in a guest, one set per shell.

Each probe prints `key=value` lines the selftest reads. The sh set runs on linux-tiny in CI, the
bash set on linux-desktop (as its signed-in user, through GUI windows: docs/desktop-guests.md); the
PowerShell set is written for win10-22h2 and has never run on a real Windows guest (there is no
Windows ISO where this was written): `gh-runner selftest --image win10-22h2` on a lab host is its test.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable
from dataclasses import dataclass

from providers.base import ScriptResult

TABLET_MAX = 32767  # QEMU's usb-tablet and virtio-tablet both report absolute axes as 0..0x7fff


@dataclass(frozen=True)
class ShellProbes:
    setting_name: str
    user_setting: str  # env GH_SELFTEST_NONCE; prints value=, user=, console_user=, elevated=True|False
    read_setting: str  # prints value=
    print_true: str
    print_false: str
    print_env: str  # prints phase=, answer=
    typing_prepare: str
    typed_line: Callable[[str], str]  # what to type on the console so that typing_read finds the text
    typing_read: str
    click_prepare: str
    click_read: str
    click_position: Callable[[ScriptResult, tuple[int, int]], tuple[int, int] | None]  # pixels, or None yet
    signed_in_fix: str
    elevated_fix: str
    # Desktops only: the fewest distinct colours a screenshot of the desktop has (a text console has
    # two or three), and a key chord with a script that succeeds once its effect is seen (and one
    # that undoes it). None where the image shows a console.
    min_colours: int | None = None
    chord: list[str] | None = None
    chord_seen: str = ""
    chord_undo: str = ""

    def print_bool(self, value: bool) -> str:
        return self.print_true if value else self.print_false


# -- sh (linux-tiny) ------------------------------------------------------------------------------

_SH_SETTING = "$HOME/.gh-selftest"
_SH_EVENTS = "/tmp/gh-selftest-ev"

SH_USER_SETTING = f"""
f="{_SH_SETTING}"
printf '%s\\n' "$GH_SELFTEST_NONCE" > "$f" || exit 1
echo "value=$(cat "$f")"
echo "user=$(id -un)"
# The console user: the owner of the process reading the first virtual console (the login shell).
con=""
for p in /proc/[0-9]*; do
  if [ "$(readlink "$p/fd/0" 2>/dev/null)" = /dev/tty1 ]; then con=$(stat -c %U "$p" 2>/dev/null) && break; fi
done
echo "console_user=$con"
if [ "$(id -u)" = 0 ]; then echo elevated=True; else echo elevated=False; fi
"""

# The tablet's driver may load after the guest agent answers: wait for its event device, then record
# its events in the background (the script returns; the reader keeps running until click_read).
SH_CLICK_PREPARE = f"""
dev=""
i=0
while [ -z "$dev" ] && [ $i -lt 60 ]; do
  dev=$(awk '/^N:/{{n=$0}} /^H:/{{ if (n ~ /Tablet/) print $0 }}' /proc/bus/input/devices | grep -o 'event[0-9]*')
  [ -n "$dev" ] || {{ sleep 0.5; i=$((i + 1)); }}
done
[ -n "$dev" ] || {{ echo "no tablet in /proc/bus/input/devices" >&2; exit 1; }}
rm -f {_SH_EVENTS}
(cat /dev/input/$dev > {_SH_EVENTS} & echo $! > {_SH_EVENTS}.pid)
sleep 0.3
echo "device=$dev"
"""

SH_CLICK_READ = f"""
[ -s {_SH_EVENTS} ] || exit 0
echo "events=$(base64 < {_SH_EVENTS} | tr -d '\\n')"
"""

_EV_ABS, _EV_KEY, _ABS_X, _ABS_Y, _BTN_LEFT = 3, 1, 0, 1, 0x110
_INPUT_EVENT = struct.Struct("<qqHHi")  # struct input_event on x86_64: timeval, type, code, value


def evdev_click(res: ScriptResult, size: tuple[int, int]) -> tuple[int, int] | None:
    """Where the first left-button press happened, in screen pixels, from raw evdev events."""
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("events=")), None)
    if line is None:
        return None
    raw = base64.b64decode(line.removeprefix("events="))
    x = y = None
    for off in range(0, len(raw) - _INPUT_EVENT.size + 1, _INPUT_EVENT.size):
        _, _, etype, code, value = _INPUT_EVENT.unpack_from(raw, off)
        if etype == _EV_ABS and code == _ABS_X:
            x = value
        elif etype == _EV_ABS and code == _ABS_Y:
            y = value
        elif etype == _EV_KEY and code == _BTN_LEFT and value == 1 and x is not None and y is not None:
            w, h = size
            return round(x * (w - 1) / TABLET_MAX), round(y * (h - 1) / TABLET_MAX)
    return None


SH = ShellProbes(
    setting_name=_SH_SETTING,
    user_setting=SH_USER_SETTING,
    read_setting=f'echo "value=$(cat "{_SH_SETTING}")"',
    print_true="echo True",
    print_false="echo False",
    print_env="printf 'phase=%s\\nanswer=%s\\n' \"$GH_CHECK_PHASE\" \"$GH_AGENT_ANSWER\"",
    typing_prepare="rm -f /tmp/gh-selftest-typed",
    typed_line=lambda text: f"echo {text} > /tmp/gh-selftest-typed",
    typing_read="cat /tmp/gh-selftest-typed 2>/dev/null || true",
    click_prepare=SH_CLICK_PREPARE,
    click_read=SH_CLICK_READ + f"kill $(cat {_SH_EVENTS}.pid) 2>/dev/null; true\n",
    click_position=evdev_click,
    signed_in_fix="the guest agent should run scripts as the console's user (root on linux-tiny)",
    elevated_fix="scripts must run as root on a Linux image",
)

# -- bash as the signed-in desktop user (linux-desktop) ---------------------------------------------

_DESKTOP_TYPED = "/tmp/gh-selftest-typed"
_DESKTOP_CLICK = "/tmp/gh-selftest-click"

# A per-user xfconf property, written and read through the session's own xfconfd (its D-Bus).
DESKTOP_USER_SETTING = """
xfconf-query -c xfce4-desktop -p /gh-selftest/probe -n -t string -s "$GH_SELFTEST_NONCE" || exit 1
echo "value=$(xfconf-query -c xfce4-desktop -p /gh-selftest/probe)"
echo "user=$(id -un)"
# The console user: the owner of the graphical session (xfce4-session on the X display).
echo "console_user=$(ps -o user= -p "$(pgrep -o -x xfce4-session)" 2>/dev/null | tr -d ' ')"
if sudo -n true 2>/dev/null; then echo elevated=True; else echo elevated=False; fi
"""


def _desktop_probe(mode: str, out: str) -> str:
    """Start the image's GUI probe (gh-desktop-probe) and return once its window has the focus."""
    return f"""
rm -f {out} {out}.ready
setsid gh-desktop-probe {mode} {out} 1 >/dev/null 2>&1 &
i=0
until [ -e {out}.ready ]; do
  i=$((i + 1)); [ $i -gt 300 ] && {{ echo "the {mode} probe window never got the focus" >&2; exit 1; }}
  sleep 0.2
done
"""


def _desktop_click(res: ScriptResult, size: tuple[int, int]) -> tuple[int, int] | None:
    """"x y button" as X reported the press to the probe window (already in screen pixels)."""
    parts = res.stdout.split()
    if len(parts) < 3 or parts[2] != "1":
        return None
    return int(parts[0]), int(parts[1])


DESKTOP = ShellProbes(
    setting_name="xfconf xfce4-desktop /gh-selftest/probe",
    user_setting=DESKTOP_USER_SETTING,
    read_setting='echo "value=$(xfconf-query -c xfce4-desktop -p /gh-selftest/probe)"',
    print_true="echo True",
    print_false="echo False",
    print_env="printf 'phase=%s\\nanswer=%s\\n' \"$GH_CHECK_PHASE\" \"$GH_AGENT_ANSWER\"",
    typing_prepare=_desktop_probe("entry", _DESKTOP_TYPED),
    typed_line=lambda text: text,
    typing_read=f"cat {_DESKTOP_TYPED} 2>/dev/null || true",
    click_prepare=_desktop_probe("click", _DESKTOP_CLICK),
    click_read=f"cat {_DESKTOP_CLICK} 2>/dev/null || true",
    click_position=_desktop_click,
    signed_in_fix="the manifest's `session.user` must be the user lightdm signs in (rebuild linux-desktop)",
    elevated_fix="the session's user needs sudo without a password (/etc/sudoers.d/gh-user in the image)",
    min_colours=50,
    chord=["ctrl", "alt", "t"],
    chord_seen="xdotool search --onlyvisible --class xfce4-terminal >/dev/null",
    chord_undo="pkill -x xfce4-terminal; true",
)

# -- PowerShell (win10-22h2; never run on a real Windows guest) ------------------------------------

_PS_KEY = r"HKCU:\Software\GuidingHand\Selftest"
_PS_TYPED = r"C:\Windows\Temp\gh-selftest-typed.txt"
_PS_CLICK = r"C:\Windows\Temp\gh-selftest-click.txt"


def _encoded(ps: str) -> str:
    return base64.b64encode(ps.encode("utf-16-le")).decode()


PS_USER_SETTING = f"""
$ErrorActionPreference = 'Stop'
New-Item -Path '{_PS_KEY}' -Force | Out-Null
Set-ItemProperty -Path '{_PS_KEY}' -Name Probe -Value $env:GH_SELFTEST_NONCE
'value=' + (Get-ItemProperty -Path '{_PS_KEY}' -Name Probe).Probe
'user=' + [Security.Principal.WindowsIdentity]::GetCurrent().Name
'console_user=' + (Get-CimInstance -ClassName Win32_ComputerSystem).UserName
# S-1-16-12288 is the High Mandatory Level: the full administrator token, not the filtered one.
'elevated=' + [bool](whoami /groups | Select-String -SimpleMatch 'S-1-16-12288')
"""

# A window in the signed-in session waits for a line; the typed text lands in it (it has the focus).
_PS_READER = f"$t = Read-Host; Set-Content -Path '{_PS_TYPED}' -Value $t"
PS_TYPING_PREPARE = f"""
Remove-Item -Force -ErrorAction SilentlyContinue '{_PS_TYPED}'
Start-GhInteractive -FilePath powershell.exe -ArgumentList '-NoProfile','-EncodedCommand','{_encoded(_PS_READER)}'
$deadline = (Get-Date).AddSeconds(30)
while ((Get-Date) -lt $deadline -and -not (Get-CimInstance Win32_Process -Filter "Name='powershell.exe'" |
        Where-Object {{ $_.SessionId -ne 0 -and $_.CommandLine -like '*{_encoded(_PS_READER)[:16]}*' }})) {{
    Start-Sleep -Milliseconds 200
}}
Start-Sleep -Seconds 1  # the console window takes the focus just after its process starts
"""

_PS_CLICK_WATCH = f"""
Add-Type -AssemblyName System.Windows.Forms
$deadline = (Get-Date).AddSeconds(90)
while ((Get-Date) -lt $deadline) {{
  if ([System.Windows.Forms.Control]::MouseButtons -band [System.Windows.Forms.MouseButtons]::Left) {{
    $p = [System.Windows.Forms.Cursor]::Position
    Set-Content -Path '{_PS_CLICK}' -Value ("x=" + $p.X + "`r`ny=" + $p.Y)
    break
  }}
  Start-Sleep -Milliseconds 5
}}
"""
PS_CLICK_PREPARE = f"""
Remove-Item -Force -ErrorAction SilentlyContinue '{_PS_CLICK}'
Start-GhInteractive -FilePath powershell.exe `
    -ArgumentList '-NoProfile','-WindowStyle','Hidden','-EncodedCommand','{_encoded(_PS_CLICK_WATCH)}'
Start-Sleep -Seconds 2
"""


def _pixel_click(res: ScriptResult, size: tuple[int, int]) -> tuple[int, int] | None:
    vals: dict[str, str] = {}
    for line in res.stdout.splitlines():
        k, sep, v = line.strip().partition("=")
        if sep:
            vals[k] = v
    try:
        return int(vals["x"]), int(vals["y"])
    except (KeyError, ValueError):
        return None


POWERSHELL = ShellProbes(
    setting_name=_PS_KEY + r"\Probe",
    user_setting=PS_USER_SETTING,
    read_setting=f"'value=' + (Get-ItemProperty -Path '{_PS_KEY}' -Name Probe).Probe",
    print_true="Write-Output $true",
    print_false="Write-Output $false",
    print_env="'phase=' + $env:GH_CHECK_PHASE\n'answer=' + $env:GH_AGENT_ANSWER",
    typing_prepare=PS_TYPING_PREPARE,
    typed_line=lambda text: text,
    typing_read=f"if (Test-Path '{_PS_TYPED}') {{ Get-Content -Raw '{_PS_TYPED}' }}",
    click_prepare=PS_CLICK_PREPARE,
    click_read=f"if (Test-Path '{_PS_CLICK}') {{ Get-Content -Raw '{_PS_CLICK}' }}",
    click_position=_pixel_click,
    signed_in_fix="the WinRM account in the image's credentials file must be its auto-logon user",
    elevated_fix="the image build sets LocalAccountTokenFilterPolicy=1 so a remote administrator logon is not "
                 "filtered; rebuild the image with image-builder/build windows-10",
)


def probes_for(shell: str) -> ShellProbes:
    if shell == "sh":
        return SH
    if shell == "bash":
        return DESKTOP
    if shell == "powershell":
        return POWERSHELL
    raise ValueError(f"no selftest probes for shell {shell!r}")


__all__ = ["DESKTOP", "POWERSHELL", "SH", "ShellProbes", "evdev_click", "probes_for"]
