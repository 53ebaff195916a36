"""What the host must give QEMU's user, and the one plain warning when the hypervisor answers slowly.

`qemu:///system` runs QEMU as `libvirt-qemu`, so what matters is what *that* user may open, not
what root may. The failure this module exists for: on a host without udev `/dev/kvm` can stay
`root:root 0600`. libvirtd probes QEMU's capabilities as root (KVM works), then validates its cache
for libvirt-qemu (KVM does not), finds the cache stale and probes QEMU again on every call; every
create and state call then waits seconds to minutes and attempts fail on timeouts. Doctor names it;
the provider says it once in its log the first time a call is that slow, instead of leaving an
operator to read many attempt errors.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import threading
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import structlog

log = structlog.get_logger("providers.qemu.hostcheck")

QEMU_USER = "libvirt-qemu"
KVM_DEVICE = Path("/dev/kvm")
KVM_DEVICE_FIX = ("chgrp kvm /dev/kvm && chmod 0660 /dev/kvm   # what udev's rule does; "
                  "scripts/setup.sh does it on hosts without udev")


@dataclass(frozen=True)
class UserIds:
    name: str
    uid: int
    gids: frozenset[int]


def user_ids(user: str = QEMU_USER) -> UserIds | None:
    """The uid and every group of `user`, or None when this host has no such user."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return None
    return UserIds(user, pw.pw_uid, frozenset({pw.pw_gid, *os.getgrouplist(user, pw.pw_gid)}))


def may(ids: UserIds, st: os.stat_result, read: bool = False, write: bool = False, execute: bool = False) -> bool:
    """Does the classic owner/group/other mode grant `ids` the asked access? (No ACLs: we set none.)"""
    if ids.uid == 0:
        return True
    if ids.uid == st.st_uid:
        r, w, x = stat.S_IRUSR, stat.S_IWUSR, stat.S_IXUSR
    elif st.st_gid in ids.gids:
        r, w, x = stat.S_IRGRP, stat.S_IWGRP, stat.S_IXGRP
    else:
        r, w, x = stat.S_IROTH, stat.S_IWOTH, stat.S_IXOTH
    mode = st.st_mode
    return (not read or bool(mode & r)) and (not write or bool(mode & w)) and (not execute or bool(mode & x))


def describe_mode(path: Path) -> str:
    """`root:root 0600`, as an operator would compare it with `ls -l`."""
    st = path.stat()
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return f"{owner}:{group} {stat.S_IMODE(st.st_mode):04o}"


def kvm_device_problem(user: str = QEMU_USER, device: Path = KVM_DEVICE) -> str | None:
    """Why `user` cannot open the KVM device read-write, or None when it can (or there is no device).

    No device means TCG only, which is the accelerator probe's business, not a permission problem.
    """
    ids = user_ids(user)
    if ids is None:
        return None  # another distribution's QEMU user: cannot judge, do not cry wolf
    try:
        st = device.stat()
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"{device} cannot be inspected: {e.strerror or e}"
    if may(ids, st, read=True, write=True):
        return None
    return (f"{device} is {describe_mode(device)}: {user} (the user QEMU runs as) cannot open it, so libvirtd "
            "re-probes QEMU's capabilities on every call and machine starts wait tens of seconds")


class SlowCall(StrEnum):
    """Calls whose slowness means the hypervisor itself is unwell, with the bound past which it is."""

    CREATE = "create"  # createXML / restore: QEMU start, bounded by libvirt's own work
    STATE = "state"  # a domain state read: libvirtd answers from memory

    @property
    def bound_s(self) -> float:
        return SLOW_BOUNDS_S[self]


# Past these a call is not merely slow under load: even a loaded 2-core TCG host starts QEMU in a few
# seconds and reads a domain's state in milliseconds.
SLOW_BOUNDS_S = {SlowCall.CREATE: 15.0, SlowCall.STATE: 5.0}


class SlowHypervisorNotice:
    """Logs once per process, plainly, what doctor would say about a hypervisor that answers slowly."""

    def __init__(self, device: Path = KVM_DEVICE) -> None:
        self._lock = threading.Lock()
        self.device = device
        self.said: str | None = None

    def observe(self, kind: SlowCall, what: str, seconds: float, *, timed_out: bool = False) -> None:
        if seconds < kind.bound_s and not timed_out:
            return
        with self._lock:
            if self.said is not None:
                return
            cause = kvm_device_problem(QEMU_USER, self.device)
            advice = (f"the cause here: {cause}; fix: {KVM_DEVICE_FIX}" if cause else
                      "libvirtd is overloaded or re-probing QEMU (see its log); `gh-runner doctor` checks it")
            took = f"did not answer within {seconds:.0f} s" if timed_out else f"took {seconds:.1f} s"
            self.said = (f"the hypervisor answers slowly: {what} {took} "
                         f"(normal: well under {kind.bound_s:.0f} s); {advice}")
        log.warning(self.said)


slow_hypervisor = SlowHypervisorNotice()
