"""The runner's own disk: a lease is accepted only while the state dir keeps its reserve free.

Overlays, saved versions, console logs and the journal all live under the state dir. A guest's
writes grow its overlay (each machine's growth is capped by the provider); this check makes sure
a new machine never starts on a disk that is already nearly full, where the journal, which must
be written before a result is sent, would be the first to fail.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gh_wire.protocol import LeaseRefusal

MIB = 1024 * 1024


@dataclass(frozen=True)
class Refusal:
    code: LeaseRefusal
    message: str


RESERVE_SHARE = 0.10  # of the filesystem: the most a reserve may take, so a small state dir still runs


def _existing(path: Path) -> Path:
    """`path` or its nearest existing parent: the state dir may not exist before the first lease."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding `path`."""
    st = os.statvfs(_existing(path))
    return st.f_bavail * st.f_frsize


def size_bytes(path: Path) -> int:
    """The size of the filesystem holding `path`."""
    st = os.statvfs(_existing(path))
    return st.f_blocks * st.f_frsize


def reserve_bytes(path: Path, configured_bytes: int) -> int:
    """The reserve the runner keeps free under `path`: the configured one (`disk_reserve_mib`), at
    most RESERVE_SHARE of the filesystem. A fixed 2 GiB on a 1.5 GiB filesystem would refuse every
    lease for ever, silently; a tenth of it still keeps the journal room to write."""
    return min(configured_bytes, int(size_bytes(path) * RESERVE_SHARE))


def lease_refusal(state_dir: Path, configured_reserve_bytes: int) -> Refusal | None:
    """Why a lease must be refused for lack of disk, or None when there is room."""
    try:
        free = free_bytes(state_dir)
        reserve = reserve_bytes(state_dir, configured_reserve_bytes)
    except OSError as e:
        return Refusal(LeaseRefusal.DISK_LOW, f"cannot read the free space under {state_dir}: {e.strerror or e}")
    if free < reserve:
        scaled = (f" (disk_reserve_mib, scaled down to {RESERVE_SHARE:.0%} of this small filesystem)"
                  if reserve < configured_reserve_bytes else " (disk_reserve_mib)")
        return Refusal(LeaseRefusal.DISK_LOW,
                       f"only {free // MIB} MiB free under {state_dir}, below the {reserve // MIB} MiB the "
                       f"runner keeps in reserve{scaled}; free space there or lower the reserve")
    return None
