"""The build VM: one spec shared by every image, turned into a qemu-system-x86_64 command line
(run directly, as packer does) with a QMP socket and a guest-agent socket beside it."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from .errors import BuildError
from .qga import QGA
from .qmp import QMP


@dataclass(frozen=True)
class Drive:
    path: Path
    format: str = "raw"  # raw | qcow2
    media: str = "disk"  # disk | cdrom
    bus: str = "virtio"  # virtio | sata | ide


@dataclass
class MachineSpec:
    name: str
    machine: str = "pc"  # pc | q35
    memory_mib: int = 256
    vcpus: int = 1
    video: str = "vga"
    kernel: Path | None = None
    initrd: Path | None = None
    cmdline: str = ""
    firmware: str = "bios"  # bios | uefi
    ovmf_code: Path = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
    ovmf_vars: Path | None = None
    drives: list[Drive] = field(default_factory=list)
    tablet: str = "usb"  # usb | virtio | none
    hyperv: bool = False
    # none | user (the build VM: QEMU user networking, restrict=on, only forwarded ports) |
    # isolated (the finished image as the provider runs it: libvirt's gh-isolated network)
    network: str = "none"
    host_forwards: list[tuple[int, int]] = field(default_factory=list)  # (host port, guest port)
    qga_channel: bool = True
    serial_log: bool = True

    def cpu_arg(self, accel: str) -> str:
        base = "host" if accel == "kvm" else "qemu64"
        if not self.hyperv or accel != "kvm":
            return base  # TCG cannot provide the Hyper-V enlightenments
        # Hyper-V enlightenments Windows uses for timers, interrupts and spinlocks.
        flags = ["hv_relaxed", "hv_vapic", "hv_spinlocks=0x1fff", "hv_vpindex", "hv_synic", "hv_stimer", "hv_time"]
        return ",".join([base, *flags])

    def argv(self, accel: str, workdir: Path, qemu: str = "qemu-system-x86_64") -> list[str]:
        machine = f"{self.machine},accel={accel}"
        if self.hyperv:
            machine += ",hpet=off"
        a = [
            qemu, "-name", f"gh-build-{self.name}", "-machine", machine, "-cpu", self.cpu_arg(accel),
            "-m", str(self.memory_mib), "-smp", str(self.vcpus), "-nodefaults", "-no-user-config",
            "-display", "none", "-vga", "std" if self.video == "vga" else self.video,
            "-rtc", "base=localtime" if self.hyperv else "base=utc",
            "-qmp", f"unix:{workdir / 'qmp.sock'},server=on,wait=off",
        ]
        if self.hyperv and accel == "kvm":
            a += ["-global", "kvm-pit.lost_tick_policy=delay"]
        if self.firmware == "uefi":
            a += ["-drive", f"if=pflash,format=raw,readonly=on,file={self.ovmf_code}"]
            if self.ovmf_vars is not None:
                a += ["-drive", f"if=pflash,format=raw,file={self.ovmf_vars}"]
        if self.kernel is not None:
            a += ["-kernel", str(self.kernel)]
            if self.initrd is not None:
                a += ["-initrd", str(self.initrd)]
            a += ["-append", self.cmdline]
        if any(d.bus == "sata" for d in self.drives) and self.machine != "q35":
            a += ["-device", "ahci,id=ahci0"]
        sata_port = 0
        for i, d in enumerate(self.drives):
            node = f"drive{i}"
            opts = f"file={d.path},format={d.format},if=none,id={node},media={d.media}"
            opts += ",readonly=on" if d.media == "cdrom" else ",discard=unmap"
            a += ["-drive", opts]
            dev = "ide-cd" if d.media == "cdrom" else "ide-hd"
            if d.bus == "virtio":
                a += ["-device", f"virtio-blk-pci,drive={node}"]
            elif d.bus == "sata":
                a += ["-device", f"{dev},drive={node},bus={'ide' if self.machine == 'q35' else 'ahci0'}.{sata_port}"]
                sata_port += 1
            else:
                a += ["-device", f"{dev},drive={node}"]
        # An absolute pointer: input-send-event coordinates map 1:1 to the screen.
        if self.tablet == "usb":
            a += ["-device", "qemu-xhci,id=usb", "-device", "usb-tablet,bus=usb.0"]
        elif self.tablet == "virtio":
            a += ["-device", "virtio-tablet-pci"]
        if self.qga_channel:
            a += [
                "-chardev", f"socket,id=qga0,path={workdir / 'qga.sock'},server=on,wait=off",
                "-device", "virtio-serial-pci,id=vser0",
                "-device", "virtserialport,bus=vser0.0,chardev=qga0,name=org.qemu.guest_agent.0",
            ]
        if self.network == "user":
            fwd = "".join(f",hostfwd=tcp:127.0.0.1:{h}-:{g}" for h, g in self.host_forwards)
            a += ["-netdev", f"user,id=net0,restrict=on{fwd}", "-device", "virtio-net-pci,netdev=net0"]
        if self.serial_log:
            a += ["-serial", f"file:{workdir / 'serial.log'}"]
        if vnc := os.environ.get("GH_BUILD_VNC"):
            a += ["-vnc", vnc]  # watch a build, e.g. GH_BUILD_VNC=127.0.0.1:1 (port 5901)
        return a


class BuildVM:
    """A running qemu-system-x86_64; always killed on exit from the `with` block."""

    def __init__(self, spec: MachineSpec, accel: str, workdir: Path) -> None:
        self.spec = spec
        self.accel = accel
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.qga = QGA(workdir / "qga.sock")
        self.qmp = QMP(workdir / "qmp.sock")

    def command_line(self) -> str:
        return shlex.join(self.spec.argv(self.accel, self.workdir))

    def __enter__(self) -> BuildVM:
        argv = self.spec.argv(self.accel, self.workdir)
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            self.qmp.connect(timeout=30)
        except (TimeoutError, OSError, BuildError) as e:
            self.__exit__(None, None, None)
            raise BuildError(f"QEMU did not start: {e}\n{self.qemu_output()}") from None
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.qga.close()
        self.qmp.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, timeout: float) -> bool:
        assert self.proc is not None
        try:
            self.proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def quit(self) -> None:
        try:
            self.qmp.execute("quit", timeout=10)
        except (BuildError, OSError):
            pass
        if not self.wait_exit(15) and self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def qemu_output(self) -> str:
        if self.proc is None or self.proc.stdout is None or self.alive():
            return ""
        return self.proc.stdout.read().decode(errors="replace")[-2000:]

    def serial_tail(self, n: int = 4000) -> str:
        p = self.workdir / "serial.log"
        return p.read_text(errors="replace")[-n:] if p.is_file() else ""

    def screendump(self, dest: Path) -> Path:
        self.qmp.execute("screendump", {"filename": str(dest)}, timeout=30)
        return dest

    def type_text(self, text: str) -> None:
        """Type ASCII text on the guest keyboard (QMP send-key, US layout)."""
        for ch in text:
            self.qmp.execute("send-key", {"keys": [{"type": "qcode", "data": q} for q in _qcodes(ch)]}, timeout=10)

    def wait_screen_text(self, timeout: float) -> float:
        """Wait until the VGA screen is not a single colour (the console drew something)."""
        start = time.monotonic()
        deadline = start + timeout
        shot = self.workdir / "screen.ppm"
        while time.monotonic() < deadline:
            self.screendump(shot)
            if not _uniform_ppm(shot.read_bytes()):
                return time.monotonic() - start
            time.sleep(0.2)
        raise BuildError(f"the VGA screen stayed blank for {timeout:.0f} s (no console on tty1?)")


_NAMED = {" ": "spc", "\n": "ret", ".": "dot", "/": "slash", "-": "minus", "=": "equal", ",": "comma",
          ";": "semicolon", "'": "apostrophe", "\\": "backslash", "\t": "tab"}
_SHIFTED = {">": "dot", "<": "comma", "_": "minus", "+": "equal", ":": "semicolon", '"': "apostrophe",
            "|": "backslash", "!": "1", "@": "2", "#": "3", "$": "4", "%": "5", "^": "6", "&": "7",
            "*": "8", "(": "9", ")": "0", "?": "slash"}


def _qcodes(ch: str) -> list[str]:
    if ch.isascii() and (ch.islower() or ch.isdigit()):
        return [ch]
    if ch.isascii() and ch.isupper():
        return ["shift", ch.lower()]
    if ch in _NAMED:
        return [_NAMED[ch]]
    if ch in _SHIFTED:
        return ["shift", _SHIFTED[ch]]
    raise BuildError(f"cannot type {ch!r} with send-key")


def _uniform_ppm(data: bytes) -> bool:
    # P6 header: magic, width, height, maxval, then one whitespace byte before the pixels.
    parts = data.split(maxsplit=4)
    if len(parts) < 5 or parts[0] != b"P6":
        return True
    pixels = parts[4]
    return len(set(pixels[i : i + 3] for i in range(0, len(pixels), 3 * 97))) <= 1
