"""Whether the hypervisor answers: the runner pauses (takes no leases) while it does not.

A libvirtd restart takes seconds; a runner that kept accepting leases through it would fail each in
milliseconds, and the server's retries would burn every try of a run. So `HypervisorWatch`
probes the provider (`Provider.probe`) on a timer and whenever the daemon asks (an attempt ended in
error: the likeliest moment to find it gone). On the first failed probe the runner is paused: it
says so once in its log, in `/metrics` (`gh_runner_hypervisor_up` 0) and in its heartbeats (the
server's runners list shows `paused: hypervisor_down`), and it refuses leases with
`LeaseRefusal.HYPERVISOR_DOWN`. While paused it probes with capped exponential backoff (from
`interval_down` up to `cap`), and resumes on the first probe that answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from gh_common.backoff import Backoff
from gh_common.timeouts import within
from gh_runner.log import get_logger
from providers.errors import ProviderError

PROBE_BOUND_S = 30.0  # the provider bounds its own probe; this only catches one that hangs past it


class HypervisorWatch:
    def __init__(
        self,
        probe: Callable[[], Awaitable[None]],
        on_change: Callable[[bool, str | None], None],
        *,
        interval_up: float = 10.0,
        interval_down: float = 1.0,
        cap: float = 30.0,
    ) -> None:
        self._probe = probe
        self._on_change = on_change
        self.interval_up = interval_up
        self._down_backoff = Backoff(base=interval_down, cap=cap)  # probes while paused
        self.up = True
        self.reason: str | None = None
        self.down_since: float | None = None
        self._poke = asyncio.Event()
        self._log = get_logger("gh_runner.hypervisor")

    def poke(self) -> None:
        """Probe now (the next probe does not wait for the timer)."""
        self._poke.set()

    async def probe_once(self) -> bool:
        """Probe, update the state (logging and reporting a change), and return whether it answers."""
        try:
            await within(PROBE_BOUND_S, self._probe())
        except (ProviderError, TimeoutError) as e:
            reason = str(e) or type(e).__name__
            if self.up:
                self.up, self.reason, self.down_since = False, reason, time.monotonic()
                self._log.error("hypervisor unreachable: pausing, no new leases until it answers", reason=reason)
                self._on_change(False, reason)
            return False
        if not self.up:
            down_for = time.monotonic() - (self.down_since or time.monotonic())
            self._log.warning("hypervisor answers again: resuming", down_seconds=round(down_for, 1),
                              probes_failed=self._down_backoff.failures)
            self.up, self.reason, self.down_since = True, None, None
            self._on_change(True, None)
        self._down_backoff.reset()
        return True

    async def run(self) -> None:
        """Probe until cancelled."""
        while True:
            self._poke.clear()
            try:
                await within(self.interval_up if self.up else self._down_backoff.next_delay(), self._poke.wait())
            except TimeoutError:
                pass
            await self.probe_once()
