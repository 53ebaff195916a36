"""Who may read a machine's disks: the runner and QEMU, nobody else.

Overlays and saved versions hold whatever the guest wrote, typed secrets included. They are 0640
(saved, immutable: 0440) with QEMU's group, in 0750 directories of that group, so QEMU can open
them whether or not libvirt's dynamic ownership (qemu.conf `dynamic_ownership`, on by default)
is on: with it, libvirt chowns a disk to QEMU's user while the domain runs and gives it back
afterwards (`remember_owner`), keeping the mode, so the runner still reads it through the group.
The directories above them (the state dir, `machines/`, `states/`) are 0711: QEMU can traverse
them, no one else can list them.

A runner that cannot give files QEMU's group (the group is missing, or a non-root runner is not a
member: add it, e.g. `SupplementaryGroups=libvirt-qemu`) falls back to 0600 files in 0711
directories, which QEMU can open only through dynamic ownership; it says so once in the log.
"""

from __future__ import annotations

import functools
import grp
import os
from pathlib import Path

import structlog

log = structlog.get_logger("providers.qemu")

QEMU_GROUPS = ("libvirt-qemu", "qemu")  # Debian/Ubuntu, Fedora/RHEL (qemu.conf `group`)
TRAVERSE_ONLY = 0o711


@functools.cache
def qemu_gid() -> int | None:
    for name in QEMU_GROUPS:
        try:
            return grp.getgrnam(name).gr_gid
        except KeyError:
            continue
    return None


@functools.cache
def _warn_fallback(reason: str) -> None:
    log.warning("machine disks cannot be given QEMU's group: 0600 files, relying on libvirt's dynamic ownership",
                reason=reason, groups=",".join(QEMU_GROUPS))


def _share_with_qemu(path: Path, mode: int, fallback: int) -> int:
    gid = qemu_gid()
    if gid is None:
        _warn_fallback("no such group")
    else:
        try:
            os.chown(path, -1, gid)
            os.chmod(path, mode)
            return mode
        except PermissionError as e:
            _warn_fallback(f"chgrp refused: {e.strerror}")
    os.chmod(path, fallback)
    return fallback


def traverse_only_dir(path: Path) -> None:
    """A directory on the way to the disks: QEMU may pass through, nobody may list it."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, TRAVERSE_ONLY)


def machine_dir(path: Path) -> None:
    """A directory holding disks: 0750 with QEMU's group."""
    path.mkdir(parents=True, exist_ok=True)
    _share_with_qemu(path, 0o750, TRAVERSE_ONLY)


def disk_file(path: Path, *, read_only: bool = False) -> None:
    """A disk or memory image: 0640 (read-only: 0440) with QEMU's group."""
    if read_only:
        _share_with_qemu(path, 0o440, 0o400)
    else:
        _share_with_qemu(path, 0o640, 0o600)
