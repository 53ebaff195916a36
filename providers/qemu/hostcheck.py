"""What the host must give QEMU's user, and the one plain warning when the hypervisor answers slowly.

`kvm_device_access` is the one /dev/kvm check, for whichever user asks (the accelerator decision
for its own process, doctor and the provider for `libvirt-qemu`); it names the user it judged for.

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


class KvmAccessStatus(StrEnum):
    OPENS = "opens"  # the user may open the device read-write
    DENIED = "denied"
    MISSING = "missing"  # no device: no hardware virtualisation, or no kvm module
    NO_SUCH_USER = "no-such-user"  # another distribution's QEMU user: nothing to judge
    UNINSPECTABLE = "uninspectable"  # stat failed (not "missing")


@dataclass(frozen=True)
class KvmAccess:
    """What one named user may do with the KVM device: the one /dev/kvm check, for whoever asks.

    The user matters: root can always open the device, which proves nothing for `libvirt-qemu`,
    the user libvirt's QEMU runs as; and the accelerator decision (providers/qemu/accel.py) runs
    QEMU as this process's own user.
    """

    user: str
    status: KvmAccessStatus
    device: Path = KVM_DEVICE
    mode: str = ""  # `root:kvm 0660`, when the device exists
    error: str = ""  # why it could not be inspected

    @property
    def opens(self) -> bool:
        return self.status is KvmAccessStatus.OPENS

    @property
    def problem(self) -> bool:
        """The device is there and the user cannot use it (a missing device or user is not a permission problem)."""
        return self.status in (KvmAccessStatus.DENIED, KvmAccessStatus.UNINSPECTABLE)

    def __str__(self) -> str:
        who = f"{self.user} (the user QEMU runs as)" if self.user == QEMU_USER else self.user
        match self.status:
            case KvmAccessStatus.OPENS:
                said = f"{self.device} is {self.mode}: {who} can open it"
                if self.user == "root":
                    said += f" (root always can: that proves nothing for {QEMU_USER})"
                return said
            case KvmAccessStatus.DENIED:
                said = f"{self.device} is {self.mode}: {who} cannot open it"
                if self.user == QEMU_USER:
                    said += (", so libvirtd re-probes QEMU's capabilities on every call and machine starts wait "
                             "tens of seconds")
                return said
            case KvmAccessStatus.MISSING:
                return f"{self.device} does not exist (no hardware virtualisation, or the kvm module is not loaded)"
            case KvmAccessStatus.NO_SUCH_USER:
                return f"this host has no user {self.user}: {self.device} not judged for it"
            case KvmAccessStatus.UNINSPECTABLE:
                return f"{self.device} cannot be inspected: {self.error}"


def kvm_device_access(user: str | None = QEMU_USER, device: Path = KVM_DEVICE) -> KvmAccess:
    """May `user` open the KVM device read-write? `None` asks for this process itself.

    For this process the kernel answers (`os.access`: its real groups, ACLs, a group joined
    after it started does not count); for another user the device's owner, group and mode do.
    """
    name = pwd.getpwuid(os.geteuid()).pw_name if user is None else user
    try:
        st = device.stat()
    except FileNotFoundError:
        return KvmAccess(name, KvmAccessStatus.MISSING, device)
    except OSError as e:
        return KvmAccess(name, KvmAccessStatus.UNINSPECTABLE, device, error=str(e.strerror or e))
    mode = describe_mode(device)
    if user is None:
        opens = os.access(device, os.R_OK | os.W_OK)
    else:
        ids = user_ids(user)
        if ids is None:
            return KvmAccess(name, KvmAccessStatus.NO_SUCH_USER, device, mode)
        opens = may(ids, st, read=True, write=True)
    return KvmAccess(name, KvmAccessStatus.OPENS if opens else KvmAccessStatus.DENIED, device, mode)


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
            access = kvm_device_access(QEMU_USER, self.device)
            advice = (f"the cause here: {access}; fix: {KVM_DEVICE_FIX}" if access.problem else
                      "libvirtd is overloaded or re-probing QEMU (see its log); `gh-runner doctor` checks it")
            took = f"did not answer within {seconds:.0f} s" if timed_out else f"took {seconds:.1f} s"
            self.said = (f"the hypervisor answers slowly: {what} {took} "
                         f"(normal: well under {kind.bound_s:.0f} s); {advice}")
        log.warning(self.said)


slow_hypervisor = SlowHypervisorNotice()
