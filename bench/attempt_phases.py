"""Wall time of the example set per attempt, split into phases, cold vs warm start, in one run.

    .venv/bin/python bench/attempt_phases.py [--images-dir DIR] [--cases examples/linux-basics.yaml]
                                             [--rounds N] [--keys FIL-01,PRM-01]

Every example case is run as real attempts (`gh_runner.attempt.Attempt` on the QEMU provider) with
the built-in reference agent's behaviour (its `reference_fix` through an exec request, then its
answer), twice side by side:

  cold   a fresh overlay on the linux-tiny image, booted (what an image start state does)
  warm   a fresh overlay on a saved start-state version restored from its memory image

and prints, per attempt and as medians, machine (create + guest ready), setup, checks (before +
after), task and teardown (screens included in `other`), and the cold/warm ratio. No control
plane is involved: this measures the runner's side of an attempt. Everything it makes is named
gh-bench-phases-* and removed at the end, even on failure.

Then (`--throughput-rounds`, 0 to skip) attempts per minute on `--slots` slots, every case once per
round, and the median of each phase, four ways interleaved round by round:

  lazy-old  machines restored lazily from the image's warm snapshot, teardown in the background,
            scripts run the old way (bench/legacy_exec.py: the clock by guest-set-time and
            its `hwclock -w`, polls from 20 ms, the wrapper of 6 processes)
  pool-old  as lazy-old, plus a hot pool (2 paused machines per source, 1 GiB, a refill 3 s after a
            take): today's pool figure
  lazy-new  lazy machines, scripts as the runner runs them now: through gh-execd, linux-tiny's resident
            executor (else qemu-ga: the clock in the first exec, polls from 1 ms, the wrapper of 2
            processes)
  pool-new  as lazy-new, plus the hot pool as the runner configures it (its machines primed with a
            script too, through gh-execd)

(`--with-cold` adds booted machines, the slot held until the destroy: the runner before warm snapshots;
`--refill-delays 0,3` adds pool-new with those waits between a take and the refill, as pool-r0,
pool-r3.) The host's CPU busy share while each mode's batches ran says whether it was bound by
the 2 cores or by waiting.
The warm snapshot is built before the clock starts (once per image per runner; its time is
printed). The host may be shared: numbers are noisy, ratios from one run are what counts.
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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml

from bench.legacy_exec import legacy
from gh_runner.attempt import Attempt
from gh_runner.config import Timeouts
from gh_wire.protocol import FrozenCase, Lease, Limits, MachineRequest, StartStateRef, TaskEnd
from providers.base import MachineSource
from providers.qemu import QemuProvider
from providers.qemu.pool import PoolConfig

RUNNER = "bench-phases"
STATE_ID = "ss_benchphases"
GROUPS = ("machine", "setup", "checks", "task", "teardown", "other")
KEEP = frozenset({MachineSource(image="linux-tiny")})  # the pools fill at start, as they did before demand


def group(phase_seconds: Mapping[str, float]) -> dict[str, float]:
    g = dict.fromkeys(GROUPS, 0.0)
    for name, secs in phase_seconds.items():
        if name in ("machine", "ready"):
            g["machine"] += secs
        elif name in ("check_before", "check_after"):
            g["checks"] += secs
        elif name in ("setup", "task", "teardown"):
            g[name] += secs
        else:
            g["other"] += secs
    return g


class ReferenceLink:
    """The daemon's side of an attempt, reduced to what the bench needs: when the task starts, do
    what the built-in `reference` agent does (run the fix through an exec request, then answer)."""

    def __init__(self, case: Mapping[str, Any]) -> None:
        self.case = case
        self.attempt: Attempt | None = None
        self._agent: asyncio.Task[None] | None = None

    async def status(self, status: str, phase: str) -> None:
        if status == "running" and self.attempt is not None:
            self._agent = asyncio.create_task(self._reference(self.attempt))

    async def frame(self, label: str, png: bytes, event: dict[str, Any] | None) -> None:
        return None

    async def save_point_made(self, point: Any) -> None:
        return None

    async def _reference(self, attempt: Attempt) -> None:
        meta = self.case.get("metadata") or {}
        fix = meta.get("reference_fix")
        if fix:
            req = MachineRequest(request_id="bench", attempt_id=attempt.machine_id, op="exec", script=fix, timeout=120)
            deadline = time.monotonic() + 30
            while True:  # the request is served once the task phase is open
                resp = await attempt.handle_request(req)
                if resp.ok or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.02)
        attempt.task_end(TaskEnd(attempt_id=attempt.machine_id, answer=str(meta.get("reference_answer") or "")))


async def one_attempt(provider: QemuProvider, case: Mapping[str, Any], aid: str, warm: bool,
                      *, background_teardown: bool = False, image_only: bool = False) -> dict[str, Any]:
    frozen = FrozenCase(
        test_case_id=str(case.get("key")), key=case.get("key"), name=str(case["name"]), prompt=str(case["prompt"]),
        setup_script=case.get("setup_script"), check_script=(case.get("success") or {}).get("check_script"),
        limits=Limits(**(case.get("limits") or {})),
    )
    ref = (StartStateRef(kind="state", image="linux-tiny", start_state_id=STATE_ID, version=1)
           if warm and not image_only else StartStateRef(kind="image", image="linux-tiny"))
    lease = Lease(attempt_id=aid, agent_id="reference", case=frozen, start_state=ref)
    link = ReferenceLink(case)
    attempt = Attempt(lease, provider, link, Timeouts(), background_teardown=background_teardown)
    link.attempt = attempt
    t0 = time.monotonic()
    result = await attempt.run()
    wall = time.monotonic() - t0
    return {"key": case.get("key"), "mode": "warm" if warm else "cold", "outcome": result.outcome,
            "error": result.error, "wall": wall, "origin": result.metrics.machine_origin,
            "attempt": attempt, "phase_seconds": dict(result.metrics.phase_seconds),
            **group(result.metrics.phase_seconds)}


async def batch(provider: QemuProvider, cases: list[dict[str, Any]], slots: int, tag: str,
                background_teardown: bool) -> tuple[float, list[dict[str, Any]]]:
    """Every case once on `slots` slots; seconds until the last slot is free, and the rows."""
    sem = asyncio.Semaphore(slots)
    rows: list[dict[str, Any]] = []
    teardowns: list[Attempt] = []

    async def slot(i: int, case: dict[str, Any]) -> None:
        async with sem:  # the slot is held for what Attempt.run takes: with background teardown, not the destroy
            r = await one_attempt(provider, case, f"at_{tag}{i}", True, background_teardown=background_teardown,
                                  image_only=True)
            rows.append(r)
            teardowns.append(r.pop("attempt"))

    t0 = time.monotonic()
    await asyncio.gather(*(slot(i, c) for i, c in enumerate(cases)))
    wall = time.monotonic() - t0
    for a in teardowns:
        await a.wait_torn_down()  # not timed: the slots were free already
    return wall, rows


def cpu_ticks() -> tuple[int, int]:
    """The host's (busy, total) CPU ticks so far, all cores (/proc/stat): how much of the 2 cores a
    batch kept busy says whether its attempts per minute were bound by the CPU or by waiting."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # guest time is counted in user already
    return total - idle, total


async def pool_full(counts: Callable[[], Mapping[MachineSource, int]], n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while counts().get(MachineSource(image="linux-tiny"), 0) < n:
        if time.monotonic() > deadline:
            raise TimeoutError("the hot pool did not fill in time")
        await asyncio.sleep(0.1)


PHASES = ("machine", "ready", "setup", "check_before", "first_screen", "task", "check_after", "last_screen")


async def throughput(images_dir: Path, state: Path, cases: list[dict[str, Any]], slots: int, rounds: int,
                     with_cold: bool, refill_delays: list[float]) -> None:
    """Attempts per minute and the phases' medians, the old way of running scripts and today's side by side."""
    provs = {
        "lazy-old": legacy(QemuProvider(images_dir, state / "warm", RUNNER + "-lazyold", warm_snapshots=True)),
        "pool-old": legacy(QemuProvider(images_dir, state / "warm", RUNNER + "-poolold", warm_snapshots=True,
                                        pool=PoolConfig(per_source=2, total_mib=1024, keep=KEEP, refill_delay_s=3.0))),
        "lazy-new": QemuProvider(images_dir, state / "warm", RUNNER + "-lazynew", warm_snapshots=True),
        "pool-new": QemuProvider(images_dir, state / "warm", RUNNER + "-poolnew", warm_snapshots=True,
                                 pool=PoolConfig(per_source=2, total_mib=1024, keep=KEEP)),
    }
    for delay in refill_delays:  # the same with another wait before a refill, side by side
        provs[f"pool-r{delay:g}"] = QemuProvider(
            images_dir, state / "warm", RUNNER + f"-poolr{delay:g}".replace(".", ""), warm_snapshots=True,
            pool=PoolConfig(per_source=2, total_mib=1024, keep=KEEP, refill_delay_s=delay))
    if with_cold:
        provs = {"cold": QemuProvider(images_dir, state / "before", RUNNER + "-before"), **provs}
    for d in ("before", "warm"):
        (state / d).mkdir(mode=0o755)
    walls: dict[str, float] = dict.fromkeys(provs, 0.0)
    cpu: dict[str, list[int]] = {k: [0, 0] for k in provs}  # busy, total ticks while its batches ran
    done: dict[str, int] = dict.fromkeys(provs, 0)
    origins: dict[str, set[str]] = {k: set() for k in provs}
    phases: dict[str, dict[str, list[float]]] = {k: {ph: [] for ph in PHASES} for k in provs}
    try:
        t = time.monotonic()
        await provs["lazy-new"].start()
        m = await provs["lazy-new"].create_machine("bench-phases-warmup", MachineSource(image="linux-tiny"),
                                                   timeout=600)
        await m.destroy()
        print(f"warm snapshot built in {time.monotonic() - t:.1f} s (once per image per runner, not timed below)")
        for p in provs.values():
            await p.start()
        for rnd in range(rounds):
            order = list(provs) if rnd % 2 == 0 else list(reversed(provs))
            for mode in order:
                # A runner's pool fills while it waits for leases: not timed. Every mode's pool is
                # full first, so no other mode's refill runs beside this batch and takes its CPU.
                for other in provs.values():
                    if other.pool is not None:
                        await pool_full(other.pool.counts, 2, 600)
                busy0, total0 = cpu_ticks()
                wall, rows = await batch(provs[mode], cases, slots, f"{mode.replace('-', '')}{rnd}x",
                                         mode != "cold")
                busy1, total1 = cpu_ticks()
                cpu[mode][0] += busy1 - busy0
                cpu[mode][1] += total1 - total0
                walls[mode] += wall
                done[mode] += sum(r["outcome"] != "error" for r in rows)
                origins[mode] |= {str(r["origin"]) for r in rows}
                for r in rows:
                    if r["outcome"] != "error":
                        for ph in PHASES:
                            phases[mode][ph].append(r["phase_seconds"].get(ph, 0.0))
                errors = [r["error"] for r in rows if r["error"]]
                print(f"  round {rnd + 1} {mode}: {len(rows)} attempts in {wall:.1f} s"
                      + (f" ({len(errors)} errors: {errors[0][:80]})" if errors else ""), flush=True)
        print(f"\nmedian seconds per phase ({len(cases)} cases x {rounds} rounds per mode, errors left out)")
        print(f"{'':9}" + "".join(f"{ph:>13}" for ph in PHASES))
        for mode in provs:
            print(f"{mode:9}" + "".join(f"{_med(phases[mode][ph]):13.3f}" for ph in PHASES))
        print(f"\nattempts per minute on {slots} slots ({len(cases)} cases x {rounds} rounds, errors not counted)")
        base = done["pool-old"] / walls["pool-old"] * 60 if walls["pool-old"] else float("nan")
        for mode in provs:
            apm = done[mode] / walls[mode] * 60 if walls[mode] else float("nan")
            made = ", ".join(sorted(origins[mode]))
            busy = cpu[mode][0] / cpu[mode][1] * 100 if cpu[mode][1] else float("nan")
            print(f"  {mode:9} {apm:6.1f}/min  ({apm / base:4.2f}x pool-old)  host CPU busy {busy:3.0f}%  "
                  f"machines: {made}")
    finally:
        for p in provs.values():
            try:
                await p.reap(keep=set())
            finally:
                await p.close()


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


async def make_warm_state(provider: QemuProvider) -> None:
    m = await provider.create_machine("bench-phases-src", MachineSource(image="linux-tiny"), timeout=180)
    try:
        await m.wait_ready(180)
        await m.save(STATE_ID, 1, with_memory=True)
    finally:
        await m.destroy()


def _median(rows: list[dict[str, Any]], col: str) -> float:
    return statistics.median(r[col] for r in rows) if rows else float("nan")


def report(rows: list[dict[str, Any]]) -> None:
    cols = ("machine", "setup", "checks", "task", "teardown", "other", "wall")
    print(f"{'case':8} {'mode':5} {'outcome':8}" + "".join(f"{c:>9}" for c in cols))
    for r in rows:
        print(f"{r['key']:8} {r['mode']:5} {r['outcome']:8}" + "".join(f"{r[c]:9.2f}" for c in cols)
              + (f"  ({r['error'][:80]})" if r["error"] else ""))
    cold = [r for r in rows if r["mode"] == "cold" and r["outcome"] != "error"]
    warm = [r for r in rows if r["mode"] == "warm" and r["outcome"] != "error"]
    print()
    print(f"median seconds per attempt (n cold={len(cold)}, warm={len(warm)}; errors left out)")
    print(f"{'':15}" + "".join(f"{c:>9}" for c in cols))
    print(f"{'cold':15}" + "".join(f"{_median(cold, c):9.2f}" for c in cols))
    print(f"{'warm':15}" + "".join(f"{_median(warm, c):9.2f}" for c in cols))
    ratio = [(_median(cold, c) / _median(warm, c)) if _median(warm, c) > 0 else float("nan") for c in cols]
    print(f"{'cold/warm':15}" + "".join(f"{x:8.1f}x" for x in ratio))
    passed = sum(r["outcome"] == "passed" for r in rows)
    print(f"\nreference passed {passed}/{len(rows)} attempts")


ROOT = Path(__file__).resolve().parent.parent


async def run(images_dir: Path, state: Path, cases: list[dict[str, Any]], rounds: int) -> None:
    provider = QemuProvider(images_dir, state, RUNNER)
    rows: list[dict[str, Any]] = []
    try:
        t = time.monotonic()
        await make_warm_state(provider)
        print(f"warm start state saved in {time.monotonic() - t:.1f} s\n", flush=True)
        n = 0
        for rnd in range(rounds):
            for case in cases:
                # Alternate which goes first so drift in host load hits both modes alike.
                order = (False, True) if (n % 2 == 0) else (True, False)
                for warm in order:
                    n += 1
                    rows.append(await one_attempt(provider, case, f"at_bench{rnd}x{n}", warm))
                    r = rows[-1]
                    print(f"  {r['key']} {r['mode']}: {r['outcome']} in {r['wall']:.1f} s", flush=True)
        print()
        report(rows)
    finally:
        try:
            await provider.reap(keep=set())
            await provider.delete_version(STATE_ID, 1)
        finally:
            await provider.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images-dir", type=Path,
                    default=Path(os.environ.get("GH_IMAGES_DIR", "/var/tmp/gh-runner/images")))
    ap.add_argument("--cases", type=Path, default=ROOT / "examples" / "linux-basics.yaml")
    ap.add_argument("--rounds", type=int, default=1, help="cold+warm pairs per case")
    ap.add_argument("--keys", default="", help="only these case keys (comma-separated)")
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--throughput-rounds", type=int, default=2, help="rounds of the attempts-per-minute part")
    ap.add_argument("--skip-phases", action="store_true", help="only the attempts-per-minute part")
    ap.add_argument("--with-cold", action="store_true", help="also booted machines in the attempts-per-minute part")
    ap.add_argument("--refill-delays", default="",
                    help="also pool-new with these waits before a refill (comma-separated seconds): pool-rN rows")
    args = ap.parse_args()
    cases = yaml.safe_load(args.cases.read_text())["cases"]
    if args.keys:
        wanted = set(args.keys.split(","))
        cases = [c for c in cases if c.get("key") in wanted]
    state = Path(tempfile.mkdtemp(prefix="gh-bench-phases-", dir="/var/tmp"))
    state.chmod(0o755)  # libvirt-qemu must reach the overlays
    try:
        if not args.skip_phases:
            asyncio.run(run(args.images_dir, state, cases, args.rounds))
        if args.throughput_rounds > 0:
            delays = [float(x) for x in args.refill_delays.split(",") if x.strip()]
            asyncio.run(throughput(args.images_dir, state, cases, args.slots, args.throughput_rounds,
                                   args.with_cold, delays))
    finally:
        shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
