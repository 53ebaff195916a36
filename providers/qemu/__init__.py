"""The QEMU/KVM provider on libvirt (see provider.py for its rooms and the on-disk layout)."""

from providers.qemu.machine import QemuMachine
from providers.qemu.provider import QemuProvider

__all__ = ["QemuMachine", "QemuProvider"]
