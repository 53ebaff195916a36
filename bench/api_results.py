"""API latency for the results of a 5,000-attempt run (the API half of the scheduler/API benchmark).

A real gh-server in its own process (SQLite in a temp dir, no runners) gets 250 cases and a run of
them against 2 agents x 10 tries = 5,000 attempts through the API. The attempts are then finished on
the rows (a mix of passed/failed/error, 5% errors retried), as the scheduler would leave them. Then,
side by side in one run, sequential requests measure p50/p99 of:

    GET /v1/test_runs/{id}/results   (every row aggregated)
    GET /v1/test_runs/{id}           (progress + pass rates, one grouped query)
    GET /v1/test_runs/{id}/attempts  (a page of 100)

    .venv/bin/python bench/api_results.py [--requests 200] [--cases 250] [--agents 2] [--repeat 10] [--postgres]

`bench_results(base, key, run_id, n)` and `report_results(...)` are also called from
bench/scheduler_api.py after its scheduler part, on the run the simulated runners completed.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import random
import secrets
import socket
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(data_dir: str, port: int, api_key: str, database_url: str | None = None) -> None:
    import logging

    import uvicorn

    from gh_server.app import create_app
    from gh_server.settings import Settings

    logging.basicConfig(level=logging.WARNING)
    settings = Settings(
        data_dir=Path(data_dir),
        database_url=database_url,
        host="127.0.0.1",
        port=port,
        admin_api_key=api_key,
        gateway=False,
    )
    uvicorn.run(create_app(settings), host="127.0.0.1", port=port, log_level="warning")


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


async def bench_results(base: str, key: str, run_id: str, n: int = 200) -> dict[str, list[float]]:
    """Sequential GETs (a warm-up of 5 each first), interleaved so load drifts hit every endpoint alike."""
    paths = {
        "results": f"/v1/test_runs/{run_id}/results",
        "run": f"/v1/test_runs/{run_id}",
        "attempts page": f"/v1/test_runs/{run_id}/attempts?limit=100",
    }
    times: dict[str, list[float]] = {k: [] for k in paths}
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60) as c:
        for path in paths.values():
            for _ in range(5):
                (await c.get(path)).raise_for_status()
        for _ in range(n):
            for name, path in paths.items():
                t = time.perf_counter()
                r = await c.get(path)
                times[name].append(time.perf_counter() - t)
                r.raise_for_status()
    return times


def report_results(times: dict[str, list[float]], attempts: int, db: str = "SQLite") -> None:
    print(f"== API latency on a {attempts:,}-attempt run ({db}, {len(times['results'])} sequential requests each) ==")
    base = statistics.median(times["run"])
    for name, ts in times.items():
        p50, p99 = pct(ts, 50) * 1000, pct(ts, 99) * 1000
        print(f"  {name:<16} p50 {p50:8.1f} ms   p99 {p99:8.1f} ms   p50 vs GET run {pct(ts, 50) / base:6.1f}x")


def finish_attempts(url: str, run_id: str, seed: int = 7) -> int:
    """Leaves the run as the scheduler would: every try done, some errors retried. Returns all attempts."""
    from sqlalchemy import create_engine, select, update

    from gh_server.models import Attempt, TestRun, new_id

    rnd = random.Random(seed)
    engine = create_engine(url)
    start = datetime.now(UTC) - timedelta(hours=1)
    with engine.begin() as conn:
        rows = conn.execute(
            select(Attempt.id, Attempt.run_case_id, Attempt.test_case_id, Attempt.agent_id, Attempt.try_number).where(
                Attempt.test_run_id == run_id
            )
        ).all()
        retries = []
        for i, (aid, rc, tc, agent, tr) in enumerate(rows):
            fin = start + timedelta(seconds=i * 0.7)
            outcome = rnd.choices(["passed", "failed", "error"], [0.6, 0.35, 0.05])[0]
            values: dict[str, Any] = {
                "status": "done",
                "outcome": outcome,
                "seconds": rnd.uniform(20, 200),
                "finished_at": fin,
                "started_at": fin - timedelta(seconds=60),
                "metrics": {
                    "active_seconds": 60,
                    "steps": rnd.randint(1, 40),
                    "questions": 0,
                    "approvals": 0,
                    "cost_cents": None,
                },
                "check": {
                    "before": "False",
                    "after": "True" if outcome == "passed" else "False",
                    "passed": outcome == "passed",
                },
            }
            if outcome == "error":
                values["is_last"] = False
                retries.append(
                    {
                        "id": new_id("at_"),
                        "test_run_id": run_id,
                        "run_case_id": rc,
                        "test_case_id": tc,
                        "agent_id": agent,
                        "try": tr,
                        "retry_of": aid,
                        "is_last": True,
                        "status": "done",
                        "outcome": "passed",
                        "seconds": 50.0,
                        "finished_at": fin,
                        "created_at": fin,
                        "runs_on": "vm",
                    }
                )
            conn.execute(update(Attempt).where(Attempt.id == aid).values(**values))
        if retries:
            conn.execute(Attempt.__table__.insert(), retries)
        conn.execute(
            update(TestRun)
            .where(TestRun.id == run_id)
            .values(status="completed", started_at=start, finished_at=start + timedelta(hours=1))
        )
    engine.dispose()
    return len(rows) + len(retries)


async def make_run(base: str, key: str, n_cases: int, agents: list[str], repeat: int) -> str:
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=120) as c:
        ids: list[str] = []
        cases = [
            {
                "key": f"AB-{i}",
                "name": f"bench {i}",
                "prompt": "fix it",
                "start_state": "linux-tiny",
                "success": {"check_script": "echo True"},
                "tags": [f"t{i % 7}"],
                "category": f"c{i % 5}",
            }
            for i in range(n_cases)
        ]
        for i in range(0, len(cases), 500):
            r = await c.post("/v1/test_cases/batch", json={"cases": cases[i : i + 500]})
            r.raise_for_status()
            ids += [x["test_case_id"] for x in r.json()["data"]]
        r = await c.post("/v1/test_runs", json={"test_case_ids": ids, "agents": agents, "repeat": repeat})
        r.raise_for_status()
        run_id: str = r.json()["test_run_id"]
        return run_id


async def wait_up(base: str) -> None:
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient(timeout=5) as c:
        while time.monotonic() < deadline:
            try:
                if (await c.get(base + "/healthz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("gh-server did not start within 60 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--cases", type=int, default=250)
    ap.add_argument("--agents", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--postgres", action="store_true", help="on a throwaway PostgreSQL cluster instead of SQLite")
    args = ap.parse_args()
    key = "gh_live_bench_" + secrets.token_urlsafe(16)
    agents = ["noop", "reference", "default"][: args.agents]
    cluster = None
    with tempfile.TemporaryDirectory(prefix="gh-bench-api-", dir="/var/tmp") as d:
        db_url: str | None = None
        url = f"sqlite:///{d}/gh-server.db"
        if args.postgres:
            from tests.server.pg import start_cluster

            cluster = start_cluster()
            db_url = cluster.url(cluster.create_db())
            url = "postgresql+psycopg://" + db_url.split("://", 1)[1]
        port = free_port()
        proc = mp.get_context("spawn").Process(target=serve, args=(d, port, key, db_url), daemon=True)
        proc.start()
        try:
            base = f"http://127.0.0.1:{port}"
            asyncio.run(wait_up(base))
            run_id = asyncio.run(make_run(base, key, args.cases, agents, args.repeat))
            total = finish_attempts(url, run_id)
            times = asyncio.run(bench_results(base, key, run_id, args.requests))
            report_results(times, args.cases * len(agents) * args.repeat, "PostgreSQL" if args.postgres else "SQLite")
            print(f"  (attempt rows incl. retried errors: {total:,})")
        finally:
            proc.terminate()
            proc.join(30)
            if proc.is_alive():
                os.kill(proc.pid, 9)
            if cluster is not None:
                cluster.stop()


if __name__ == "__main__":
    main()
