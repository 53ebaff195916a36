"""What a client making its requests one after another waits for each, from gh-server as it runs, side
by side with the same server serving on a listening socket made as it was before gh_server/listener.py
(protocol 0: asyncio then leaves Nagle's algorithm on for every accepted connection).

    .venv/bin/python bench/api_round_trip.py [--requests 200]

Two real gh-server processes (its CLI, SQLite in temp dirs, no runner), one after the other on the same
host. Against each, one keep-alive connection sends --requests of each kind back to back, after 20
uncounted: GET /healthz, GET /v1/runners (an authenticated read), POST /v1/test_cases (a body in and a
201 out), and the guidinghand SDK's `runners.list()` (what an eval author's script does in a loop).
Printed: p50 and p90 in milliseconds for each server, and their ratio at p50. A response is two writes
(headers, then body): with Nagle on, the body waits until the client ACKs the headers, which Linux's
delayed ACK holds for up to 40 ms when the client sends nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from guidinghand import Eager

REPO = Path(__file__).resolve().parent.parent

# The server's CLI as it is, or with its listening socket made as before (protocol 0), in the same process.
SERVE = """
import socket, sys
import gh_server.cli as cli
if sys.argv[1] == "before":
    def listen_socket(host, port):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port)); sock.listen(2048); sock.set_inheritable(True)
        return sock
    cli.listen_socket = listen_socket
sys.exit(cli.main(sys.argv[2:]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(which: str, n: int) -> dict[str, tuple[float, float]]:
    work = Path(tempfile.mkdtemp(prefix="gh-bench-rtt-"))
    port, key = free_port(), "gh_live_" + secrets.token_urlsafe(24)
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE, which, "--data-dir", str(work), "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning"],
        env={**os.environ, "GH_SERVER_API_KEY": key}, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"gh-server ({which}) did not start")
            time.sleep(0.1)
        rows: dict[str, tuple[float, float]] = {}
        sdk = Eager(api_key=key, base_url=base, max_retries=0, timeout=30)
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
            case = {"name": "rtt", "prompt": "p", "start_state": "linux-tiny", "success": {"check_script": "true"}}
            kinds: list[tuple[str, Callable[[], object]]] = [
                ("GET /healthz", lambda: http.get("/healthz").raise_for_status()),
                ("GET /v1/runners", lambda: http.get("/v1/runners").raise_for_status()),
                ("POST /v1/test_cases", lambda: http.post("/v1/test_cases", json=case).raise_for_status()),
                ("sdk runners.list()", lambda: sdk.runners.list()),
            ]
            for name, call in kinds:
                for _ in range(20):
                    call()
                took = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    call()
                    took.append(time.perf_counter() - t0)
                rows[name] = (pct(took, 0.5), pct(took, 0.9))
        sdk.close()
        return rows
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    if args.requests < 1:
        ap.error("--requests wants at least 1")
    now, before = measure("now", args.requests), measure("before", args.requests)
    print(f"{args.requests} requests of each kind, one after another on one connection (ms)")
    print(f"{'request':<22} {'now p50':>8} {'now p90':>8} {'before p50':>11} {'before p90':>11} {'before/now':>11}")
    for name, (p50, p90) in now.items():
        b50, b90 = before[name]
        print(f"{name:<22} {p50 * 1000:8.1f} {p90 * 1000:8.1f} {b50 * 1000:11.1f} {b90 * 1000:11.1f} {b50 / p50:11.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
