"""A save point's pause, seen from inside the guest, and its bytes (issue 51).

    .venv/bin/python bench/save_point.py [--images-dir DIR] [--image linux-tiny] [--saves 3]

One running machine; in its guest a loop appends, every ~20 ms, the guest's wall clock
(a file's mtime, to the nanosecond; set right after each restore) and its uptime (`/proc/uptime`, which stands still
while the guest is stopped). Then `--saves` save points, as an attempt makes them
(gh_runner/save_points.py: `Machine.save` with memory, the machine running on), each with a disk-only
save beside it (`with_memory=False`: sync, pause, copy the disk delta, resume) so the two are
measured side by side on the same machine and load. For each save it prints:

  host s       how long the save call took on the host
  pause s      the largest gap between two consecutive wall-clock ticks of the guest's loop: how long
               the guest did not run (a tick's own cost, ~20 ms plus a fork under TCG, is in it)
  uptime gap   the largest gap in the guest's uptime: the pause as the guest's own monotonic clock saw it
  bytes        what the save keeps on the runner (disk delta + memory image)

Then `--resumes` times a resume's part on the runner (docs/start-states.md, "Resume"): a machine made
from the last save point with memory, ready, and its first script run (which sets the restored guest's
clock), as a resumed attempt's `machine`, `ready` and `resume` phases do; beside it the same three steps
from the image itself (a cold boot), in the same run.

Everything it makes is named gh-bench-savepoint-* and removed at the end. The host may be shared:
numbers are noisy; the ratio of the two kinds of save, measured in one run, is what counts.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# In the home of whoever the image's scripts run as: root on linux-tiny, the session's user on linux-desktop.
TICKS = "$HOME/gh-bench-ticks"
# BusyBox `date` has no sub-second format; a file's mtime is the wall clock to the nanosecond.
NOW = "touch /tmp/now && stat -c %y /tmp/now"
LOOP = (f"rm -f {TICKS}; setsid sh -c 'while :; do echo \"$({NOW})|$(cut -d\" \" -f1 /proc/uptime)\" "
        f">> {TICKS}; sleep 0.02; done' </dev/null >/dev/null 2>&1 &")


def wall(stamp: str) -> float:
    """`stat -c %y`'s "2026-12-05 23:49:01.713873227 +0000" as seconds since the epoch."""
    day, clock, _zone = stamp.split()
    whole, _, frac = clock.partition(".")
    return datetime.fromisoformat(f"{day}T{whole}+00:00").timestamp() + float(f"0.{frac or 0}")
SETTLE_S = 3.0  # ticks before and after each save


def gaps(lines: list[str], since: float) -> tuple[float, float]:
    """The largest wall-clock and uptime gaps between consecutive ticks at or after `since` (guest wall)."""
    ticks = []
    for line in lines:
        stamp, _, uptime = line.partition("|")
        try:
            ticks.append((wall(stamp), float(uptime)))
        except ValueError:
            continue
    ticks = [t for t in ticks if t[0] >= since]
    paused = max((b[0] - a[0] for a, b in itertools.pairwise(ticks)), default=0.0)
    up = max((b[1] - a[1] for a, b in itertools.pairwise(ticks)), default=0.0)
    return paused, up


async def ready_and_first_script(p: Any, machine_id: str, source: Any) -> float:
    """Seconds to make a machine from `source`, see it ready and run its first script; then it goes."""
    t0 = time.monotonic()
    m = await p.create_machine(machine_id, source, timeout=1800)
    try:
        await m.wait_ready(1800)
        res = await m.run_script("exit 0", timeout=120)
        assert res.exit_code == 0, res
        return time.monotonic() - t0
    finally:
        await m.destroy()


async def run(images_dir: Path, state: Path, image: str, saves: int, resumes: int) -> None:
    from providers.base import MachineSource
    from providers.qemu import QemuProvider

    p = QemuProvider(images_dir, state, "bench-savepoint")
    await p.start()
    rows: dict[str, list[tuple[float, float, float, int]]] = {"memory+disk": [], "disk only": []}
    made: list[str] = []
    try:
        m = await p.create_machine("m1", MachineSource(image=image), timeout=1800)
        await m.wait_ready(1800)
        res = await m.run_script(LOOP, timeout=60)
        assert res.exit_code == 0, res
        n = 0
        for _ in range(saves):
            for kind in rows:
                n += 1
                await asyncio.sleep(SETTLE_S)  # ticks before: the loop's own cadence
                since = wall((await m.run_script(NOW, timeout=60)).stdout.strip())
                sp_id = f"bench-sp-{n}"
                t0 = time.monotonic()
                saved = await m.save(sp_id, 1, with_memory=kind == "memory+disk")
                host_s = time.monotonic() - t0
                made.append(sp_id)
                await asyncio.sleep(SETTLE_S)  # ticks after
                out = await m.run_script(f"cat {TICKS}", timeout=60, output_cap=16 * 1024 * 1024)
                paused, up = gaps(out.stdout.splitlines(), since)
                rows[kind].append((host_s, paused, up, saved.size_bytes))
                print(f"{kind:12s} save {n}: host {host_s:6.2f} s  pause {paused:6.2f} s  uptime gap {up:6.2f} s  "
                      f"bytes {saved.size_bytes / 2**20:7.1f} MiB", flush=True)
        print(f"\n{image}, median of {saves} (memory+disk / disk only):")
        med = {k: [statistics.median(col) for col in zip(*v, strict=True)] for k, v in rows.items()}
        for i, name in enumerate(("host s", "pause s", "uptime gap s", "bytes")):
            a, b = med["memory+disk"][i], med["disk only"][i]
            unit = (lambda x: f"{x / 2**20:.1f} MiB") if name == "bytes" else (lambda x: f"{x:.2f}")
            print(f"  {name:13s} {unit(a):>12s} {unit(b):>12s}   ratio {a / b if b else float('nan'):.2f}")
        await m.destroy()
        last = next((sp for sp in reversed(made) if int(sp.rsplit("-", 1)[1]) % 2 == 1), None)  # memory+disk
        if resumes and last is not None:
            times: dict[str, list[float]] = {"resume": [], "cold boot": []}
            for i in range(resumes):
                times["resume"].append(await ready_and_first_script(
                    p, f"r{i}", MachineSource(image=image, start_state_id=last, version=1)))
                times["cold boot"].append(await ready_and_first_script(p, f"c{i}", MachineSource(image=image)))
                print(f"resume {i + 1}: {times['resume'][-1]:6.2f} s   cold boot {times['cold boot'][-1]:6.2f} s",
                      flush=True)
            r, c = statistics.median(times["resume"]), statistics.median(times["cold boot"])
            print(f"\n{image}, median of {resumes}: machine + ready + first script from the save point {r:.2f} s, "
                  f"from the image {c:.2f} s, ratio {r / c:.2f}")
    finally:
        for sp_id in made:
            await p.delete_version(sp_id, 1)
        try:
            await p.reap(keep=set())
        finally:
            await p.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images-dir", type=Path,
                    default=Path(os.environ.get("GH_IMAGES_DIR", "/var/tmp/gh-runner/images")))
    ap.add_argument("--image", default="linux-tiny")
    ap.add_argument("--saves", type=int, default=3)
    ap.add_argument("--resumes", type=int, default=3)
    args = ap.parse_args()
    state = Path(tempfile.mkdtemp(prefix="gh-bench-savepoint-", dir="/var/tmp"))
    os.chmod(state, 0o755)  # libvirt-qemu must reach the overlays
    try:
        asyncio.run(run(args.images_dir, state, args.image, args.saves, args.resumes))
    finally:
        shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
