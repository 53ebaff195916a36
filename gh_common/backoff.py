"""The one capped backoff: delays that grow by a factor from a first value up to a cap.

Every retry loop of the project takes its next wait from a `Backoff`: the session's reconnects
(with jitter, so a fleet of runners that lost the same server spreads apart), the hypervisor
watch's probes while libvirt is down, the background retries of a machine destroy, and the polls
of a guest-exec status. One policy, one place to read how a wait grows.

Sans I/O: a `Backoff` never sleeps; the caller awaits what `next_delay()` returns (or passes it to
`within` as a deadline), so an event can cut any wait short.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Capped exponential delays.

    The n-th delay's ceiling (n counted from 0) is `min(cap, base * factor**n)`. Without jitter
    the delay is the ceiling. With `jitter=True` it is "equal jitter": uniform in
    [ceiling/2, ceiling] (half the ceiling is guaranteed, so a retry is never hot; the other half
    spreads peers that failed together apart).
    """

    base: float = 1.0
    cap: float = 60.0
    factor: float = 2.0
    jitter: bool = False
    rng: Callable[[], float] = field(default=random.random)
    failures: int = 0

    def ceiling(self) -> float:
        """The ceiling of the next delay (what `next_delay` returns without jitter)."""
        return min(self.cap, self.base * self.factor ** min(self.failures, 64))

    def next_delay(self) -> float:
        """The next delay, in seconds; each call counts one more failure."""
        c = self.ceiling()
        self.failures += 1
        if not self.jitter:
            return c
        return c / 2 + (c / 2) * self.rng()

    def reset(self) -> None:
        """Back to the first delay (after a success)."""
        self.failures = 0
