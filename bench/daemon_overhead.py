#!/usr/bin/env python3
"""How much the runner daemon itself costs per attempt, measured side by side in one run.

One daemon (real websocket session, real fsync'd journal on /var/tmp, JSON logging) against the
test gateway peer (tests/runner/peer.py), with the fast provider double (no VM: every provider
call returns at once). Three measurements:

1. latency, one slot: lease sent -> attempt_result received, against the same attempt run directly
   (no daemon, no websocket, a no-op link). The difference is what the daemon adds per attempt
   (journal writes, websocket round trips, status relays, logging).
2. throughput, 32 slots: leases per second through the daemon with 32 attempts always in flight,
   against running the same attempts directly 32 at a time.
3. liveness under that load: the gaps between the runner's heartbeats (interval 0.5 s here) and
   whether the runner ever dropped the session (a missed heartbeat would show as a reconnect).

Usage: .venv/bin/python bench/daemon_overhead.py [--attempts 2000] [--latency-attempts 200]
       [--slots 32] [--attempt scripted|real]
`scripted` is the minimal attempt double (isolates the daemon); `real` is gh_runner.attempt.Attempt
on the provider double (setup, checks, screenshots: more status and replay traffic per attempt).
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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from pydantic import SecretStr  # noqa: E402
from runner.doubles import FakeProvider, ScriptedAttempt  # noqa: E402
from runner.peer import Peer, make_lease  # noqa: E402

from gh_common.timeouts import within  # noqa: E402
from gh_runner.config import RunnerConfig  # noqa: E402
from gh_runner.daemon import Daemon  # noqa: E402
from gh_runner.log import configure_logging  # noqa: E402
from gh_wire.protocol import AttemptFinished, AttemptStatus, TaskEnd  # noqa: E402

HEARTBEAT = 0.5


class NullLink:
    def __init__(self, attempt: Any = None) -> None:
        self.attempt = attempt

    async def status(self, status: str, phase: str) -> None:
        if phase == "task" and self.attempt is not None and hasattr(self.attempt, "task_end"):
            self.attempt.task_end(TaskEnd(attempt_id=self.attempt.machine_id, answer="done"))

    async def frame(self, label: str, png: bytes, event: dict[str, Any] | None) -> None:
        return None

    async def save_point_made(self, point: Any) -> None:
        return None


def attempt_factory(kind: str) -> Any:
    if kind == "scripted":
        class Quick(ScriptedAttempt):
            hold = 0.0  # ends as soon as its machine is up

        return Quick
    from gh_runner.attempt import Attempt

    def make(lease: Any, provider: Any, link: Any, timeouts: Any) -> Any:
        return Attempt(lease, provider, link, timeouts)

    return make


async def run_direct(kind: str, n: int, concurrency: int) -> tuple[float, list[float]]:
    """Run n attempts without the daemon; returns (wall seconds, per-attempt run seconds)."""
    factory = attempt_factory(kind)
    provider = FakeProvider()
    from gh_runner.config import Timeouts

    durations: list[float] = []
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            link = NullLink()
            a = factory(make_lease(f"at_direct{i}"), provider, link, Timeouts())
            link.attempt = a
            t = time.perf_counter()
            r = await a.run()
            durations.append(time.perf_counter() - t)
            assert r.outcome == "passed", r

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - t0, durations


async def run_daemon(kind: str, n: int, slots: int, state_dir: Path) -> dict[str, Any]:
    peer = Peer(heartbeat_interval=HEARTBEAT, dead_after=HEARTBEAT * 6, record=False)
    await peer.start()
    cfg = RunnerConfig(server=peer.url, token=SecretStr(Peer.token), name="bench", slots=slots, state_dir=state_dir,
                       images_dir=state_dir / "images", result_resend=30, reap_interval=3600)
    daemon = Daemon(cfg, FakeProvider(), attempt_factory=attempt_factory(kind), jobs=None)
    task = asyncio.create_task(daemon.run())
    await peer.wait_type("hello")
    await peer.wait_type("heartbeat")

    sent_at: dict[str, float] = {}
    latencies: list[float] = []
    next_i = 0
    done = asyncio.Event()

    async def send_next() -> None:
        nonlocal next_i
        if next_i >= n:
            return
        aid = f"at_b{next_i}"
        next_i += 1
        sent_at[aid] = time.perf_counter()
        await peer.send(make_lease(aid))

    async def on_message(msg: Any) -> None:
        if isinstance(msg, AttemptFinished):
            aid = msg.result.attempt_id
            latencies.append(time.perf_counter() - sent_at[aid])
            assert msg.result.outcome == "passed", msg.result
            if len(latencies) == n:
                done.set()
            await send_next()
        elif isinstance(msg, AttemptStatus) and msg.phase == "task":
            await peer.send(TaskEnd(attempt_id=msg.attempt_id, answer="done"))
        elif getattr(msg, "type", "") == "lease_refuse":
            raise AssertionError(f"lease refused: {msg}")

    peer.on_message = on_message
    hb_start = len(peer.received)
    t0 = time.perf_counter()
    for _ in range(min(slots, n)):
        await send_next()
    await within(max(120.0, n * 0.5), done.wait())
    wall = time.perf_counter() - t0
    beats = [r.at for r in peer.received[hb_start:] if getattr(r.msg, "type", "") == "heartbeat"]
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    connections = daemon.session.connections
    daemon.request_stop()
    await within(60, task)
    peer.kill()
    await peer.stop()
    return {"wall": wall, "latencies": latencies, "gaps": gaps, "connections": connections}


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attempts", type=int, default=2000)
    ap.add_argument("--latency-attempts", type=int, default=200)
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--attempt", choices=("scripted", "real"), default="scripted")
    args = ap.parse_args()
    with open(os.devnull, "w") as devnull:
        configure_logging("json", "info", stream=devnull)  # formatting cost counted, output dropped
        base = Path(tempfile.mkdtemp(prefix="gh-bench-", dir="/var/tmp"))
        shm = Path("/dev/shm")
        mem_dir = Path(tempfile.mkdtemp(prefix="gh-bench-", dir=shm)) if shm.is_dir() else None
        try:
            return asyncio.run(measure(args, base, mem_dir))
        finally:
            shutil.rmtree(base, ignore_errors=True)
            if mem_dir is not None:
                shutil.rmtree(mem_dir, ignore_errors=True)


async def measure(args: argparse.Namespace, base: Path, mem_dir: Path | None) -> int:
    print(f"attempt={args.attempt} slots={args.slots} attempts={args.attempts} heartbeat={HEARTBEAT}s "
          f"journal on {base}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    # 1. latency, one slot at a time.
    m = args.latency_attempts
    _, direct_runs = await run_direct(args.attempt, m, 1)
    seq = await run_daemon(args.attempt, m, 1, base / "seq")
    d_med, v_med = statistics.median(direct_runs), statistics.median(seq["latencies"])
    over = [x - d_med for x in seq["latencies"]]
    print("\n1. latency, 1 slot (lease -> result, vs the same attempt run directly)")
    print(f"   direct run      median {d_med * 1000:7.2f} ms")
    print(f"   via daemon      median {v_med * 1000:7.2f} ms   p95 {pct(seq['latencies'], 0.95) * 1000:7.2f} ms")
    print(f"   daemon overhead median {statistics.median(over) * 1000:7.2f} ms   "
          f"p95 {pct(over, 0.95) * 1000:7.2f} ms   (target < 5 ms)   ratio via/direct {v_med / d_med:5.1f}x")
    m_med = 0.0
    if mem_dir is not None:
        mem = await run_daemon(args.attempt, m, 1, mem_dir / "seq")
        m_med = statistics.median(mem["latencies"])
        print(f"   journal on tmpfs median {m_med * 1000:7.2f} ms   -> the disk's share of the overhead "
              f"{(v_med - m_med) * 1000:6.2f} ms (disk/tmpfs {v_med / m_med:4.1f}x)")

    # 2 and 3. throughput with all slots busy, and heartbeats meanwhile.
    n = args.attempts
    d_wall, _ = await run_direct(args.attempt, n, args.slots)
    par = await run_daemon(args.attempt, n, args.slots, base / "par")
    d_rate, v_rate = n / d_wall, n / par["wall"]
    per_attempt = (1 / v_rate - 1 / d_rate) * 1000
    print(f"\n2. throughput, {args.slots} slots busy, {n} attempts")
    print(f"   direct          {d_rate:8.1f} attempts/s")
    print(f"   via daemon      {v_rate:8.1f} leases/s   ratio {v_rate / d_rate:5.2f}")
    print(f"   daemon cost     {per_attempt:7.2f} ms of host time per attempt (incl. the gateway peer's side)")
    gaps = par["gaps"]
    missed = sum(1 for g in gaps if g > 2 * HEARTBEAT)
    print(f"\n3. liveness under load: {len(gaps) + 1} heartbeats, interval {HEARTBEAT}s, "
          f"max gap {max(gaps, default=0):.3f}s, gaps > 2x interval: {missed}, "
          f"session reconnects: {par['connections'] - 1}")
    own = (m_med - d_med) if mem_dir is not None else statistics.median(over)
    ok = own < 0.005 and missed == 0 and par["connections"] == 1
    print(f"\nresult: {'OK' if ok else 'OVER TARGET'}: the daemon's own overhead {own * 1000:.2f} ms per attempt "
          f"(journal on tmpfs); the durable result journal on this disk adds {(v_med - d_med - own) * 1000:.2f} ms "
          "of fsync latency, which depends on the disk and how busy it is")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
