"""Scheduler and API benchmark: how fast the control plane hands out work and answers about it.

Part 1 (scheduler): a real gh-server (its own process, SQLite in a temp dir) and 100 simulated
runners of 8 slots on real websockets over loopback. A run of 5,000 attempts is created through the
API; each runner accepts every lease and finishes it at once. Printed: the wall time from the run's
creation to its last result applied, and the per-lease cost of the first and the last thousand
leases side by side (flat means the scheduler does not slow down as the run grows).

    .venv/bin/python bench/scheduler_api.py [--runners 100] [--slots 8] [--attempts 5000]

Target: the 5,000 leases in under 10 s on SQLite.

Part 2 (API): p50/p99 of GET results, GET run and an attempts page for that completed run, side by
side (bench/api_results.py; run alone it makes a run with a mix of outcomes and retried errors).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import secrets
import socket
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gh_common.timeouts import within
from gh_wire import protocol


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(data_dir: str, port: int, api_key: str) -> None:
    """The server process: gh-server's app on uvicorn, quiet."""
    import logging

    import uvicorn

    from gh_server.app import create_app
    from gh_server.settings import Settings

    logging.basicConfig(level=logging.WARNING)
    settings = Settings(data_dir=Path(data_dir), host="127.0.0.1", port=port, admin_api_key=api_key)
    app = create_app(settings)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", ws_max_size=protocol.MAX_FRAME_BYTES)


class Runner:
    def __init__(self, url: str, token: str, name: str, slots: int, lease_times: list[float]) -> None:
        self.url, self.token, self.name, self.slots = url, token, name, slots
        self.lease_times = lease_times
        self.ws: Any = None
        self.task: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        self.ws = await websockets.connect(self.url, additional_headers={"Authorization": f"Bearer {self.token}"},
                                           open_timeout=60, max_size=protocol.MAX_FRAME_BYTES)
        hello = protocol.Hello(version="bench", name=self.name, slots=self.slots, labels=["bench"],
                               images=[protocol.ImageAd(name="linux-tiny", os="linux", version="1", checksum="x")])
        await self.ws.send(protocol.encode(hello))
        welcome = protocol.parse_server_message(await within(60, self.ws.recv()))
        assert welcome.type == "welcome", welcome
        self.task = asyncio.create_task(self.loop())

    async def loop(self) -> None:
        async for raw in self.ws:
            msg = protocol.parse_server_message(raw)
            if msg.type == "lease":
                self.lease_times.append(time.perf_counter())
                now = datetime.now(UTC)
                await self.ws.send(protocol.encode(protocol.LeaseAccept(attempt_id=msg.attempt_id)))
                result = protocol.AttemptResult(
                    attempt_id=msg.attempt_id, outcome="passed", answer="",
                    check_before=protocol.CheckOutput(exit_code=0, stdout_tail="False", verdict="False"),
                    check_after=protocol.CheckOutput(exit_code=0, stdout_tail="True", verdict="True"),
                    started_at=now, finished_at=now,
                )
                await self.ws.send(protocol.encode(protocol.AttemptFinished(result=result)))
            elif msg.type == "heartbeat":
                await self.ws.send(protocol.encode(protocol.Heartbeat(at=datetime.now(UTC), busy=0)))

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        await self.ws.close()


async def wait_up(base: str, key: str) -> None:
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


async def bench_scheduler(base: str, key: str, n_runners: int, slots: int, n_attempts: int) -> dict[str, Any]:
    h = {"Authorization": f"Bearer {key}"}
    ws_url = base.replace("http", "ws", 1) + "/v1/runners/connect"
    lease_times: list[float] = []
    async with httpx.AsyncClient(base_url=base, headers=h, timeout=120) as c:
        tokens = []
        for i in range(n_runners):
            r = await c.post("/v1/runners", json={"name": f"bench-{i}"})
            r.raise_for_status()
            tokens.append(r.json()["token"])
        runners = [Runner(ws_url, t, f"bench-{i}", slots, lease_times) for i, t in enumerate(tokens)]
        await asyncio.gather(*(r.connect() for r in runners))
        repeat = 20
        n_cases = max(1, n_attempts // repeat)
        cases = [{"key": f"B-{i}", "name": f"bench {i}", "prompt": "fix it", "start_state": "linux-tiny",
                  "setup_script": "true", "success": {"check_script": "echo True"}} for i in range(n_cases)]
        ids: list[str] = []
        for i in range(0, len(cases), 500):
            r = await c.post("/v1/test_cases/batch", json={"cases": cases[i:i + 500]})
            r.raise_for_status()
            ids += [x["test_case_id"] for x in r.json()["data"]]
        t0 = time.perf_counter()
        r = await c.post("/v1/test_runs", json={"test_case_ids": ids, "agents": ["noop"], "repeat": repeat})
        r.raise_for_status()
        run = r.json()
        t_created = time.perf_counter()
        total = run["progress"]["total"]
        while True:
            got = (await c.get(f"/v1/test_runs/{run['test_run_id']}")).json()
            if got["status"] == "completed":
                break
            if time.perf_counter() - t0 > 600:
                raise RuntimeError(f"run not completed after 600 s: {got['progress']}")
            # Polling gently: the run's progress is an aggregate over all its attempts, and polling it hot
            # would measure the API's reads more than the scheduler.
            await asyncio.sleep(0.5)
        t_done = time.perf_counter()
        for rn in runners:
            await rn.close()
    lease_times.sort()
    return {"run_id": run["test_run_id"], "attempts": total, "created_at": run["created_at"],
            "finished_at": got["finished_at"], "leases": len(lease_times), "t0": t0,
            "t_created": t_created, "t_done": t_done, "lease_times": lease_times, "progress": got["progress"]}


def _per_lease(times: list[float], window: int = 100) -> float:
    spans = sorted((times[i + window - 1] - times[i]) / (window - 1) for i in range(0, len(times) - window + 1, window))
    return spans[len(spans) // 2]


def report_scheduler(res: dict[str, Any], n_runners: int, slots: int) -> None:
    lt = res["lease_times"]
    print(f"== scheduler: {res['attempts']:,} attempts, {n_runners} simulated runners x {slots} slots, SQLite ==")
    print(f"  run created through the API in      {res['t_created'] - res['t0']:7.2f} s")
    print(f"  first lease after creation          {lt[0] - res['t_created']:7.2f} s")
    print(f"  all leased (first..last lease)      {lt[-1] - lt[0]:7.2f} s")
    wall = (datetime.fromisoformat(res["finished_at"].replace("Z", "+00:00"))
            - datetime.fromisoformat(res["created_at"].replace("Z", "+00:00"))).total_seconds()
    print(f"  run created -> completed (its rows) {wall:7.2f} s   target < 10 s")
    # Per-lease cost from windows of 100 leases, the median window of each thousand: robust to another
    # process taking the CPU for a moment. The first thousand starts after the initial fill (every slot
    # free at once is one burst, not the steady state the question is about).
    fill = n_runners * slots
    k = 1000
    if len(lt) >= fill + 2 * k:
        first = _per_lease(lt[fill:fill + k])
        last = _per_lease(lt[-k:])
        print(f"  per lease, first {k:,} after the fill  {first * 1000:7.3f} ms   (leases {fill + 1}-{fill + k})")
        print(f"  per lease, last {k:,}                 {last * 1000:7.3f} ms   ratio last/first {last / first:5.2f}")
    print(f"  progress: {res['progress']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runners", type=int, default=100)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--attempts", type=int, default=5000)
    ap.add_argument("--api-requests", type=int, default=200, help="sequential GETs per endpoint in part 2")
    args = ap.parse_args()
    key = "gh_live_bench_" + secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory(prefix="gh-bench-") as d:
        port = free_port()
        # The server in its own process, as in production: the simulated runners do not share its GIL.
        proc = mp.get_context("spawn").Process(target=serve, args=(d, port, key), daemon=True)
        proc.start()
        try:
            base = f"http://127.0.0.1:{port}"
            asyncio.run(wait_up(base, key))
            res = asyncio.run(bench_scheduler(base, key, args.runners, args.slots, args.attempts))
            report_scheduler(res, args.runners, args.slots)
            # Part 2 (API): the results of the run the simulated runners just finished (bench/api_results.py).
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from api_results import bench_results, report_results

            times = asyncio.run(bench_results(base, key, res["run_id"], args.api_requests))
            report_results(times, res["attempts"])
        finally:
            proc.terminate()
            proc.join(30)
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, 9)


if __name__ == "__main__":
    main()
