"""Which guest channel does what for an image: a small table read from its manifest.

Two channels exist and they are not interchangeable:
- WinRM runs PowerShell as the auto-logon user over a network logon: that user's full admin token
  and its own HKCU, which is what every setup and check of the product documentation touches.
- qemu-ga runs as SYSTEM on Windows (root on Linux) and talks over a virtio serial port, so it
  works before the guest has an address and needs no password. It does what only it can: set the
  clock after a restore, freeze file systems, shut down, set an account's password.

So a script goes to the channel that runs the image's shell as the signed-in user (WinRM for
PowerShell, qemu-ga for sh and bash: on an image with a desktop session qemu-ga starts the script
as the session's user, in its environment, see providers/qemu/desktop.py), and qemu-ga keeps its
own duties even when WinRM is present. The
provider builds `Routes` when it loads an image and refuses an image whose routes are incomplete,
so nothing is advertised that cannot run a script.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from providers.manifest import ImageManifest, ManifestError


class Channel(StrEnum):
    QEMU_GA = "qemu-ga"
    WINRM = "winrm"
    EXECD = "gh-execd"  # no duty of its own: it takes qemu-ga's root sh scripts where it can (execd.py)


class Duty(StrEnum):
    SCRIPT = "script"  # a script in the image's shell, as the signed-in user
    CLOCK = "clock"  # set the guest clock after a memory restore
    FREEZE = "freeze"  # quiesce file systems before a disk copy
    SHUTDOWN = "shutdown"
    PASSWORD = "password"  # set an account's password before any logon uses it


# Who can do each duty, best first. SCRIPT depends on the shell: qemu-ga could start powershell.exe,
# but as SYSTEM, with SYSTEM's HKCU: a check on HKCU would read the wrong hive.
SCRIPT_CHANNELS: Mapping[str, tuple[Channel, ...]] = MappingProxyType({
    "powershell": (Channel.WINRM,),
    "sh": (Channel.QEMU_GA,),
    "bash": (Channel.QEMU_GA,),  # linux-desktop: as the session's user (manifest `session`)
})
AGENT_DUTIES: Mapping[Duty, tuple[Channel, ...]] = MappingProxyType({
    Duty.CLOCK: (Channel.QEMU_GA,),
    Duty.FREEZE: (Channel.QEMU_GA,),
    Duty.SHUTDOWN: (Channel.QEMU_GA,),
    Duty.PASSWORD: (Channel.QEMU_GA,),
})


class UnroutableImage(ManifestError):
    """An image whose manifest names no channel for a duty the provider cannot do without."""


@dataclass(frozen=True)
class Routes:
    image: str
    table: Mapping[Duty, Channel]  # only the duties some listed channel can do
    execd: bool = False  # qemu-ga's scripts go to the image's resident executor first

    def channel(self, duty: Duty) -> Channel | None:
        return self.table.get(duty)

    @property
    def script(self) -> Channel:
        return self.table[Duty.SCRIPT]

    @property
    def per_machine_password(self) -> bool:
        """Whether each machine gets its own account password before its scripts run: only where
        scripts log on with a password (WinRM); qemu-ga scripts need none."""
        return self.script is Channel.WINRM

    @property
    def ready_order(self) -> tuple[Channel, ...]:
        """The channels a new machine must have answering, in the order they are waited for:
        qemu-ga first where it must set the password that the WinRM logon then uses."""
        first = (Channel.QEMU_GA,) if self.per_machine_password else ()
        return first + tuple(c for c in (self.script,) if c not in first)


def routes_for(manifest: ImageManifest) -> Routes:
    """The routing table for this image.

    Raises:
        UnroutableImage: no listed channel runs the image's shell, or a WinRM image lacks qemu-ga
            (its machines could not get their own password, so they would share the image's).
    """
    listed = set(manifest.guest_channels)
    table: dict[Duty, Channel] = {}
    for duty, candidates in ((Duty.SCRIPT, SCRIPT_CHANNELS.get(manifest.shell, ())), *AGENT_DUTIES.items()):
        for ch in candidates:
            if ch in listed:
                table[duty] = ch
                break
    have = ", ".join(manifest.guest_channels)
    if Duty.SCRIPT not in table:
        need = " or ".join(SCRIPT_CHANNELS.get(manifest.shell, ())) or "(none known)"
        raise UnroutableImage(
            f"image {manifest.name!r}: no guest channel runs its {manifest.shell} scripts as the signed-in user "
            f"(needs {need}; guest_channels lists {have}); rebuild it with image-builder/build")
    routes = Routes(image=manifest.name, table=MappingProxyType(table),
                    execd=Channel.EXECD in listed and table[Duty.SCRIPT] is Channel.QEMU_GA)
    if routes.per_machine_password and Duty.PASSWORD not in table:
        raise UnroutableImage(
            f"image {manifest.name!r}: its WinRM account needs a per-machine password, which only qemu-ga can "
            f"set (guest_channels lists {have}); rebuild it with image-builder/build, which installs qemu-ga")
    return routes


__all__ = ["AGENT_DUTIES", "SCRIPT_CHANNELS", "Channel", "Duty", "Routes", "UnroutableImage", "routes_for"]
