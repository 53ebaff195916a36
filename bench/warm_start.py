"""Time to a guest that answers, four ways side by side in one run, and memory per extra machine.

    .venv/bin/python bench/warm_start.py [--images-dir DIR] [--image linux-tiny] [--tries 20]
                                         [--cold-tries N] [--pss-machines 4] [--memory-mib M --fill-mib F]

On linux-tiny (or `--image linux-desktop`: "ready" is then a signed-in desktop, and a cold boot
takes minutes under TCG, so `--cold-tries` bounds how many of the tries boot cold), for each try
(the modes interleaved, so drift in host load hits them alike):

  cold     a fresh overlay on the image, booted
  full     the image's warm snapshot, its memory image read in full by libvirt (today's restore)
  lazy     the same snapshot, its RAM file mapped private, the device state migrated in (QMP)
  pool     a machine the hot pool restored and paused ahead of time, taken and resumed

"ready" is lease to the guest agent's answer (create_machine + wait_ready); "first script" adds
the first script (`true`), which sets the clock of a restored machine in its own exec (providers/qemu/README.md;
bench/script_time.py compares that with the old way and breaks it down). Prints p50/p90 of each,
the ratios to cold and to full, the median of each restore's steps (where libvirt spends the
time), and the PSS of N machines from one snapshot at once, lazy vs full. Everything it makes is
named gh-bench-warm-* and removed at the end. The host may be shared: numbers are noisy, ratios
measured in one run are what counts.

What a restored machine does to be as fresh as a cold one, side by side: `--compare-genid` adds
full, lazy and pool machines without the VM generation ID device (modes full-g0, lazy-g0, pool-g0,
on their own warm snapshot), `--compare-reseed` ones whose first script does not reseed the guest's
RNG (full-r0, lazy-r0, pool-r0; gh-reseed, guest_agent.reseed_arg); each prints the ratio of the
mode without to the mode with (under 1: what it costs).

`--memory-mib M --fill-mib F` measures a bigger guest, as a Windows one would be: linux-tiny with M
MiB of RAM whose warm snapshot is taken after the guest filled F MiB of its tmpfs with random
bytes (zero pages would be skipped by a save). A full restore then reads what the guest used; a
lazy one maps it. The variant is a copy of the image's manifest in the bench's own directory,
pointing at the same files.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from providers.base import MachineSource
from providers.qemu import QemuMachine, QemuProvider
from providers.qemu.pool import PoolConfig

TINY = MachineSource(image="linux-tiny")  # replaced by --image
MODES = ("cold", "full", "lazy", "pool")


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def pss_kib(m: QemuMachine) -> tuple[int, int, int]:
    """PSS, RSS and private memory (what this machine alone holds: its cost as an extra machine)."""
    pid = Path(f"/run/libvirt/qemu/{m.domain_name}.pid").read_text().strip()
    vals = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("Rss", "Pss", "Private_Clean", "Private_Dirty"):
            vals[k] = int(v.split()[0])
    return vals["Pss"], vals["Rss"], vals["Private_Clean"] + vals["Private_Dirty"]


async def until(cond: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("the hot pool did not refill in time")
        await asyncio.sleep(0.05)


async def one(p: QemuProvider, mid: str) -> tuple[float, float, dict[str, float]]:
    t0 = time.monotonic()
    m = await p.create_machine(mid, TINY, timeout=300)
    assert isinstance(m, QemuMachine)
    try:
        await m.wait_ready(300)
        ready = time.monotonic() - t0
        res = await m.run_script("true", timeout=60)
        assert res.exit_code == 0, res.stderr
        return ready, time.monotonic() - t0, dict(p.last_restore_steps)
    finally:
        await m.destroy()


async def pss_of(p: QemuProvider, n: int, tag: str) -> list[tuple[int, int, int]]:
    made: list[QemuMachine] = []
    try:
        for i in range(n):
            m = await p.create_machine(f"pss-{tag}-{i}", TINY, timeout=300)
            assert isinstance(m, QemuMachine)
            made.append(m)
            await m.wait_ready(300)
        # Each guest does the same small thing, then its memory is read.
        for m in made:
            await m.run_script("ls / >/dev/null; true", timeout=60)
        return [pss_kib(m) for m in made]
    finally:
        for m in made:
            await m.destroy()


def bigger_image(images_dir: Path, dest: Path, memory_mib: int) -> Path:
    """An images dir holding linux-tiny with `memory_mib` of RAM: its files linked, its manifest copied."""
    import yaml

    src = images_dir / TINY.image
    d = dest / TINY.image
    d.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "image.yaml":
            os.link(f, d / f.name)
    manifest = yaml.safe_load((src / "image.yaml").read_text())
    manifest["memory_mib"] = memory_mib
    (d / "image.yaml").write_text(yaml.safe_dump(manifest))
    for p in (dest, d):
        p.chmod(0o755)
    return dest


def fill_before_snapshot(fill_mib: int) -> None:
    """The warm snapshot's build waits for its guest, then saves it: here it also fills `fill_mib`."""
    ready = QemuMachine.wait_ready

    async def wait_then_fill(self: QemuMachine, timeout: float) -> None:
        await ready(self, timeout)
        if self.machine_id.startswith("warm-"):
            t = time.monotonic()
            fill = f"dd if=/dev/urandom of=/dev/shm/fill bs=1M count={fill_mib} 2>&1 && sync"
            res = await self.run_script(fill, timeout=900)
            assert res.exit_code == 0, res.stderr
            print(f"the snapshot's guest filled {fill_mib} MiB in {time.monotonic() - t:.1f} s", flush=True)

    QemuMachine.wait_ready = wait_then_fill  # type: ignore[method-assign]


def without(variant: str, images_dir: Path, state: Path) -> dict[str, QemuProvider]:
    """full, lazy and pool providers without the VM generation ID device (g0) or the reseed (r0).
    Without the device the warm snapshot is another, in a state dir of its own: each provider
    prunes an image's snapshots other than its own kind."""
    genid = variant != "g0"
    if not genid:
        state = state / variant
        state.mkdir(mode=0o755)
    provs = {
        f"full-{variant}": QemuProvider(images_dir, state, f"bench-warm-full{variant}", warm_snapshots=True,
                                        lazy_restore=False, genid=genid),
        f"lazy-{variant}": QemuProvider(images_dir, state, f"bench-warm-lazy{variant}", warm_snapshots=True,
                                        genid=genid),
        f"pool-{variant}": QemuProvider(images_dir, state, f"bench-warm-pool{variant}", warm_snapshots=True,
                                        genid=genid,
                                        pool=PoolConfig(per_source=1, total_mib=1 << 16, keep=frozenset({TINY}))),
    }
    if variant == "r0":
        for p in provs.values():
            p.reseed_after_restore = False
    return provs


async def run(images_dir: Path, state: Path, tries: int, pss_n: int, cold_tries: int,
              variants: tuple[str, ...] = ()) -> None:
    # One state dir, so full, lazy and pool share one warm snapshot; a runner name per mode.
    provs = {
        "cold": QemuProvider(images_dir, state, "bench-warm-cold", warm_snapshots=False),
        "full": QemuProvider(images_dir, state, "bench-warm-full", warm_snapshots=True, lazy_restore=False),
        "lazy": QemuProvider(images_dir, state, "bench-warm-lazy", warm_snapshots=True),
        "pool": QemuProvider(images_dir, state, "bench-warm-pool", warm_snapshots=True,
                             pool=PoolConfig(per_source=1, total_mib=1 << 16, keep=frozenset({TINY}))),
    }
    modes: tuple[str, ...] = MODES
    for v in variants:  # without the device, the snapshot is another (warm.snapshot_key)
        more = without(v, images_dir, state)
        provs |= more
        modes = (*modes, *more)
    ready: dict[str, list[float]] = {k: [] for k in modes}
    execd: dict[str, list[float]] = {k: [] for k in modes}
    steps: dict[str, dict[str, list[float]]] = {k: {} for k in modes}
    try:
        t = time.monotonic()
        for warmup in ("lazy", "lazy-g0") if "g0" in variants else ("lazy",):
            await provs[warmup].start()
            await one(provs[warmup], f"warmup-{warmup}")  # builds the snapshot
            if not provs[warmup].last_restore_steps:
                raise SystemExit("the warm snapshot was not built (see the warning above): nothing to compare")
        print(f"warm snapshot built in {time.monotonic() - t:.1f} s (once per image per runner)", flush=True)
        for p in provs.values():
            await p.start()
        pools = {m: provs[m].pool for m in modes if m.startswith("pool")}
        for i in range(tries):
            order = modes if i % 2 == 0 else tuple(reversed(modes))
            for mode in order:
                if mode == "cold" and i >= cold_tries:
                    continue
                p = provs[mode]
                if (pool := pools.get(mode)) is not None:
                    await until(lambda: pool.counts().get(TINY, 0) >= 1, 300)  # refills are not timed
                p.last_restore_steps = {}
                r, e, st = await one(p, f"{mode}-{i}")
                ready[mode].append(r)
                execd[mode].append(e)
                for k, v in st.items():
                    steps[mode].setdefault(k, []).append(v)
            print(f"  try {i + 1}/{tries}: " + "  ".join(f"{m} {ready[m][-1]:.3f}" for m in modes if ready[m]),
                  flush=True)
        for m, pool in pools.items():
            assert pool is not None and pool.taken == tries, f"only some of {tries} {m} tries got a pooled machine"

        what = " and a signed-in session" if TINY.image != "linux-tiny" else ""
        print(f"\nseconds, lease to a guest that answers{what} (n={tries} each, cold n={len(ready['cold'])})")
        print(f"{'mode':7} {'ready p50':>10} {'ready p90':>10} {'1st p50':>10} {'1st p90':>10}"
              f" {'cold/x':>8} {'full/x':>8}")
        c50, f50 = pct(ready["cold"], 0.5), pct(ready["full"], 0.5)
        for m in modes:
            r50 = pct(ready[m], 0.5)
            print(f"{m:7} {r50:10.3f} {pct(ready[m], 0.9):10.3f} {pct(execd[m], 0.5):10.3f} "
                  f"{pct(execd[m], 0.9):10.3f} {c50 / r50:7.1f}x {f50 / r50:7.1f}x")
        for v in variants:
            what = {"g0": "the VM generation ID device", "r0": "the first script's RNG reseed"}[v]
            print(f"\nwithout {what} / with it (p50; under 1: it costs that much)")
            for m in ("full", "lazy", "pool"):
                print(f"  {m:5} ready {pct(ready[f'{m}-{v}'], 0.5) / pct(ready[m], 0.5):5.2f}  "
                      f"first script {pct(execd[f'{m}-{v}'], 0.5) / pct(execd[m], 0.5):5.2f}")
        print("\nmedian seconds per restore step")
        for m in ("full", "lazy", *(f"{k}-{v}" for v in variants for k in ("full", "lazy"))):
            print(f"  {m}: " + ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in steps[m].items()))

        guest_kib = (await provs["lazy"].catalog.get(TINY.image)).manifest.memory_mib * 1024
        print(f"\nmemory of {pss_n} machines from one snapshot at once (KiB per machine; guest RAM {guest_kib})")
        for m in ("full", "lazy"):
            vals = await pss_of(provs[m], pss_n, m)
            pss = [v[0] for v in vals]
            rss = [v[1] for v in vals]
            priv = [v[2] for v in vals]
            print(f"  {m}: PSS mean {statistics.mean(pss):8.0f} ({100 * statistics.mean(pss) / guest_kib:.0f}% of "
                  f"the guest's RAM)  RSS mean {statistics.mean(rss):8.0f}  private mean {statistics.mean(priv):8.0f} "
                  f"({100 * statistics.mean(priv) / guest_kib:.0f}%)  (PSS each: {', '.join(str(x) for x in pss)})")
    finally:
        for p in provs.values():
            try:
                await p.reap(keep=set())
            finally:
                await p.close()


async def _main(args: argparse.Namespace, state: Path) -> None:
    try:
        images_dir = args.images_dir
        if args.memory_mib:
            images_dir = bigger_image(images_dir, state / "images", args.memory_mib)
        if args.fill_mib:
            fill_before_snapshot(args.fill_mib)
        await run(images_dir, state, args.tries, args.pss_machines,
                  args.tries if args.cold_tries is None else args.cold_tries,
                  tuple(v for v, on in (("g0", args.compare_genid), ("r0", args.compare_reseed)) if on))
    finally:
        await asyncio.to_thread(shutil.rmtree, state, True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images-dir", type=Path,
                    default=Path(os.environ.get("GH_IMAGES_DIR", "/var/tmp/gh-runner/images")))
    ap.add_argument("--image", default="linux-tiny", help="linux-tiny (default) or linux-desktop")
    ap.add_argument("--tries", type=int, default=20)
    ap.add_argument("--cold-tries", type=int, default=None, help="tries that include a cold boot (default: all)")
    ap.add_argument("--pss-machines", type=int, default=4)
    ap.add_argument("--compare-genid", action="store_true",
                    help="also full, lazy and pool without the VM generation ID device, side by side")
    ap.add_argument("--compare-reseed", action="store_true",
                    help="also full, lazy and pool whose first script does not reseed the guest's RNG")
    ap.add_argument("--memory-mib", type=int, default=0, help="guest RAM (default: the image's)")
    ap.add_argument("--fill-mib", type=int, default=0, help="MiB the snapshot's guest uses before it is saved")
    args = ap.parse_args()
    global TINY
    TINY = MachineSource(image=args.image)
    state = Path(tempfile.mkdtemp(prefix="gh-bench-warm-", dir="/var/tmp"))
    state.chmod(0o755)  # libvirt-qemu must reach the overlays
    asyncio.run(_main(args, state))
    return 0


if __name__ == "__main__":
    sys.exit(main())

