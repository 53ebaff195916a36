"""Images with a graphical session signed in at boot (manifest `session`, e.g. linux-desktop).

Two things differ from a console image. A script runs as the session's user inside the session's
environment (DISPLAY, DBUS_SESSION_BUS_ADDRESS, XDG_RUNTIME_DIR, HOME, ...), so it reads and changes
that user's own settings (`xfconf-query`, `pactl`) and opens windows the user sees; it elevates with
`sudo`, which needs no password: that pair is what "elevated, as the signed-in user" means on
Windows (docs/desktop-guests.md). And a booted machine is ready only once the session is up (the
manifest's `ready_check` succeeds as the user), not when the guest agent first answers, which is a
minute earlier under TCG.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from providers.base import MachineNotReady
from providers.manifest import ImageManifest
from providers.qemu.guest_agent import GuestAgent, RunAs

INTERPRETERS = {"sh": "/bin/sh", "bash": "/bin/bash"}
SESSION_POLL_S = 1.0
# Booting a desktop to its signed-in session: about a minute under TCG on an idle host, several on a
# loaded one. Used for the warm snapshot's machine; an attempt gives its own boot timeout.
SESSION_BOOT_TIMEOUT_S = 900.0


def run_as_for(manifest: ImageManifest) -> RunAs:
    """Who runs the image's scripts through qemu-ga: root with /bin/sh on a console image; the
    session's user, in the session's environment, on a desktop image."""
    interpreter = INTERPRETERS.get(manifest.shell, "/bin/sh")
    s = manifest.session
    if s is None:
        return RunAs(interpreter=interpreter)
    env = {"HOME": s.home, "USER": s.user, "LOGNAME": s.user, "SHELL": interpreter, **s.env}
    return RunAs(interpreter=interpreter, user=s.user, env=env)


async def wait_session(agent: GuestAgent, manifest: ImageManifest, run_as: RunAs, deadline: float, *,
                       alive: Callable[[], Awaitable[Any]] | None = None) -> float:
    """Poll the session's ready check (as its user) until it succeeds; the seconds it took.

    Raises:
        MachineNotReady: the session was not up by `deadline` (monotonic); the message carries the
            check's last output.
    """
    assert manifest.session is not None
    started = time.monotonic()
    last = ""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise MachineNotReady(
                f"the signed-in session of {manifest.name} was not up in time"
                + (f" (its ready check said: {last[-300:]})" if last else ""))
        res = await agent.run_sh(manifest.session.ready_check, env=None, timeout=max(1.0, min(30.0, left)),
                                 output_cap=4096, run_as=run_as)
        if res.exit_code == 0:
            return time.monotonic() - started
        last = (res.stderr or res.stdout).strip()
        if alive is not None:
            await alive()
        await asyncio.sleep(min(SESSION_POLL_S, max(0.0, deadline - time.monotonic())))


__all__ = ["SESSION_BOOT_TIMEOUT_S", "run_as_for", "wait_session"]
