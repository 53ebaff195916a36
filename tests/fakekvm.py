"""A host whose KVM runs firmware but never a Linux kernel, faked with a QEMU wrapper.

Put `bin_dir` first on PATH. Asked for KVM, the wrapper runs the real QEMU under TCG without the
kernel (`-kernel`, `-initrd`, `-append` dropped) and with the CPU model TCG can give: the firmware
runs, a boot sector runs too, but no kernel ever prints or answers. Asked for anything else, it is
the real QEMU. Each run appends `kvm` or `tcg` and whether a kernel was asked for to `calls`.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
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
args=() skip=0 prev=
for a in "$@"; do
  if [ $skip = 1 ]; then skip=0; prev=$a; continue; fi
  case "$a" in
    -kernel|-initrd|-append) skip=1 ;;
    -enable-kvm) ;;
    kvm) args+=(tcg) ;;
    *accel=kvm*) args+=("${{a/accel=kvm/accel=tcg}}") ;;
    host*) if [ "$prev" = -cpu ]; then args+=(qemu64); else args+=("$a"); fi ;;
    *) args+=("$a") ;;
  esac
  prev=$a
done
exec "$real" "${{args[@]}}"
"""


@dataclass(frozen=True)
class FakeKvmHost:
    bin_dir: Path
    qemu: Path
    calls_file: Path

    def calls(self) -> list[str]:
        return self.calls_file.read_text().splitlines() if self.calls_file.exists() else []


def firmware_only_kvm(where: Path) -> FakeKvmHost:
    """Write the wrapper as `where`/bin/qemu-system-x86_64 (`where` must be new to this test)."""
    real = shutil.which("qemu-system-x86_64")
    assert real is not None, "qemu-system-x86_64 is not installed"
    bin_dir = where / "bin"
    bin_dir.mkdir(parents=True)
    calls = where / "qemu.calls"
    qemu = bin_dir / "qemu-system-x86_64"
    qemu.write_text(_WRAPPER.format(real=real, calls=calls))
    qemu.chmod(0o755)
    return FakeKvmHost(bin_dir, qemu, calls)


def on_path(where: Path, monkeypatch: pytest.MonkeyPatch) -> FakeKvmHost:
    """Such a host, its wrapper first on PATH for the test. The decision checks that this process
    may open /dev/kvm before it boots anything: without that there is no KVM to fake, and the
    test is skipped with the reason."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        pytest.skip("needs a /dev/kvm this process may open (the decision checks it before it boots)")
    fake = firmware_only_kvm(where)
    monkeypatch.setenv("PATH", f"{fake.bin_dir}:{os.environ['PATH']}")
    return fake
