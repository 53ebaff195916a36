"""What an idle runner costs, by the hot pool's policy, side by side in one run.

    .venv/bin/python bench/idle_runner.py [--tiny-dir DIR] [--desktop-dir DIR] [--slots 2] [--idle-s 30]

An images dir holds linux-tiny and linux-desktop (their files hard-linked from the built images).
Three runners' providers start on it in turn, each with the pool the runner's config would give it
(gh_runner/poolsize.py, from `--slots` and the memory free now), and are left idle, leased nothing:

  before      the old policy: every image of the images dir kept hot (here: pool.keep lists both)
  by-demand   the pool by demand, nothing kept (a runner's default): nothing is hot until leased
  keep-tiny   the pool by demand, pool.keep: [linux-tiny] (what gh-runner local's demo runner keeps)

For each: the wall and CPU seconds from the provider's start until its pool has settled (every
restore and prime done), then over `--idle-s` seconds of idleness the CPU its QEMU processes and
this process used, and at the end the RSS and PSS of its QEMU processes and the guest memory its
paused machines hold (their manifests' memory_mib). The runner's own process is this one: its RSS
is printed once, and added to each policy's QEMU RSS for the ratio of totals (before / by-demand,
before / keep-tiny). The warm snapshots both images restore from are built first, once (a runner
with the old policy builds the desktop's at its first start; by demand, at the desktop's first
lease), so the three are compared from the same start. The host may be shared: CPU numbers are
noisy; the memory is what a paused machine holds, and varies little.

Everything it makes is named gh-bench-idle-* and removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gh_runner.config import load_config
from gh_runner.poolsize import plan_pool
from providers.base import MachineSource
from providers.qemu import QemuProvider
from providers.qemu.pool import HotPool, PoolConfig

TINY = MachineSource(image="linux-tiny")
DESKTOP = MachineSource(image="linux-desktop")
RUNNER = "bench-idle"
PIDS = Path("/run/libvirt/qemu")
TICK = os.sysconf("SC_CLK_TCK")
SETTLE_S = 5.0  # a pool unchanged, making nothing, this long: settled
SETTLE_TIMEOUT_S = 1800.0  # restoring and priming desktops under TCG on a loaded host


@dataclass
class Result:
    policy: str
    pooled: dict[str, int] = field(default_factory=dict)
    guest_mib: int = 0
    settle_wall_s: float = 0.0
    settle_cpu_s: float = 0.0
    idle_cpu_s: float = 0.0
    rss_mib: float = 0.0
    pss_mib: float = 0.0


def link_images(tiny: Path, desktop: Path) -> Path:
    """An images dir with both images, their files hard-linked (no copy of the desktop's disk)."""
    d = Path(tempfile.mkdtemp(prefix="gh-bench-idle-images-", dir="/var/tmp"))
    d.chmod(0o755)
    for src in (tiny, desktop):
        dst = d / src.name
        dst.mkdir(mode=0o755)
        for f in src.iterdir():
            if f.is_file():
                os.link(f, dst / f.name)
    return d


def qemu_pids(prefix: str) -> list[int]:
    out = []
    for f in PIDS.glob(f"{prefix}*.pid"):
        try:
            out.append(int(f.read_text().strip()))
        except (OSError, ValueError):
            continue
    return out


def cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def memory_mib(pid: int) -> tuple[float, float]:
    """RSS and PSS of a process, MiB."""
    rss = pss = 0.0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("Rss", "Pss"):
                kib = int(value.split()[0])
                if key == "Rss":
                    rss = kib / 1024
                else:
                    pss = kib / 1024
    except (OSError, ValueError, IndexError):
        pass
    return rss, pss


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


async def settled(pool: HotPool[Any]) -> None:
    """Until the pool has made nothing for SETTLE_S: every restore and prime it wanted is done."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    last, since = pool.counts(), time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = pool.counts()
        if now != last or pool._making is not None or pool._wake.is_set():
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= SETTLE_S:
            return
    raise SystemExit(f"the pool did not settle within {SETTLE_TIMEOUT_S:.0f} s")


async def measure(policy: str, images: Path, state: Path, config: PoolConfig, idle_s: float) -> Result:
    name = f"{RUNNER}-{policy}"
    prefix = f"gh-{name}-"
    p = QemuProvider(images, state, name, warm_snapshots=True, pool=config)
    r = Result(policy)
    try:
        own0, t0 = own_cpu_s(), time.monotonic()
        await p.start()
        assert p.pool is not None
        await settled(p.pool)
        r.settle_wall_s = time.monotonic() - t0 - SETTLE_S
        pids = qemu_pids(prefix)
        qemu0 = {pid: cpu_s(pid) for pid in pids}  # all of it since they started, after t0
        own1 = own_cpu_s()
        r.settle_cpu_s = sum(qemu0.values()) + own1 - own0
        await asyncio.sleep(idle_s)  # the idle window measured: nothing happens, by design
        r.idle_cpu_s = sum(cpu_s(pid) - qemu0.get(pid, 0.0) for pid in qemu_pids(prefix)) + own_cpu_s() - own1
        for pid in qemu_pids(prefix):
            rss, pss = memory_mib(pid)
            r.rss_mib += rss
            r.pss_mib += pss
        counts = p.pool.counts()
        r.pooled = {s.image: n for s, n in counts.items()}
        sizes = {i.manifest.name: i.manifest.memory_mib for i in await p.catalog.scan()}
        r.guest_mib = sum(sizes[s.image] * n for s, n in counts.items())
    finally:
        await p.close()
    return r


async def build_warm(images: Path, state: Path) -> None:
    """The warm snapshots of both images, once: a machine of each, made and destroyed."""
    p = QemuProvider(images, state, f"{RUNNER}-warm", warm_snapshots=True)
    try:
        for source in (TINY, DESKTOP):
            t = time.monotonic()
            m = await p.create_machine(f"warm-{source.image}", source, timeout=SETTLE_TIMEOUT_S)
            await m.destroy()
            print(f"warm snapshot of {source.image}: {time.monotonic() - t:.0f} s (once per image per runner)",
                  flush=True)
    finally:
        await p.close()


def row(label: str, values: list[str]) -> str:
    return f"{label:<34}" + "".join(f"{v:>20}" for v in values)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}x" if b > 0 else "n/a"


async def run(args: argparse.Namespace, images: Path, state: Path) -> None:
    cfg = load_config({"slots": args.slots, "images_dir": str(images), "state_dir": str(state)}, {})
    plan = plan_pool(cfg)
    if not plan.enabled:
        raise SystemExit(f"no pool on this host: {plan.describe()}")
    print(f"pool as a {args.slots}-slot runner's: {plan.per_source} per source within {plan.total_mib} MiB",
          flush=True)
    await build_warm(images, state)
    policies = {
        "before": frozenset({TINY, DESKTOP}),
        "by-demand": frozenset(),
        "keep-tiny": frozenset({TINY}),
    }
    results = []
    for policy, keep in policies.items():
        config = PoolConfig(per_source=plan.per_source, total_mib=plan.total_mib, keep=keep)
        print(f"{policy}: starting, then idle for {args.idle_s:g} s", flush=True)
        results.append(await measure(policy, images, state, config, args.idle_s))
    own_rss, _ = memory_mib(os.getpid())

    print()
    print(row("", [r.policy for r in results]))
    print(row("paused machines", [", ".join(f"{k} {v}" for k, v in sorted(r.pooled.items())) or "none"
                                  for r in results]))
    print(row("guest memory held (MiB)", [f"{r.guest_mib}" for r in results]))
    print(row("QEMU RSS (MiB)", [f"{r.rss_mib:.0f}" for r in results]))
    print(row("QEMU PSS (MiB)", [f"{r.pss_mib:.0f}" for r in results]))
    print(row("+ runner process RSS (MiB)", [f"{r.rss_mib + own_rss:.0f}" for r in results]))
    print(row("start to settled, wall (s)", [f"{r.settle_wall_s:.1f}" for r in results]))
    print(row("start to settled, CPU (s)", [f"{r.settle_cpu_s:.1f}" for r in results]))
    print(row(f"idle {args.idle_s:g} s, CPU (s)", [f"{r.idle_cpu_s:.2f}" for r in results]))
    print(row("idle, % of a core", [f"{100 * r.idle_cpu_s / args.idle_s:.1f}" for r in results]))
    before, demand, tiny = results
    print()
    print(f"runner process RSS {own_rss:.0f} MiB (this process, in all three)")
    for other in (demand, tiny):
        print(f"before / {other.policy}: memory (QEMU + runner RSS) "
              f"{ratio(before.rss_mib + own_rss, other.rss_mib + own_rss)}, "
              f"QEMU RSS {before.rss_mib:.0f} vs {other.rss_mib:.0f} MiB, "
              f"start CPU {ratio(before.settle_cpu_s, other.settle_cpu_s)}, "
              f"idle CPU {ratio(before.idle_cpu_s, other.idle_cpu_s)}")


async def _main(args: argparse.Namespace, images: Path, state: Path) -> None:
    try:
        await run(args, images, state)
    finally:
        reaper = QemuProvider(images, state, RUNNER)
        for policy in ("warm", "before", "by-demand", "keep-tiny"):
            reaper.runner_name = f"{RUNNER}-{policy}"
            await reaper.reap(set())
        await reaper.close()
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(images, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny-dir", type=Path, default=Path("/var/tmp/gh-runner/images/linux-tiny"))
    ap.add_argument("--desktop-dir", type=Path, default=Path("/var/tmp/gh-runner/desktop-images/linux-desktop"))
    ap.add_argument("--slots", type=int, default=2, help="the runner's slots, which size its pool (local's: 2)")
    ap.add_argument("--idle-s", type=float, default=30.0, help="the idle window measured")
    args = ap.parse_args()
    images = link_images(args.tiny_dir, args.desktop_dir)
    state = Path(tempfile.mkdtemp(prefix="gh-bench-idle-", dir="/var/tmp"))
    state.chmod(0o755)  # libvirt-qemu must reach the overlays
    asyncio.run(_main(args, images, state))
    return 0


if __name__ == "__main__":
    sys.exit(main())
