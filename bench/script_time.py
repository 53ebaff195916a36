"""Where the time of a short script goes, on a machine leased from the hot pool.

    .venv/bin/python bench/script_time.py [--images-dir DIR] [--tries 10]

Three providers side by side in one run, their leases interleaved, each with a hot pool on linux-tiny:

  old   the old way (bench/legacy_exec.py): the clock set by qemu-ga's guest-set-time
        beside ready (its `hwclock -w` in the guest), guest-exec-status polled from 20 ms (x1.5,
        at most 250 ms), the wrapper of 6 processes, pooled machines primed with a ping only
  qga   the clock set by the first script's own guest-exec (`date -s` in the wrapper), polls
        from 1 ms (x2, at most 50 ms), the wrapper of 2 processes (3 with the clock), pooled
        machines primed with a script too
  new   as qga, but scripts through gh-execd, the image's resident executor (providers/qemu/
        execd.py): one request on its own port, the clock set and the RNG reseeded by system
        calls, one fork; pooled machines primed through it (which connects it, and sets the clock)

Per lease: `lease` (take + resume), `ready` (the guest agent answers), `first` (the first script
`true`, lease to its result) and `second` (another `true`), and the guest-agent calls of the
first script: guest-set-time (old), guest-exec, the guest-exec-status polls (how many, their own
round trips, and the sleeps between them). Then the floors on one warm machine: a guest-ping, a
guest-exec of /bin/true polled at once, the wrapper around `true`, the wrapper that also sets the
clock, the one that also reseeds the guest's RNG (a restored machine's first script), a
guest-set-time on its own, and the same `true` through gh-execd, plain and with the clock and the
reseed (`--floors-only`: just these). Machines are named gh-bench-script-* and removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.legacy_exec import legacy
from providers.base import MachineSource
from providers.qemu import QemuMachine, QemuProvider
from providers.qemu.guest_agent import RESEED_BYTES, ROOT_SH, GuestAgent, Polling, clock_ms, script_env
from providers.qemu.pool import PoolConfig

TINY = MachineSource(image="linux-tiny")
MODES = ("old", "qga", "new")

# Every guest-agent call of the domain being measured: (command, seconds).
CALLS: dict[str, list[tuple[str, float]]] = defaultdict(list)
_command = GuestAgent.command


async def _timed_command(self: GuestAgent, execute: str, arguments: dict[str, Any] | None = None, *,
                         timeout: float | None = None) -> Any:
    t = time.monotonic()
    try:
        return await _command(self, execute, arguments, timeout=timeout)
    finally:
        CALLS[self.domain_name].append((execute, time.monotonic() - t))


GuestAgent.command = _timed_command  # type: ignore[method-assign]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))] if s else float("nan")


async def until_pooled(p: QemuProvider, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    assert p.pool is not None
    while p.pool.counts().get(TINY, 0) < 1:
        if time.monotonic() > deadline:
            raise TimeoutError("the hot pool did not refill in time")
        await asyncio.sleep(0.05)


async def lease(p: QemuProvider, mid: str) -> dict[str, float]:
    t0 = time.monotonic()
    m = await p.create_machine(mid, TINY, timeout=300)
    assert isinstance(m, QemuMachine) and m.origin == "pooled", m.origin
    try:
        t1 = time.monotonic()
        await m.wait_ready(60)
        t2 = time.monotonic()
        CALLS[m.domain_name].clear()
        res = await m.run_script("true", timeout=60)
        t3 = time.monotonic()
        assert res.exit_code == 0, res.stderr
        calls = list(CALLS[m.domain_name])
        res = await m.run_script("true", timeout=60)
        t4 = time.monotonic()
        polls = [d for c, d in calls if c == "guest-exec-status"]
        execs = [d for c, d in calls if c == "guest-exec"]
        set_time = [d for c, d in calls if c == "guest-set-time"]  # old: beside ready, the script waits
        return {"lease": t1 - t0, "ready": t2 - t1, "first": t3 - t0, "first_exec": t3 - t2,
                "second": t4 - t3, "set_time": sum(set_time), "guest_exec_call": sum(execs), "polls": float(len(polls)),
                "poll_calls": sum(polls),
                "poll_sleeps": max(0.0, (t3 - t2) - sum(d for _, d in calls))}
    finally:
        await m.destroy()


async def floors(p: QemuProvider, tries: int) -> dict[str, list[float]]:
    """Round trips on one warm machine: what a script costs at the least."""
    m = await p.create_machine("floors", TINY, timeout=300)
    assert isinstance(m, QemuMachine)
    out: dict[str, list[float]] = defaultdict(list)
    try:
        await m.wait_ready(60)
        await m.run_script("true", timeout=60)
        tight = GuestAgent(m.domain, polling=Polling(first_s=0.0005, growth=1.0, cap_s=0.0005))
        for _ in range(tries):
            t = time.monotonic()
            await m.agent.ping()
            out["guest-ping"].append(time.monotonic() - t)
            t = time.monotonic()
            pid = await tight.exec_start("/bin/true", [], capture=True)
            out["guest-exec (call)"].append(time.monotonic() - t)
            st = await tight.wait_exec(pid, time.monotonic() + 30)
            assert st is not None
            out["guest-exec /bin/true, polled at once"].append(time.monotonic() - t)
            t = time.monotonic()
            await tight.run_sh("true", env=None, timeout=30)
            out["wrapper + `true`, polled at once"].append(time.monotonic() - t)
            t = time.monotonic()
            await tight.run_sh("true", env=None, timeout=30, set_clock=True)
            out["wrapper + date -s + `true`, polled at once"].append(time.monotonic() - t)
            t = time.monotonic()
            await tight.run_sh("true", env=None, timeout=30, set_clock=True, reseed=True)
            out["wrapper + date -s + gh-reseed + `true`, at once"].append(time.monotonic() - t)
            t = time.monotonic()
            await m.agent.set_time()
            out["guest-set-time (hwclock -w)"].append(time.monotonic() - t)
            assert m.execd is not None
            env = script_env(ROOT_SH, None)
            t = time.monotonic()
            await m.execd.run("true", env, interpreter="/bin/sh", timeout=30, output_cap=0)
            out["gh-execd + `true`"].append(time.monotonic() - t)
            t = time.monotonic()
            await m.execd.run("true", env, interpreter="/bin/sh", timeout=30, output_cap=0, clock_ms=clock_ms(),
                              reseed=secrets.token_bytes(RESEED_BYTES))
            out["gh-execd + clock + reseed + `true`"].append(time.monotonic() - t)
    finally:
        await m.destroy()
    return out


async def run(images_dir: Path, state: Path, tries: int, floors_only: bool = False) -> None:
    pool = PoolConfig(per_source=1, total_mib=1 << 16)
    provs = {k: QemuProvider(images_dir, state, f"bench-script-{k}", warm_snapshots=True, pool=pool) for k in MODES}
    legacy(provs["old"])
    provs["qga"].resident_exec = False
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in MODES}
    try:
        if floors_only:
            await provs["new"].start()
            print(f"floors on one warm machine (n={tries}), median ms")
            for k, v in (await floors(provs["new"], tries)).items():
                print(f"  {k:45} {statistics.median(v) * 1000:8.1f}")
            return
        t = time.monotonic()
        for p in provs.values():  # one at a time: the first builds the warm snapshot they share
            await p.start()
            await until_pooled(p, 600)
        print(f"warm snapshot built and pools filled in {time.monotonic() - t:.1f} s", flush=True)
        for i in range(tries):
            for mode in (MODES if i % 2 == 0 else MODES[::-1]):
                await until_pooled(provs[mode], 300)  # refills are not timed
                rows[mode].append(await lease(provs[mode], f"{mode}-{i}"))
            print(f"  try {i + 1}/{tries}: " + "  ".join(f"{m} first {rows[m][-1]['first']:.3f}" for m in MODES),
                  flush=True)
        cols = ("lease", "ready", "first_exec", "first", "second", "set_time", "guest_exec_call", "polls", "poll_calls",
                "poll_sleeps")
        print(f"\nmedian seconds per pooled lease (n={tries} each; `first` is lease to the first script's result)")
        print(f"{'':5}" + "".join(f"{c:>16}" for c in cols))
        for mode in MODES:
            print(f"{mode:5}" + "".join(f"{statistics.median(r[c] for r in rows[mode]):16.3f}" for c in cols))
        for mode in MODES:
            f = [r["first"] for r in rows[mode]]
            print(f"{mode}: first script after a pooled lease p50 {pct(f, 0.5) * 1000:.0f} ms, "
                  f"p90 {pct(f, 0.9) * 1000:.0f} ms")
        o, q, n = (statistics.median(r["first"] for r in rows[m]) for m in MODES)
        print(f"old/new: {o / n:.1f}x   qga/new: {q / n:.1f}x")

        print(f"\nfloors on one warm machine (n={tries}), median ms")
        for k, v in (await floors(provs["new"], tries)).items():
            print(f"  {k:45} {statistics.median(v) * 1000:8.1f}")
    finally:
        for p in provs.values():
            try:
                await p.reap(keep=set())
            finally:
                await p.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images-dir", type=Path,
                    default=Path(os.environ.get("GH_IMAGES_DIR", "/var/tmp/gh-runner/images")))
    ap.add_argument("--tries", type=int, default=10)
    ap.add_argument("--floors-only", action="store_true", help="only the floors on one warm machine")
    args = ap.parse_args()
    state = Path(tempfile.mkdtemp(prefix="gh-bench-script-", dir="/var/tmp"))
    state.chmod(0o755)  # libvirt-qemu must reach the overlays
    try:
        asyncio.run(run(args.images_dir, state, args.tries, args.floors_only))
    finally:
        shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
