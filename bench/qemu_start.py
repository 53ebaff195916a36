"""Where the start of a QEMU process goes, with and without libvirt's guest-CPU check, in one run.

    .venv/bin/python bench/qemu_start.py [--images-dir DIR] [--tries 10]

Every machine the provider makes, cold or restored, is a QEMU process libvirt starts, and for an
x86 domain libvirt 9.0 then checks the guest CPU over QMP: one `qom-list` of the CPU object and a
`qom-get` of each of its boolean properties, one round trip at a time (`qemuProcessLaunch` →
`qemuProcessUpdateAndVerifyCPU`; no domain XML turns it off). This prints, for linux-tiny's device
set started directly (no libvirt, in a temporary directory, as the calling user):

  init       exec until QEMU's monitor has greeted and taken qmp_capabilities (-S, -incoming
             defer: nothing runs yet)
  cpu probe  the same qom-list + qom-get round trips libvirt makes, sent the same way
  per call   one qom-get of a CPU property, and one query-status, for scale

It shows why a lazy restore cannot be 5x a full one on a small guest here: both pay the probe.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "image-builder"))

from imagebuilder.qmp import QMP

CPU_PATH = "/machine/unattached/device[0]"


def argv(image: Path, tmp: Path) -> list[str]:
    """linux-tiny's devices as the provider's domain XML gives them (see providers/qemu/domain.py)."""
    return [
        "qemu-system-x86_64", "-S", "-machine", "pc-i440fx-7.2,usb=off,dump-guest-core=off", "-accel", "tcg",
        "-cpu", "qemu64", "-m", "256", "-display", "none", "-no-user-config", "-nodefaults",
        "-qmp", f"unix:{tmp}/qmp.sock,server=on,wait=off", "-rtc", "base=utc,driftfix=slew", "-no-shutdown",
        "-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"), "-append", "console=ttyS0",
        "-device", "virtio-serial-pci", "-drive", f"file={tmp}/disk.qcow2,if=none,id=d0",
        "-device", "virtio-blk-pci,drive=d0", "-serial", f"file:{tmp}/console.log",
        "-chardev", f"socket,id=ga,path={tmp}/ga.sock,server=on,wait=off",
        "-device", "virtserialport,chardev=ga,name=org.qemu.guest_agent.0", "-device", "virtio-tablet-pci",
        "-device", "VGA,vgamem_mb=16", "-object", "rng-random,id=r0,filename=/dev/urandom",
        "-device", "virtio-rng-pci,rng=r0",
        "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny", "-incoming", "defer",
    ]


def one(image: Path, tmp: Path) -> dict[str, float]:
    (tmp / "qmp.sock").unlink(missing_ok=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(argv(image, tmp), stdin=subprocess.DEVNULL)
    try:
        q = QMP(tmp / "qmp.sock")
        q.connect(timeout=30, poll_s=0.001)  # the greeting, then qmp_capabilities
        t1 = t2 = time.monotonic()
        props = q.execute("qom-list", {"path": CPU_PATH})
        bools = [p["name"] for p in props if p["type"] == "bool"]
        for name in bools:
            q.execute("qom-get", {"path": CPU_PATH, "property": name})
        t3 = time.monotonic()
        n = 100
        for _ in range(n):
            q.execute("qom-get", {"path": CPU_PATH, "property": "sse2"})
        t4 = time.monotonic()
        for _ in range(n):
            q.execute("query-status")
        t5 = time.monotonic()
        q.execute("quit")
        proc.wait(30)
        return {"init": t1 - t0, "cpu_probe": t3 - t2, "calls": float(len(bools) + 1),
                "qom_get_ms": (t4 - t3) / n * 1000, "query_status_ms": (t5 - t4) / n * 1000}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images-dir", type=Path,
                    default=Path(os.environ.get("GH_IMAGES_DIR", "/var/tmp/gh-runner/images")))
    ap.add_argument("--tries", type=int, default=10)
    args = ap.parse_args()
    image = args.images_dir / "linux-tiny"
    tmp = Path(tempfile.mkdtemp(prefix="gh-bench-qemu-"))
    try:
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(image / "disk.qcow2"),
                        str(tmp / "disk.qcow2")], check=True, timeout=60)
        runs = [one(image, tmp) for _ in range(args.tries)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def med(k: str) -> float:
        return statistics.median(r[k] for r in runs)

    print(f"QEMU 7.2 started directly, linux-tiny's devices, TCG, -incoming defer (median of {args.tries})")
    print(f"  init to a ready monitor          {med('init') * 1000:7.1f} ms")
    print(f"  libvirt's CPU probe ({int(med('calls'))} calls)  {med('cpu_probe') * 1000:7.1f} ms")
    print(f"  one qom-get of a CPU property    {med('qom_get_ms'):7.3f} ms"
          f"   (query-status {med('query_status_ms'):.3f} ms)")
    print(f"  probe / init                     {med('cpu_probe') / med('init'):7.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
