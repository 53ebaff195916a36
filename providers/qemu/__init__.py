"""The QEMU/KVM provider on libvirt (see provider.py for the on-disk layout)."""

from providers.qemu.provider import QemuMachine, QemuProvider

__all__ = ["QemuMachine", "QemuProvider"]
