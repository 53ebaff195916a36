"""Matching (pure): which connected runner takes a queued attempt, and whom not to ask again for a while.

No database and no clock of its own: `lease.lease_pass` feeds it the runners' capabilities read from
the rows, and the scheduler's `RefusalList` what the runners refused (by `LeaseRefusal` code).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gh_wire.protocol import LeaseRefusal

REFUSAL_BACKOFF_S = 30.0  # a refusal without a code, or one whose cause passes by itself
SHORT_BACKOFF_S = 5.0  # the runner was only busy: a slot frees soon, or a result is being re-sent
LONG_BACKOFF_S = 300.0  # the runner lacks what the attempt needs: it will not have it again soon
UNWELL_BACKOFF_S = 60.0  # the runner itself is unwell: no attempt goes to it meanwhile
# A retry after an error of ours waits this long, by the attempts its try has had (1, 2): a fault that
# passes by itself (libvirtd restarting) must not burn the try's retries within milliseconds. The
# runner the error came from waits PREFER_OTHER_FACTOR times as long, so another runner comes first.
# gh-server's `retry_backoff_seconds` setting replaces the default.
RETRY_BACKOFF_S: tuple[float, ...] = (5.0, 20.0)
PREFER_OTHER_FACTOR = 2.0

# How long a refusal leaves that runner alone for that attempt (or, `UNWELL`, for every attempt).
BACKOFF_S: dict[LeaseRefusal, float] = {
    LeaseRefusal.DUPLICATE: SHORT_BACKOFF_S,
    LeaseRefusal.NO_SLOT: SHORT_BACKOFF_S,
    LeaseRefusal.IMAGE_MISSING: LONG_BACKOFF_S,
    LeaseRefusal.VERSION_MISSING: LONG_BACKOFF_S,
    LeaseRefusal.LABEL_MISMATCH: LONG_BACKOFF_S,
    LeaseRefusal.INVALID_LEASE: LONG_BACKOFF_S,
    LeaseRefusal.DRAINING: REFUSAL_BACKOFF_S,
    LeaseRefusal.START_FAILED: REFUSAL_BACKOFF_S,
    LeaseRefusal.DISK_LOW: UNWELL_BACKOFF_S,
    LeaseRefusal.HYPERVISOR_DOWN: UNWELL_BACKOFF_S,
    LeaseRefusal.JOURNAL_FAILED: UNWELL_BACKOFF_S,
    # The registry is down (or answers 5xx, or times out): the version's holders run it meanwhile.
    LeaseRefusal.REGISTRY_UNAVAILABLE: REFUSAL_BACKOFF_S,
    # What the registry holds for it does not verify: it will not mend by itself.
    LeaseRefusal.REGISTRY_INVALID: LONG_BACKOFF_S,
}
UNWELL: frozenset[LeaseRefusal] = frozenset(
    {LeaseRefusal.DISK_LOW, LeaseRefusal.HYPERVISOR_DOWN, LeaseRefusal.JOURNAL_FAILED}
)


@dataclass
class RunnerCaps:
    """What a connected runner can take right now."""

    runner_id: str
    name: str
    labels: frozenset[str]
    images: frozenset[str]
    held: frozenset[tuple[str, int]]
    free: int
    hot: frozenset[tuple[str, ...]] = frozenset()  # sources in the runner's hot pool (see source_key)
    registry: str | None = None  # the OCI registry it pulls start states from ("host[:port]/prefix")
    scores: bool = False  # its hello said `scores`: it reads a check's decimal last line as a score


@dataclass(frozen=True)
class Candidate:
    attempt_id: str
    runs_on: str
    start_state: dict[str, Any]
    required_runner_id: str | None
    scored: bool = False  # the case may score between 0 and 1 (lease.needs_scores): a runner must read scores


def runner_can_run(c: Candidate, r: RunnerCaps) -> bool:
    """The label, the start state and scores, regardless of free slots."""
    if c.required_runner_id is not None and c.required_runner_id != r.runner_id:
        return False
    if c.scored and not r.scores:
        # An older runner reads a check's `0.5` as the case's error: the try would be lost to garbage.
        return False
    if c.runs_on == "vm":
        # `vm` is "any virtual machine": a runner that advertises images has a hypervisor.
        if not r.images:
            return False
    elif c.runs_on not in r.labels:
        return False
    ss = c.start_state or {}
    if ss.get("kind") == "state":
        if holds(c, r):
            return True
        # Published to a registry (docs/start-states.md): any runner pulling from that registry that has the base
        # image can take it; it pulls the version before it accepts (or refuses, typed, and it goes on).
        return ss.get("registry") is not None and ss.get("registry") == r.registry and ss.get("image") in r.images
    return ss.get("image") in r.images


def registry_of(registry_ref: str | None) -> str | None:
    """"host[:port]/prefix" of a pushed version's reference "host[:port]/prefix/states@sha256:..."."""
    if not registry_ref or "/states@" not in registry_ref:
        return None
    return registry_ref.rsplit("/states@", 1)[0]


def holds(c: Candidate, r: RunnerCaps) -> bool:
    ss = c.start_state or {}
    return ss.get("kind") == "state" and (str(ss.get("start_state_id")), int(ss.get("version") or 0)) in r.held


def source_key(start_state: dict[str, Any]) -> tuple[str, ...]:
    if start_state.get("kind") == "state":
        return ("state", str(start_state.get("start_state_id")), str(int(start_state.get("version") or 0)))
    return ("image", str(start_state.get("image")))


def pick_runner(c: Candidate, runners: Sequence[RunnerCaps], skip: Callable[[str, str], bool]) -> RunnerCaps | None:
    """The matching runner that pools the lease's source (a hot machine: ready in milliseconds,
    not seconds), then one that holds it (a registry version: no pull), then the one with the most free
    slots (spreads load), skipping recent refusers."""
    key = source_key(c.start_state or {})
    best: RunnerCaps | None = None
    best_rank: tuple[bool, bool, int] | None = None
    for r in runners:
        rank = (key in r.hot, holds(c, r), r.free)
        if r.free <= 0 or (best_rank is not None and rank <= best_rank):
            continue
        if runner_can_run(c, r) and not skip(c.attempt_id, r.runner_id):
            best, best_rank = r, rank
    return best


class RefusalList:
    """Whom not to offer an attempt again for a while after a `lease_refuse`, by its code (`BACKOFF_S`):
    an (attempt, runner) pair, or a whole runner when the code says the runner itself is unwell."""

    def __init__(self, backoff: float = REFUSAL_BACKOFF_S, clock: Callable[[], float] = time.monotonic,
                 retry_backoff: tuple[float, ...] = RETRY_BACKOFF_S) -> None:
        self._backoff = backoff  # for a refusal without a code
        self._retry_backoff = retry_backoff or RETRY_BACKOFF_S
        self._clock = clock
        self._until: dict[tuple[str, str], float] = {}
        self._runner_until: dict[str, float] = {}
        self._attempt_until: dict[str, float] = {}  # retries held back on every runner
        # A retry is held from the database thread (in the job that queues it, gh_server/attempts/intake.py),
        # and read there by the lease pass; pruned on the server's loop.
        self._lock = threading.Lock()

    def add(self, attempt_id: str, runner_id: str, code: LeaseRefusal | None = None) -> None:
        with self._lock:
            self._add(attempt_id, runner_id, code)

    def _add(self, attempt_id: str, runner_id: str, code: LeaseRefusal | None) -> None:
        until = self._clock() + (self._backoff if code is None else BACKOFF_S[code])
        if code in UNWELL:
            self._runner_until[runner_id] = max(until, self._runner_until.get(runner_id, 0.0))
        self._until[(attempt_id, runner_id)] = until
        if len(self._until) > 10_000:
            self._prune()

    def hold_retry(self, retry_id: str, after_runner_id: str, attempts_so_far: int) -> None:
        """Hold a retry back (`RETRY_BACKOFF_S`), longer on the runner whose error made it."""
        delay = self._retry_backoff[min(max(attempts_so_far, 1), len(self._retry_backoff)) - 1]
        with self._lock:
            now = self._clock()
            self._attempt_until[retry_id] = now + delay
            self._until[(retry_id, after_runner_id)] = now + delay * PREFER_OTHER_FACTOR

    def prune(self) -> None:
        with self._lock:
            self._prune()

    def _prune(self) -> None:
        now = self._clock()
        for k in [k for k, t in self._until.items() if t <= now]:
            del self._until[k]
        for a in [a for a, t in self._attempt_until.items() if t <= now]:
            del self._attempt_until[a]
        for r in [r for r, t in self._runner_until.items() if t <= now]:
            del self._runner_until[r]

    def __call__(self, attempt_id: str, runner_id: str) -> bool:
        with self._lock:
            return self._skips(attempt_id, runner_id)

    def _skips(self, attempt_id: str, runner_id: str) -> bool:
        now = self._clock()
        t = self._until.get((attempt_id, runner_id))
        if t is not None and t > now:
            return True
        t = self._attempt_until.get(attempt_id)
        if t is not None and t > now:
            return True
        t = self._runner_until.get(runner_id)
        return t is not None and t > now
