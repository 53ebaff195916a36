#!/usr/bin/env python3
"""linux-tiny: boot-to-ready time next to a plain `qemu-img convert` copy of the same disk, in one run.

Each round, in alternating order so drift in host load hits both sides alike:
  overlay  qemu-img create -b base (what the provider does for a fresh machine), then boot it with
           plain QEMU until the guest agent answers a guest-exec (boot-to-ready);
  copy     qemu-img convert of the same base disk to a standalone qcow2 (the naive fresh disk),
           then the same boot from the copy.
Prints the medians, then ratios. Usage:
  .venv/bin/python bench/image_boot.py [--images-dir DIR] [--rounds N] [--accel kvm|tcg]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "image-builder"), str(ROOT)]

from imagebuilder.accel import build_accelerator  # noqa: E402
from imagebuilder.debs import DEFAULT_CACHE  # noqa: E402
from imagebuilder.vm import BuildVM, Drive, MachineSpec  # noqa: E402

from providers.manifest import DirectKernelBoot, load_manifest  # noqa: E402


def timed(argv: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, timeout=600)
    return time.perf_counter() - t


def boot_to_ready(image: Path, disk: Path, work: Path, accel: str) -> float:
    m = load_manifest(image, verify_checksum=False)
    assert isinstance(m.boot, DirectKernelBoot)
    spec = MachineSpec(
        name="bench", machine=m.machine, memory_mib=m.memory_mib, vcpus=m.vcpus, video=m.video,
        kernel=image / m.boot.kernel, initrd=image / m.boot.initrd, cmdline=m.boot.cmdline,
        drives=[Drive(disk, "qcow2")], tablet=m.tablet,
    )
    t = time.perf_counter()
    with BuildVM(spec, accel, work) as vm:
        vm.qga.wait_ready(120)
        r = vm.qga.run_script("/bin/sh", "true\n", timeout=60)
        ready = time.perf_counter() - t
        if r.exit_code != 0:
            raise RuntimeError("guest-exec of `true` failed")
    return ready


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images-dir", type=Path,
                    default=Path(os.environ.get("GH_IMAGES_DIR", "/var/tmp/gh-runner/images")))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--accel", choices=["kvm", "tcg"], default=None)
    args = ap.parse_args()
    image = args.images_dir / "linux-tiny"
    base = image / load_manifest(image).disk.file
    accel = args.accel or build_accelerator(image / "vmlinuz", DEFAULT_CACHE)
    work = Path(tempfile.mkdtemp(prefix="gh-bench-", dir="/var/tmp"))
    os.chmod(work, 0o755)
    res: dict[str, list[float]] = {k: [] for k in ("overlay", "overlay_boot", "convert", "convert_boot")}
    try:
        for i in range(args.rounds):
            sides = ["overlay", "convert"] if i % 2 == 0 else ["convert", "overlay"]
            for side in sides:
                d = work / f"{side}-{i}"
                d.mkdir(mode=0o755)
                disk = d / "disk.qcow2"
                if side == "overlay":
                    res["overlay"].append(timed(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(base),
                                                 "-F", "qcow2", str(disk)]))
                else:
                    res["convert"].append(timed(["qemu-img", "convert", "-O", "qcow2", str(base), str(disk)]))
                res[f"{side}_boot"].append(boot_to_ready(image, disk, d, accel))
                shutil.rmtree(d)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in res.items()}
    size = base.stat().st_size / 2**20
    print(f"linux-tiny boot-to-ready vs a qemu-img convert copy: {args.rounds} rounds, accel {accel}, "
          f"base disk {size:.1f} MiB (medians, seconds)")
    print(f"  qemu-img create overlay        {med['overlay']:8.3f}")
    print(f"  boot to ready (overlay)        {med['overlay_boot']:8.3f}   "
          f"(min {min(res['overlay_boot']):.3f}, max {max(res['overlay_boot']):.3f})")
    print(f"  qemu-img convert copy          {med['convert']:8.3f}")
    print(f"  boot to ready (copy)           {med['convert_boot']:8.3f}")
    fresh_overlay = med["overlay"] + med["overlay_boot"]
    fresh_copy = med["convert"] + med["convert_boot"]
    print(f"  ratio boot-to-ready / convert copy          {med['overlay_boot'] / med['convert']:6.2f}")
    print(f"  ratio overlay create / convert copy         {med['overlay'] / med['convert']:6.3f}")
    print(f"  fresh machine: overlay+boot {fresh_overlay:.3f} s vs copy+boot {fresh_copy:.3f} s "
          f"(ratio {fresh_overlay / fresh_copy:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
