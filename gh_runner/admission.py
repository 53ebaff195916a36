"""Admission: whether this runner takes a lease or a start-state job now, and what holds its slots.

Pure: every decision is a function of a `RunnerState` snapshot (and, for the disk, of the numbers
`gh_runner.diskguard` measured), so it is tested without a daemon, a provider or a disk, and it
reads the way the server's own matching (gh_server/attempts/matching.py) does. The daemon measures
and acts; this module only decides. Its imports are kept to pure modules (tests/test_layers.py).

A slot is held by one of three things (`SlotHolder`): an attempt (from its accept until its result
is journaled), a pull of a start-state version the attempt needs (from the lease until the accept
or the refusal), and a slot-holding start-state job (a build while it runs, an open machine until
its save or close). `Slots` is the one count of them.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection
from dataclasses import dataclass

from gh_wire.protocol import Job, Lease, LeaseRefusal

MIB = 1024 * 1024
# Of the state dir's filesystem: the most the disk reserve may take, so a small state dir still runs.
RESERVE_SHARE = 0.10
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


class SlotHolder(enum.StrEnum):
    ATTEMPT = "attempt"
    PULL = "pull"  # the pull of a start-state version, before the lease is accepted
    JOB = "job"


class Slots:
    """Who holds this runner's slots: one key per holder (an attempt id, a job's slot key)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._held: dict[str, SlotHolder] = {}

    @property
    def busy(self) -> int:
        return len(self._held)

    @property
    def free(self) -> int:
        return max(0, self.total - self.busy)

    def holds(self, key: str, holder: SlotHolder | None = None) -> bool:
        got = self._held.get(key)
        return got is not None and (holder is None or got is holder)

    def take(self, key: str, holder: SlotHolder) -> None:
        """`key` holds a slot as `holder` (a pull that becomes its attempt keeps the one slot)."""
        self._held[key] = holder

    def release(self, key: str) -> bool:
        """Free `key`'s slot; False when it held none."""
        return self._held.pop(key, None) is not None

    def keys(self, holder: SlotHolder) -> list[str]:
        return sorted(k for k, h in self._held.items() if h is holder)


@dataclass(frozen=True)
class Refusal:
    code: LeaseRefusal
    message: str


@dataclass(frozen=True)
class RunnerState:
    """What admission looks at, taken by the daemon at the moment a lease or a job arrives."""

    draining: bool
    hypervisor_up: bool
    hypervisor_reason: str | None
    busy: int
    slots: int
    labels: Collection[str]
    images: Collection[str]  # image names this runner has
    held: Collection[tuple[str, int]]  # (start_state_id, version) held here
    can_pull: bool  # a registry is configured: a version not held can be pulled


def is_safe_id(attempt_id: str) -> bool:
    """Attempt ids name files and libvirt domains: letters, digits and `_.-`, at most 128."""
    return bool(SAFE_ID.match(attempt_id)) and ".." not in attempt_id


def lease_refusal(lease: Lease, state: RunnerState) -> Refusal | None:
    """Why this runner cannot take `lease` now (the code the server acts on, the text for people)."""
    if state.draining:
        return Refusal(LeaseRefusal.DRAINING, "draining: the runner is shutting down and takes no new leases")
    if not is_safe_id(lease.attempt_id):
        return Refusal(LeaseRefusal.INVALID_LEASE,
                       "attempt id must be 1-128 letters, digits, '_', '.', '-' (it names files and machines)")
    if not state.hypervisor_up:
        return Refusal(LeaseRefusal.HYPERVISOR_DOWN, f"the hypervisor does not answer ({state.hypervisor_reason}); "
                       "the runner is paused until it does")
    if state.busy >= state.slots:
        return Refusal(LeaseRefusal.NO_SLOT, f"no free slot: {state.busy} of {state.slots} busy")
    # `vm` asks for any virtual machine; any other value must be one of our labels.
    if lease.case.runs_on != "vm" and lease.case.runs_on not in state.labels:
        labels = ", ".join(state.labels) or "none"
        return Refusal(LeaseRefusal.LABEL_MISMATCH, f"runs_on {lease.case.runs_on!r} is not a label of this runner "
                       f"(labels: {labels}; 'vm' always fits)")
    ref = lease.start_state
    have = ", ".join(sorted(state.images)) or "none"
    if ref.kind == "image":
        if ref.image not in state.images:
            return Refusal(LeaseRefusal.IMAGE_MISSING, f"image {ref.image!r} is not on this runner (it has: {have})")
    elif (ref.start_state_id, ref.version) not in state.held:
        if not state.can_pull:
            return Refusal(LeaseRefusal.VERSION_MISSING,
                           f"start state {ref.start_state_id} version {ref.version} is not held by this runner")
        if ref.image not in state.images:  # a pulled version runs over its image
            return Refusal(LeaseRefusal.IMAGE_MISSING, f"image {ref.image!r} (under start state "
                           f"{ref.start_state_id}) is not on this runner (it has: {have})")
    return None


def needs_pull(lease: Lease, can_pull: bool) -> bool:
    """Whether the lease's version goes through the library (pulled when not held) before the accept."""
    return can_pull and lease.start_state.kind == "state"


def reserve_bytes(filesystem_bytes: int, configured_bytes: int) -> int:
    """The reserve the runner keeps free: the configured one (`disk_reserve_mib`), at most
    RESERVE_SHARE of the filesystem. A fixed 2 GiB on a 1.5 GiB filesystem would refuse every
    lease for ever, silently; a tenth of it still keeps the journal room to write."""
    return min(configured_bytes, int(filesystem_bytes * RESERVE_SHARE))


def disk_refusal(where: str, free_bytes: int, filesystem_bytes: int, configured_bytes: int) -> Refusal | None:
    """Why a lease must be refused for lack of disk under `where` (the state dir), or None.

    Overlays, saved versions, console logs and the journal all live under the state dir; a new
    machine never starts on a disk already nearly full, where the journal, which must be written
    before a result is sent, would be the first to fail."""
    reserve = reserve_bytes(filesystem_bytes, configured_bytes)
    if free_bytes >= reserve:
        return None
    scaled = (f" (disk_reserve_mib, scaled down to {RESERVE_SHARE:.0%} of this small filesystem)"
              if reserve < configured_bytes else " (disk_reserve_mib)")
    return Refusal(LeaseRefusal.DISK_LOW,
                   f"only {free_bytes // MIB} MiB free under {where}, below the {reserve // MIB} MiB the "
                   f"runner keeps in reserve{scaled}; free space there or lower the reserve")


def job_refusal(job: Job, holds_slot: bool, state: RunnerState) -> str | None:
    """Why a start-state job cannot start now. Jobs that hold no slot (save, close, delete) only wait
    for a drain; `open` and `build` need a free slot like a lease."""
    if state.draining:
        return "draining: the runner is shutting down"
    if holds_slot and state.busy >= state.slots:
        return f"no free slot: {state.busy} of {state.slots} busy"
    return None
