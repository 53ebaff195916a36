"""The libvirt domain an image is made for, from the same MachineSpec the build VM runs: what the
Windows dry-run prints, and the reference for the provider's runtime domain of a Windows image."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from providers.qemu.domain import ISOLATED_NETWORK

from .vm import MachineSpec

HYPERV_FEATURES = {"relaxed": {}, "vapic": {}, "spinlocks": {"retries": "8191"}, "vpindex": {}, "synic": {},
                   "stimer": {}}


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    el = ET.SubElement(parent, tag, attrs)
    if text is not None:
        el.text = text
    return el


def domain_xml(spec: MachineSpec, accel: str = "kvm") -> str:
    dom = ET.Element("domain", type="kvm" if accel == "kvm" else "qemu")
    _sub(dom, "name", f"gh-{spec.name}")
    _sub(dom, "memory", str(spec.memory_mib), unit="MiB")
    _sub(dom, "vcpu", str(spec.vcpus))
    os_el = _sub(dom, "os")
    _sub(os_el, "type", "hvm", arch="x86_64", machine=spec.machine)
    if spec.firmware == "uefi":
        _sub(os_el, "loader", str(spec.ovmf_code), readonly="yes", type="pflash")
    if spec.kernel is not None:
        _sub(os_el, "kernel", str(spec.kernel))
        if spec.initrd is not None:
            _sub(os_el, "initrd", str(spec.initrd))
        _sub(os_el, "cmdline", spec.cmdline)
    else:
        _sub(os_el, "boot", dev="hd")
    features = _sub(dom, "features")
    _sub(features, "acpi")
    _sub(features, "apic")
    if spec.hyperv:
        hv = _sub(features, "hyperv", mode="custom")
        for name, attrs in HYPERV_FEATURES.items():
            _sub(hv, name, state="on", **attrs)
    _sub(dom, "cpu", mode="host-passthrough" if accel == "kvm" else "host-model")
    clock = _sub(dom, "clock", offset="localtime" if spec.hyperv else "utc")
    _sub(clock, "timer", name="rtc", tickpolicy="catchup")
    _sub(clock, "timer", name="pit", tickpolicy="delay")
    _sub(clock, "timer", name="hpet", present="no")
    if spec.hyperv:
        _sub(clock, "timer", name="hypervclock", present="yes")
    _sub(dom, "on_poweroff", "destroy")
    _sub(dom, "on_reboot", "restart")
    dev = _sub(dom, "devices")
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    sata_letters = iter("abcdefghijklmnopqrstuvwxyz")
    for d in spec.drives:
        disk = _sub(dev, "disk", type="file", device=d.media)
        drv = {"name": "qemu", "type": d.format}
        if d.media == "disk":
            drv.update(cache="none", discard="unmap")
        _sub(disk, "driver", **drv)
        _sub(disk, "source", file=str(d.path))
        if d.bus == "virtio":
            _sub(disk, "target", dev=f"vd{next(letters)}", bus="virtio")
        else:
            _sub(disk, "target", dev=f"sd{next(sata_letters)}", bus="sata")
        if d.media == "cdrom":
            _sub(disk, "readonly")
    if spec.tablet == "usb":
        _sub(dev, "controller", type="usb", model="qemu-xhci")
        _sub(dev, "input", type="tablet", bus="usb")
    elif spec.tablet == "virtio":
        _sub(dev, "input", type="tablet", bus="virtio")
    _sub(dev, "input", type="keyboard", bus="ps2")
    video = _sub(dev, "video")
    _sub(video, "model", type=spec.video)
    _sub(dev, "graphics", type="vnc", listen="127.0.0.1", autoport="yes")
    if spec.qga_channel:
        ch = _sub(dev, "channel", type="unix")
        _sub(ch, "target", type="virtio", name="org.qemu.guest_agent.0")
    if spec.network == "isolated":
        iface = _sub(dev, "interface", type="network")
        _sub(iface, "source", network=ISOLATED_NETWORK)  # the provider's network, by the provider's name
        _sub(iface, "model", type="virtio")
    elif spec.network == "user":
        iface = _sub(dev, "interface", type="user")
        _sub(iface, "model", type="virtio")
    _sub(dev, "memballoon", model="none")
    ET.indent(dom)
    return ET.tostring(dom, encoding="unicode")
