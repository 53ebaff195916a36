"""Domain names, ownership metadata and the libvirt domain XML for a machine."""

from __future__ import annotations

import hashlib
import re
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from providers.manifest import DirectKernelBoot, ImageManifest
from providers.qemu.network import ISOLATED_NETWORK

METADATA_NS = "https://gh-runner.dev/xmlns/machine/1"
METADATA_PREFIX = "gh"
GUEST_AGENT_CHANNEL = "org.qemu.guest_agent.0"
EXECD_CHANNEL = "org.ghrunner.exec.0"  # gh-execd.c and execd.PORT_NAME
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def safe_part(text: str) -> str:
    """libvirt-safe form of a runner name or machine id; a hash suffix keeps distinct ids distinct."""
    cleaned = _SAFE.sub("-", text).strip("-.") or "x"
    if cleaned != text or len(cleaned) > 40:
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        cleaned = f"{cleaned[:31]}-{digest}"
    return cleaned


def domain_name(runner_name: str, machine_id: str) -> str:
    return f"gh-{safe_part(runner_name)}-{safe_part(machine_id)}"


def domain_prefix(runner_name: str) -> str:
    return f"gh-{safe_part(runner_name)}-"


@dataclass(frozen=True)
class Ownership:
    """What a domain's metadata says about who made it (used by the reaper after a crash)."""

    runner: str
    machine_id: str
    machine_dir: str


def ownership_xml(own: Ownership) -> str:
    root = ET.Element("owner")
    ET.SubElement(root, "runner").text = own.runner
    ET.SubElement(root, "machine").text = own.machine_id
    ET.SubElement(root, "dir").text = own.machine_dir
    return ET.tostring(root, encoding="unicode")


def parse_ownership(text: str | None) -> Ownership | None:
    """Parse the metadata element libvirt hands back (namespace stripped or not)."""
    if not text:
        return None
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return None

    def find(tag: str) -> str:
        for el in root.iter():
            if el.tag.split("}")[-1] == tag:
                return el.text or ""
        return ""

    runner, machine = find("runner"), find("machine")
    if not runner or not machine:
        return None
    return Ownership(runner=runner, machine_id=machine, machine_dir=find("dir"))


@dataclass(frozen=True)
class DomainSpec:
    name: str
    manifest: ImageManifest
    image_dir: Path
    overlay: Path
    console_log: Path
    ownership: Ownership
    accelerator: str  # "kvm" | "tcg"
    genid: bool = True  # a VM generation ID device (off only for bench/warm_start.py side by side)


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    el = ET.SubElement(parent, tag, attrs)
    if text is not None:
        el.text = text
    return el


def build_domain_xml(spec: DomainSpec) -> str:
    m = spec.manifest
    ET.register_namespace(METADATA_PREFIX, METADATA_NS)
    dom = ET.Element("domain", type="kvm" if spec.accelerator == "kvm" else "qemu")
    _sub(dom, "name", spec.name)
    _sub(dom, "uuid", str(uuid.uuid4()))
    if spec.genid:
        # QEMU's vmgenid device, its GUID left to libvirt: a new one at every start and restore
        # (the device's load writes it into the guest's memory and notifies the guest), so a kernel
        # with the vmgenid driver (Linux >= 5.18 with CONFIG_VMGENID, Windows) reseeds its RNG
        # when it runs as a copy of a memory image. linux-tiny's kernel has no such driver: its
        # first script after a restore reseeds instead (guest_agent.reseed_arg).
        _sub(dom, "genid")
    _sub(dom, "metadata").append(_owner_element(spec.ownership))
    _sub(dom, "memory", str(m.memory_mib), unit="MiB")
    _sub(dom, "vcpu", str(m.vcpus))
    os_el = _sub(dom, "os")
    _sub(os_el, "type", "hvm", arch="x86_64", machine=m.machine)
    if isinstance(m.boot, DirectKernelBoot):
        _sub(os_el, "kernel", str(spec.image_dir / m.boot.kernel))
        _sub(os_el, "initrd", str(spec.image_dir / m.boot.initrd))
        _sub(os_el, "cmdline", m.boot.cmdline)
    else:
        if m.boot.kind == "uefi":
            os_el.set("firmware", "efi")
        _sub(os_el, "boot", dev="hd")
    feats = _sub(dom, "features")
    _sub(feats, "acpi")
    _sub(feats, "apic")
    if m.hyperv:
        hv = _sub(feats, "hyperv", mode="custom")
        for f in ("relaxed", "vapic"):
            _sub(hv, f, state="on")
        _sub(hv, "spinlocks", state="on", retries="8191")
    if spec.accelerator == "kvm":
        _sub(dom, "cpu", mode="host-passthrough")
    clock = _sub(dom, "clock", offset="localtime" if m.os == "windows" else "utc")
    _sub(clock, "timer", name="rtc", tickpolicy="catchup")
    _sub(dom, "on_poweroff", "destroy")
    _sub(dom, "on_reboot", "restart")
    _sub(dom, "on_crash", "destroy")
    dev = _sub(dom, "devices")
    disk = _sub(dev, "disk", type="file", device="disk")
    _sub(disk, "driver", name="qemu", type="qcow2", discard="unmap", cache="writeback")
    _sub(disk, "source", file=str(spec.overlay))
    _sub(disk, "target", dev="vda" if m.os == "linux" else "sda", bus="virtio" if m.os == "linux" else "sata")
    if "qemu-ga" in m.guest_channels:
        ch = _sub(dev, "channel", type="unix")
        _sub(ch, "target", type="virtio", name=GUEST_AGENT_CHANNEL)
    if "gh-execd" in m.guest_channels:
        # libvirt names the socket (a path under its own dir, per domain); execd.port_path reads it back
        ch = _sub(dev, "channel", type="unix")
        _sub(ch, "target", type="virtio", name=EXECD_CHANNEL)
    if m.network == "isolated":
        iface = _sub(dev, "interface", type="network")
        _sub(iface, "source", network=ISOLATED_NETWORK)
        _sub(iface, "model", type="virtio" if m.os == "linux" else "e1000e")
        _sub(iface, "filterref", filter="clean-traffic")
        _sub(iface, "port", isolated="yes")  # no guest-to-guest traffic on the bridge (providers/qemu/network.py)
    # Absolute pointer: QMP input-send-event abs moves reach the guest only through a tablet, on
    # the bus the image has a driver for (a kernel without USB gets a virtio tablet, and no USB).
    tablet_bus = getattr(m, "tablet", "usb")
    if tablet_bus == "usb":
        _sub(dev, "controller", type="usb", model="qemu-xhci")
    else:
        _sub(dev, "controller", type="usb", model="none")
    _sub(dev, "input", type="tablet", bus=tablet_bus)
    _sub(dev, "input", type="keyboard", bus="ps2")
    serial = _sub(dev, "serial", type="file")
    _sub(serial, "source", path=str(spec.console_log))
    _sub(serial, "target", port="0")
    video = _sub(dev, "video")
    _sub(video, "model", type=m.video, heads="1", primary="yes")
    add_display(dev)
    _sub(dev, "memballoon", model="none")
    rng = _sub(dev, "rng", model="virtio")
    _sub(rng, "backend", "/dev/urandom", model="random")
    return ET.tostring(dom, encoding="unicode")


def rewrite_saved_xml(xml: str, *, name: str, overlay: Path, console_log: Path, ownership: Ownership,
                      image_dir: Path | None = None) -> str:
    """The XML stored in a memory image, made to fit a new machine: new name, UUID, disk, owner, and
    (with `image_dir`) the direct-boot kernel and initrd read from this runner's copy of the image,
    which may live elsewhere than on the runner that saved it (a version pulled from a registry).

    Everything else (devices, machine type, memory) must stay exactly as saved, or QEMU refuses
    the incoming memory stream; the one device added is the display (`add_display`), which is not
    part of that stream.
    """
    ET.register_namespace(METADATA_PREFIX, METADATA_NS)
    root = ET.fromstring(xml)
    _set_text(root, "name", name)
    _set_text(root, "uuid", str(uuid.uuid4()))
    disks = [d for d in root.iter("disk") if d.get("device") == "disk"]
    if len(disks) != 1:
        raise ValueError(f"saved machine has {len(disks)} disks, expected 1")
    src = disks[0].find("source")
    if src is None:
        raise ValueError("saved machine's disk has no source")
    for attr in list(src.attrib):
        if attr not in ("file", "index"):
            del src.attrib[attr]
    src.set("file", str(overlay))
    for child in list(src):
        src.remove(child)
    for bs in disks[0].findall("backingStore"):
        disks[0].remove(bs)
    os_el = root.find("os")
    if image_dir is not None and os_el is not None:
        for tag in ("kernel", "initrd"):
            el = os_el.find(tag)
            if el is not None and el.text:
                el.text = str(image_dir / Path(el.text).name)
    for serial in root.iter("serial"):
        s = serial.find("source")
        if serial.get("type") == "file" and s is not None:
            s.set("path", str(console_log))
    devices = root.find("devices")
    if devices is not None:
        add_display(devices)  # a version saved before machines had one gets it too (docs/protocol.md)
    meta = root.find("metadata")
    if meta is None:
        meta = ET.SubElement(root, "metadata")
    for child in list(meta):
        if child.tag.startswith("{" + METADATA_NS + "}"):
            meta.remove(child)
    meta.append(_owner_element(ownership))
    return ET.tostring(root, encoding="unicode")


def add_display(devices: ET.Element) -> None:
    """QEMU's VNC server with no listener at all (`<listen type='none'/>`): nothing on a TCP port
    and nothing on the file system. The only way in is a socket libvirt hands its caller
    (virDomainOpenGraphicsFD, `QemuMachine.open_screen_stream`), which on qemu:///system takes
    libvirt's read-write connection. Screenshots and the agent's input still go through the monitor.

    Not part of the machine's ABI: QEMU takes a memory image saved without it (checked on libvirt
    9.0 / QEMU 7.2), so a version saved before this is restored with it added. Idempotent."""
    if any(g.get("type") == "vnc" for g in devices.findall("graphics")):
        return
    graphics = ET.Element("graphics", type="vnc")
    _sub(graphics, "listen", type="none")
    devices.append(graphics)


def _owner_element(own: Ownership) -> ET.Element:
    owner = ET.fromstring(ownership_xml(own))
    for el in owner.iter():
        el.tag = f"{{{METADATA_NS}}}{el.tag}"
    return owner


def ownership_from_domain_xml(xml: str) -> Ownership | None:
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return None
    meta = root.find("metadata")
    if meta is None:
        return None
    el = meta.find(f"{{{METADATA_NS}}}owner")
    return parse_ownership(ET.tostring(el, encoding="unicode")) if el is not None else None


def _set_text(root: ET.Element, tag: str, text: str) -> None:
    el = root.find(tag)
    if el is None:
        el = ET.SubElement(root, tag)
    el.text = text


