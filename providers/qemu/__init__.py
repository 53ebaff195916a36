"""The QEMU/KVM provider on libvirt."""
