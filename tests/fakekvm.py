"""Hosts whose KVM is broken in the ways nested KVM breaks, faked with a QEMU wrapper.

Put `bin_dir` first on PATH. Asked for anything but KVM, the wrapper is the real QEMU. Asked for
KVM, it runs the real QEMU under TCG, with the CPU model TCG can give, and:
- `FIRMWARE_ONLY`: without the kernel (`-kernel`, `-initrd`, `-append` dropped): the firmware runs,
  a boot sector runs too, but no kernel ever prints or answers;
- `KERNEL_HANGS`: with the kernel, whose console goes silent after its first line ("Linux version"),
  as when a second virtual CPU's bring-up hangs under nested KVM;
- `WORKS`: with the kernel, as working KVM would (only slower).
Each run appends `kvm` or `tcg` and whether a kernel was asked for to `calls`.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import pytest

_WRAPPER = r"""#!/bin/bash
real={real}
kvm=0 kernel=0
for a in "$@"; do
  case "$a" in kvm|*accel=kvm*|-enable-kvm) kvm=1;; -kernel) kernel=1;; esac
done
echo "$([ $kvm = 1 ] && echo kvm || echo tcg) kernel=$kernel" >> {calls}
[ $kvm = 1 ] || exec "$real" "$@"
mode={mode}
args=() skip=0 prev=
for a in "$@"; do
  if [ $skip = 1 ]; then skip=0; prev=$a; continue; fi
  case "$a" in
    -kernel|-initrd|-append) if [ $mode = firmware-only ]; then skip=1; else args+=("$a"); fi ;;
    -enable-kvm) ;;
    kvm) args+=(tcg) ;;
    *accel=kvm*) args+=("${{a/accel=kvm/accel=tcg}}") ;;
    host*) if [ "$prev" = -cpu ]; then args+=(qemu64); else args+=("$a"); fi ;;
    *) args+=("$a") ;;
  esac
  prev=$a
done
if [ $mode = kernel-hangs ]; then
  # the console as the probe reads it stops after the first line; QEMU runs on until it is killed
  "$real" "${{args[@]}}" | {{ sed -u '/Linux version/q'; exec cat >/dev/null; }}
  exec sleep 3600  # a hung guest neither prints nor ends: whoever probes kills it
fi
exec "$real" "${{args[@]}}"
"""


class KvmFault(StrEnum):
    FIRMWARE_ONLY = "firmware-only"
    KERNEL_HANGS = "kernel-hangs"
    WORKS = "works"


@dataclass(frozen=True)
class FakeKvmHost:
    bin_dir: Path
    qemu: Path
    calls_file: Path

    def calls(self) -> list[str]:
        return self.calls_file.read_text().splitlines() if self.calls_file.exists() else []


def fake_kvm(where: Path, fault: KvmFault = KvmFault.FIRMWARE_ONLY) -> FakeKvmHost:
    """Write the wrapper as `where`/bin/qemu-system-x86_64 (`where` must be new to this test)."""
    real = shutil.which("qemu-system-x86_64")
    assert real is not None, "qemu-system-x86_64 is not installed"
    bin_dir = where / "bin"
    bin_dir.mkdir(parents=True)
    calls = where / "qemu.calls"
    qemu = bin_dir / "qemu-system-x86_64"
    qemu.write_text(_WRAPPER.format(real=real, calls=calls, mode=fault.value))
    qemu.chmod(0o755)
    return FakeKvmHost(bin_dir, qemu, calls)


def on_path(where: Path, monkeypatch: pytest.MonkeyPatch, fault: KvmFault = KvmFault.FIRMWARE_ONLY) -> FakeKvmHost:
    """Such a host, its wrapper first on PATH for the test. The decision checks that this process
    may open /dev/kvm before it boots anything: without that there is no KVM to fake, and the
    test is skipped with the reason."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        pytest.skip("needs a /dev/kvm this process may open (the decision checks it before it boots)")
    fake = fake_kvm(where, fault)
    monkeypatch.setenv("PATH", f"{fake.bin_dir}:{os.environ['PATH']}")
    return fake
