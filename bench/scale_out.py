"""Scale-out benchmark: gh-server processes on one PostgreSQL behind HAProxy, simulated runners.

Part 1 (throughput), measured side by side in one run on the same database server: attempts/s applied
with 1 process and with 3 behind HAProxy (the ratio), and p50/p99 lease latency (queued -> leased).
Part 2 (chaos): N attempts over R runners x S slots while one server process is SIGKILLed and restarted
every --kill-every seconds and 10% of the runners are killed and restarted each time. Printed: lost
attempts (a try with no final outcome), attempts applied twice (a result applied again would make a
second retry of one attempt, or a retry of a finished one), runs not completed; all must be 0.

    .venv/bin/python bench/scale_out.py [--attempts 3000] [--runners 50] [--slots 8]
    .venv/bin/python bench/scale_out.py --chaos-only --chaos-attempts 20000 --runners 100 --slots 8

Needs PostgreSQL and HAProxy (scripts/setup.sh installs both); runs as root (the throwaway cluster
runs as the postgres user, tests/server/pg.py).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "tests"))  # as pytest has it: the test kit

from sqlalchemy import func, select

from gh_common.timeouts import within
from gh_server.models import Attempt
from tests.gateway.loadrunner import LoadRunner
from tests.gateway.rows import DbRows
from tests.gateway.topology import Topology
from tests.server.pg import PgCluster, start_cluster

SETTINGS: dict[str, Any] = {"heartbeat_interval": 2.0, "dead_after": 10.0, "runner_grace_seconds": 10.0}


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def lease_latencies(rows: DbRows, run_id: str) -> list[float]:
    with rows.session() as s:
        got = s.execute(select(Attempt.created_at, Attempt.leased_at)
                        .where(Attempt.test_run_id == run_id, Attempt.leased_at.is_not(None))).all()
    return [(leased - created).total_seconds() for created, leased in got]


async def start_runners(rows: DbRows, url: str, n: int, slots: int, work_s: float) -> list[LoadRunner]:
    runners = []
    for i in range(n):
        _, token = rows.add_runner(f"load-{i}")
        lr = LoadRunner(url, token, f"load-{i}", slots=slots, work_s=work_s)
        lr.start()
        runners.append(lr)
    for lr in runners:
        await within(120, lr.connected.wait())
    return runners


def completed(rows: DbRows, run_ids: list[str]) -> set[str]:
    return {r for r in run_ids if rows.run(r).status == "completed"}


async def wait_completed(rows: DbRows, run_id: str, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if await asyncio.to_thread(lambda: rows.run(run_id).status == "completed"):
            return time.monotonic() - t0
        await asyncio.sleep(0.2)
    raise RuntimeError(f"run {run_id} not completed within {timeout} s")


async def throughput(cluster: PgCluster, processes: int, attempts: int, n_runners: int, slots: int) -> dict[str, Any]:
    url = cluster.url(cluster.create_db())
    rows = DbRows(url)
    topo = await asyncio.to_thread(lambda: Topology(url, processes, **SETTINGS).start())
    runners: list[LoadRunner] = []
    try:
        runners = await start_runners(rows, topo.proxy.ws_url, n_runners, slots, 0.0)
        cases = max(1, attempts // 10)
        t0 = time.monotonic()
        run_id, ids = await asyncio.to_thread(lambda: rows.add_run([{}] * cases, tries=10))
        await wait_completed(rows, run_id, 1800)
        elapsed = time.monotonic() - t0  # from the run's creation to its last result applied
        lat = lease_latencies(rows, run_id)  # queue wait included: most attempts wait for a free slot
        # Then the scheduler's own latency: a run that fits in the free slots, leased as soon as it exists.
        free_run, _ = await asyncio.to_thread(lambda: rows.add_run([{}] * max(1, n_runners * slots // 20), tries=10))
        await wait_completed(rows, free_run, 600)
        idle = lease_latencies(rows, free_run)
        return {"processes": processes, "attempts": len(ids), "seconds": elapsed, "per_s": len(ids) / elapsed,
                "p50": pct(lat, 50), "p99": pct(lat, 99), "idle_p50": pct(idle, 50), "idle_p99": pct(idle, 99)}
    finally:
        for lr in runners:
            await lr.kill()
        await asyncio.to_thread(topo.close)
        rows.engine.dispose()


async def chaos(cluster: PgCluster, attempts: int, n_runners: int, slots: int, kill_every: float,
                work_s: float) -> dict[str, Any]:
    url = cluster.url(cluster.create_db())
    rows = DbRows(url)
    topo = await asyncio.to_thread(lambda: Topology(url, 3, **SETTINGS).start())
    runners: list[LoadRunner] = []
    kills = 0
    runner_kills = 0
    try:
        runners = await start_runners(rows, topo.proxy.ws_url, n_runners, slots, work_s)
        runs = []
        per_run = 1000
        for start in range(0, attempts, per_run):  # several runs: "every run completed" means something
            n = min(per_run, attempts - start)
            runs.append(await asyncio.to_thread(lambda n=n: rows.add_run([{}] * max(1, n // 10), tries=10)))
        t0 = time.monotonic()
        pending = {run_id for run_id, _ in runs}
        next_kill = time.monotonic() + kill_every
        next_report = time.monotonic() + 10
        while pending and time.monotonic() - t0 < 3600:
            await asyncio.sleep(0.5)
            done = await asyncio.to_thread(completed, rows, list(pending))
            pending -= done
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + 10
                with rows.session() as s:
                    finished = s.scalar(select(func.count()).select_from(Attempt).where(Attempt.status == "done"))
                print(f"  t={time.monotonic() - t0:6.1f}s {finished} attempts done, {len(pending)} runs left",
                      flush=True)
            if time.monotonic() >= next_kill and pending:
                next_kill = time.monotonic() + kill_every
                victim = random.choice(topo.servers)
                victim.kill()
                kills += 1
                chosen = random.sample(runners, max(1, len(runners) // 10))
                for lr in chosen:
                    await lr.kill()
                runner_kills += len(chosen)
                await asyncio.to_thread(victim.start)
                for lr in chosen:
                    lr.start()
                print(f"  t={time.monotonic() - t0:6.1f}s killed {victim.name} and {len(chosen)} runners; "
                      f"{len(pending)} runs left", flush=True)
        elapsed = time.monotonic() - t0
        with rows.session() as s:
            run_ids = [r for r, _ in runs]
            by_outcome = Counter(dict(s.execute(select(Attempt.outcome, func.count()).where(
                Attempt.test_run_id.in_(run_ids)).group_by(Attempt.outcome)).all()))
            unfinished = s.scalar(select(func.count()).where(Attempt.test_run_id.in_(run_ids),
                                                             Attempt.status != "done")) or 0
            retried_twice = s.scalar(select(func.count()).select_from(
                select(Attempt.retry_of).where(Attempt.test_run_id.in_(run_ids), Attempt.retry_of.is_not(None))
                .group_by(Attempt.retry_of).having(func.count() > 1).subquery())) or 0
            retry_of_passed = s.scalar(select(func.count()).select_from(Attempt).where(
                Attempt.test_run_id.in_(run_ids), Attempt.retry_of.in_(
                    select(Attempt.id).where(Attempt.outcome != "error")))) or 0
        return {"attempts": attempts, "seconds": elapsed, "server_kills": kills, "runner_kills": runner_kills,
                "runs_not_completed": len(pending), "lost": unfinished,
                "applied_twice": retried_twice + retry_of_passed,
                "outcomes": dict(by_outcome)}
    finally:
        for lr in runners:
            await lr.kill()
        await asyncio.to_thread(topo.close)
        rows.engine.dispose()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attempts", type=int, default=3000, help="throughput part: attempts per topology")
    p.add_argument("--runners", type=int, default=50)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--chaos-attempts", type=int, default=20000)
    p.add_argument("--kill-every", type=float, default=30.0)
    p.add_argument("--work", type=float, default=1.0, help="chaos part: seconds each simulated attempt takes")
    p.add_argument("--skip-chaos", action="store_true")
    p.add_argument("--chaos-only", action="store_true")
    args = p.parse_args()
    cluster = start_cluster()
    try:
        if not args.chaos_only:
            print(f"throughput: {args.attempts} attempts, {args.runners} runners x {args.slots} slots, "
                  "through HAProxy", flush=True)
            one = await throughput(cluster, 1, args.attempts, args.runners, args.slots)
            three = await throughput(cluster, 3, args.attempts, args.runners, args.slots)
            for r in (one, three):
                print(f"  {r['processes']} process(es): {r['attempts']} attempts in {r['seconds']:.1f} s = "
                      f"{r['per_s']:.0f} attempts/s applied; lease latency (queued to leased) p50 "
                      f"{r['p50'] * 1000:.0f} ms, p99 {r['p99'] * 1000:.0f} ms; with free slots p50 "
                      f"{r['idle_p50'] * 1000:.0f} ms, p99 {r['idle_p99'] * 1000:.0f} ms", flush=True)
            print(f"  ratio 3:1 = {three['per_s'] / one['per_s']:.2f}", flush=True)
        if not args.skip_chaos:
            print(f"chaos: {args.chaos_attempts} attempts, {args.runners} runners x {args.slots} slots, a server "
                  f"SIGKILLed and restarted and 10% of runners killed every {args.kill_every:g} s", flush=True)
            c = await chaos(cluster, args.chaos_attempts, args.runners, args.slots, args.kill_every, args.work)
            print(f"  {c['attempts']} attempts in {c['seconds']:.0f} s, {c['server_kills']} server kills, "
                  f"{c['runner_kills']} runner kills", flush=True)
            print(f"  lost {c['lost']}, applied twice {c['applied_twice']}, runs not completed "
                  f"{c['runs_not_completed']}; outcomes {c['outcomes']}", flush=True)
    finally:
        cluster.stop()


if __name__ == "__main__":
    asyncio.run(main())
