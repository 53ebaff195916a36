"""Saving start-state versions: save time and disk size per version, three ways, side by side in one run.

    .venv/bin/python bench/start_state_save.py [--images-dir DIR] [--versions N] [--write-mib M] [--big-mib B]

Each version is made the way a start state grows: a machine overlay over the previous version (the
image's base for version 1), M MiB written into it (half over what the previous version wrote, half
new), then saved as the next version's disk. The machine's writes are done with `qemu-io` on the
overlay (no guest), so only the disk side of a save is timed; a memory image, when kept, costs the
same whichever way the disk is written.

  flattened  `qemu-img convert` of the whole chain: a standalone disk (provider flatten_versions=True)
  depth-1    copy of the overlay, then a safe `qemu-img rebase` onto the image's base: every version is
             one delta over the base, independent of the others (the provider's default)
  chained    copy of the overlay as it is: version k is backed by version k-1 (the chain grows)

Two bases: the real linux-tiny disk, and a bigger synthetic base (B MiB of data) standing in for a
Windows image, where the whole-disk cost of flattening shows.

Then (unless --no-machine) the provider's real `Machine.save` on one running linux-tiny machine, with
its memory image (what a start state's save does): rounds of "write 8 MiB in the guest, save a
depth-1 version, save a flattened version", alternating, so both see the same machine and load.
Everything lives in a temp dir that is removed at the end (the machine is named gh-bench-ssave-*).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from providers.qemu.overlays import write_version_disk

MiB = 1024 * 1024
STRATEGIES = ("flattened", "depth-1", "chained")
CMD_TIMEOUT = 600


def run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=CMD_TIMEOUT).stdout


def allocated(path: Path) -> int:
    """Bytes the file really takes on disk (sparse files count what is allocated)."""
    return os.stat(path).st_blocks * 512


def chain_depth(path: Path) -> int:
    out = run("qemu-img", "info", "--backing-chain", "-U", str(path))
    return out.count("image:") - 1  # backing files under this one


def qemu_write(overlay: Path, offset: int, length: int, pattern: int) -> None:
    run("qemu-io", "-f", "qcow2", "-c", f"write -P {pattern} {offset} {length}", str(overlay))


@dataclass
class Row:
    base: str
    strategy: str
    version: int
    save_s: float
    version_bytes: int
    kept_bytes: int  # every version's disk together
    depth: int


async def save(strategy: str, overlay: Path, base: Path, dest: Path) -> None:
    if strategy == "chained":
        tmp = dest.with_suffix(".partial")
        await asyncio.to_thread(run, "cp", "--sparse=always", str(overlay), str(tmp))
        tmp.rename(dest)
    else:
        await write_version_disk(overlay, base, dest, flatten=strategy == "flattened", timeout=CMD_TIMEOUT)


async def series(label: str, base: Path, work: Path, versions: int, write: int) -> list[Row]:
    rows: list[Row] = []
    for strategy in STRATEGIES:
        d = work / f"{label}-{strategy}"
        d.mkdir()
        source = base
        kept: list[Path] = []
        for v in range(1, versions + 1):
            overlay = d / f"machine-{v}.qcow2"
            run("qemu-img", "create", "-q", "-f", "qcow2", "-b", str(source), "-F", "qcow2", str(overlay))
            # Half over the previous version's second half, half new: realistic churn, not only growth.
            start = (v - 1) * write // 2
            qemu_write(overlay, 64 * MiB + start, write, 0x10 + v)
            dest = d / f"v{v}.qcow2"
            t0 = time.perf_counter()
            await save(strategy, overlay, base, dest)
            took = time.perf_counter() - t0
            overlay.unlink()
            kept.append(dest)
            rows.append(Row(label, strategy, v, took, allocated(dest), sum(allocated(p) for p in kept),
                            chain_depth(dest)))
            source = dest
    return rows


def make_big_base(path: Path, mib: int) -> None:
    run("qemu-img", "create", "-q", "-f", "qcow2", str(path), f"{max(mib * 2, 1024)}M")
    qemu_write(path, 0, mib * MiB, 0x5A)


def report(rows: list[Row], versions: int) -> None:
    print(f"{'base':<10} {'strategy':<10} {'ver':>3} {'save s':>8} {'version MiB':>12} {'kept MiB':>9} {'depth':>5}")
    for r in rows:
        print(f"{r.base:<10} {r.strategy:<10} {r.version:>3} {r.save_s:>8.3f} {r.version_bytes / MiB:>12.2f} "
              f"{r.kept_bytes / MiB:>9.2f} {r.depth:>5}")
    print()
    for base in dict.fromkeys(r.base for r in rows):
        by = {s: [r for r in rows if r.base == base and r.strategy == s] for s in STRATEGIES}
        t = {s: sum(r.save_s for r in by[s]) / versions for s in STRATEGIES}
        last = {s: by[s][-1] for s in STRATEGIES}
        print(f"{base}: mean save time flattened/depth-1 {t['flattened'] / t['depth-1']:.2f}x, "
              f"chained/depth-1 {t['chained'] / t['depth-1']:.2f}x; "
              f"disk kept for {versions} versions flattened/depth-1 "
              f"{last['flattened'].kept_bytes / last['depth-1'].kept_bytes:.2f}x, "
              f"chained/depth-1 {last['chained'].kept_bytes / last['depth-1'].kept_bytes:.2f}x; "
              f"depth of v{versions}: flattened {last['flattened'].depth}, depth-1 {last['depth-1'].depth}, "
              f"chained {last['chained'].depth}")


async def machine_saves(images_dir: Path, work: Path, rounds: int) -> None:
    from providers.base import MachineSource
    from providers.qemu import QemuProvider

    state = work / "provider-state"
    p = QemuProvider(images_dir, state, "bench-ssave")
    await p.start()
    times: dict[str, list[float]] = {"depth-1": [], "flattened": []}
    disk: dict[str, list[int]] = {"depth-1": [], "flattened": []}
    memory: list[int] = []
    machine = None
    try:
        machine = await p.create_machine("m1", MachineSource(image="linux-tiny"), timeout=300)
        await machine.wait_ready(300)
        version = 0
        for r in range(rounds):
            res = await machine.run_script(f"head -c {8 * MiB} /dev/urandom > /root/blob{r}; sync", timeout=120)
            assert res.exit_code == 0, res.stderr
            for strategy in ("depth-1", "flattened"):
                p.versions.flatten = strategy == "flattened"
                version += 1
                t0 = time.perf_counter()
                saved = await machine.save("ss_bench", version)
                times[strategy].append(time.perf_counter() - t0)
                disk[strategy].append(allocated(saved.disk_path))
                if saved.memory_image is not None:
                    memory.append(allocated(saved.memory_image))
    finally:
        if machine is not None:
            await machine.destroy()
        await p.reap(set())
        await p.close()
    print(f"\nprovider Machine.save on linux-tiny ({p.accelerator}), with memory image "
          f"(median {sorted(memory)[len(memory) // 2] / MiB:.1f} MiB):")
    print(f"{'strategy':<10} {'round':>5} {'save s':>8} {'disk MiB':>9}")
    for r in range(rounds):
        for strategy in ("depth-1", "flattened"):
            print(f"{strategy:<10} {r + 1:>5} {times[strategy][r]:>8.3f} {disk[strategy][r] / MiB:>9.2f}")
    t = {k: sum(v) / len(v) for k, v in times.items()}
    print(f"Machine.save mean time flattened/depth-1 {t['flattened'] / t['depth-1']:.2f}x "
          f"({t['flattened']:.2f} s vs {t['depth-1']:.2f} s)")


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images-dir", type=Path,
                    default=Path(os.environ.get("GH_IMAGES_DIR", "/var/tmp/gh-runner/images")))
    ap.add_argument("--versions", type=int, default=5)
    ap.add_argument("--write-mib", type=int, default=16, help="MiB each version writes")
    ap.add_argument("--big-mib", type=int, default=1024, help="data in the synthetic big base")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of real machine saves")
    ap.add_argument("--no-machine", action="store_true", help="skip the real machine saves")
    args = ap.parse_args()
    tiny = args.images_dir / "linux-tiny" / "disk.qcow2"
    if not tiny.is_file():
        print(f"no linux-tiny disk at {tiny}: build it (scripts/setup.sh) or pass --images-dir", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gh-bench-ssave-", dir="/var/tmp"))
    os.chmod(work, 0o755)  # QEMU runs as libvirt-qemu and must reach the disks inside
    try:
        base = work / "linux-tiny.qcow2"
        shutil.copyfile(tiny, base)  # the shared image may be rebuilt while this runs
        big = work / "big.qcow2"
        make_big_base(big, args.big_mib)
        write = args.write_mib * MiB
        print(f"{args.versions} versions, {args.write_mib} MiB written per version; linux-tiny base "
              f"{allocated(base) / MiB:.1f} MiB, big base {allocated(big) / MiB:.0f} MiB\n")
        rows = await series("linux-tiny", base, work, args.versions, write)
        rows += await series("big", big, work, args.versions, write)
        report(rows, args.versions)
        if not args.no_machine:
            images = work / "images"
            # Contents only: copied xattrs would carry libvirt's "in use" labels of the originals.
            shutil.copytree(args.images_dir / "linux-tiny", images / "linux-tiny", copy_function=shutil.copyfile)
            for d in (images, images / "linux-tiny"):
                d.chmod(0o755)
            await machine_saves(images, work, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
