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


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding `path` (or its nearest
    existing parent: the state dir may not exist before the first lease)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


def lease_refusal(state_dir: Path, reserve_bytes: int) -> Refusal | None:
    """Why a lease must be refused for lack of disk, or None when there is room."""
    try:
        free = free_bytes(state_dir)
    except OSError as e:
        return Refusal(LeaseRefusal.DISK_LOW, f"cannot read the free space under {state_dir}: {e.strerror or e}")
    if free < reserve_bytes:
        return Refusal(LeaseRefusal.DISK_LOW,
                       f"only {free // MIB} MiB free under {state_dir}, below the {reserve_bytes // MIB} MiB the "
                       "runner keeps in reserve (disk_reserve_mib); free space there or lower the reserve")
    return None
