"""The runner's own disk, measured: free space under the state dir and the size of its filesystem.

What the numbers mean for a lease (refused below the reserve) is decided in `gh_runner.admission`;
this module only reads the filesystem.
"""

from __future__ import annotations

import os
from pathlib import Path

from gh_runner import admission
from gh_runner.admission import MIB, Refusal
from gh_wire.protocol import LeaseRefusal

__all__ = ["MIB", "free_bytes", "lease_refusal", "reserve_bytes", "size_bytes"]


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
    """The reserve the runner keeps free under `path` (`admission.reserve_bytes`)."""
    return admission.reserve_bytes(size_bytes(path), configured_bytes)


def lease_refusal(state_dir: Path, configured_reserve_bytes: int) -> Refusal | None:
    """Why a lease must be refused for lack of disk under the state dir, or None when there is room."""
    try:
        free, size = free_bytes(state_dir), size_bytes(state_dir)
    except OSError as e:
        return Refusal(LeaseRefusal.DISK_LOW, f"cannot read the free space under {state_dir}: {e.strerror or e}")
    return admission.disk_refusal(str(state_dir), free, size, configured_reserve_bytes)
