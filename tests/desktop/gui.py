"""Reading the desktop back from inside the guest: the tests' side of "did the input land"."""

from __future__ import annotations

import asyncio
import time

from providers.qemu import QemuMachine
from providers.qemu.screen import distinct_colours


async def sh(m: QemuMachine, script: str, timeout: float = 60.0) -> str:
    """Run a script as the signed-in user (the image's way); its stdout, or the test fails."""
    res = await m.run_script(script, timeout=timeout)
    assert res.exit_code == 0, f"script failed ({res.exit_code}): {script!r}\n{res.stderr}\n{res.stdout}"
    return res.stdout


async def until(m: QemuMachine, condition: str, timeout: float = 60.0, what: str = "") -> None:
    """Poll a shell condition in the guest until it holds (a deadline, not a sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        res = await m.run_script(condition, timeout=30)
        if res.exit_code == 0:
            return
        assert time.monotonic() < deadline, f"{what or condition} did not happen within {timeout:.0f} s"
        await asyncio.sleep(0.2)


async def start_probe(m: QemuMachine, mode: str, out: str, count: int = 1, timeout: float = 90.0) -> None:
    """gh-desktop-probe (in the image) in `mode`, its window mapped and focused."""
    await sh(m, f"rm -f {out} {out}.ready; setsid gh-desktop-probe {mode} {out} {count} >/dev/null 2>&1 &")
    await until(m, f"test -e {out}.ready", timeout, f"the {mode} probe window getting the focus")


async def mouse_location(m: QemuMachine) -> tuple[int, int]:
    out = await sh(m, "xdotool getmouselocation --shell")
    vals = dict(line.split("=", 1) for line in out.split() if "=" in line)
    return int(vals["X"]), int(vals["Y"])


def colours(png: bytes) -> int:
    """Distinct colours on the screen (a text console has two or three, a desktop hundreds): the
    provider's own count, which decides when a desktop is painted."""
    return distinct_colours(png)
