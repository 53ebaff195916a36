"""Which accelerator actually runs a guest here: KVM when a probe guest executes under it, else TCG.

/dev/kvm can exist and still be useless: nested KVM on some hosts hangs before the first guest
instruction, or refuses the host CPU model's MSRs. So the probe boots, with the CPU model the
build uses (`host`), a 512-byte boot sector that writes to isa-debug-exit: QEMU exits with a
known code only if guest code really ran. A build that still fails under KVM retries under TCG
(see linux_tiny.build), because a firmware-level probe cannot prove a kernel will run."""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from pathlib import Path

# mov al, 0x31 ; out 0xf4, al ; hlt ; jmp $-1   -> QEMU exits with (0x31 << 1) | 1 = 99
_BOOT_SECTOR = bytes([0xB0, 0x31, 0xE6, 0xF4, 0xF4, 0xEB, 0xFD]).ljust(510, b"\0") + b"\x55\xaa"
_EXPECTED_EXIT = 99


def probe_accel(accel: str, qemu: str = "qemu-system-x86_64", timeout: float = 3.0) -> bool:
    with tempfile.TemporaryDirectory(prefix="gh-accel-") as d:
        disk = Path(d) / "probe.img"
        disk.write_bytes(_BOOT_SECTOR)
        argv = [
            qemu, "-machine", f"pc,accel={accel}", "-cpu", "host" if accel == "kvm" else "qemu64",
            "-m", "16", "-nodefaults", "-no-user-config",
            "-display", "none", "-drive", f"file={disk},format=raw,if=ide", "-boot", "c",
            "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04",
        ]
        try:
            cp = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
        except (subprocess.TimeoutExpired, FileNotFoundError):
            return False
        return cp.returncode == _EXPECTED_EXIT


@functools.cache
def best_accel() -> str:
    """'kvm' when it really runs a guest, else 'tcg'. GH_BUILD_ACCEL=kvm|tcg overrides the probe."""
    forced = os.environ.get("GH_BUILD_ACCEL")
    if forced in ("kvm", "tcg"):
        return forced
    if os.access("/dev/kvm", os.R_OK | os.W_OK) and probe_accel("kvm"):
        return "kvm"
    return "tcg"
