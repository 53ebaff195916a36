"""What a client making its requests one after another waits for each, and what each costs gh-server's
CPU, from gh-server as it runs, side by side with the same server changed back one thing at a time:

  now     gh-server as it is.
  h11     as it is, parsing HTTP with uvicorn's pure-Python h11 (what it did before httptools was a
          dependency: uvicorn takes httptools when it is installed).
  nagle   as it is, on a listening socket made as before gh_server/listener.py (protocol 0: asyncio then
          leaves Nagle's algorithm on for every accepted connection).
  REV     with --before REV: the server's code at that git revision (a throwaway worktree), with h11.

    .venv/bin/python bench/api_round_trip.py [--requests 200] [--before REV]

Real gh-server processes (its CLI, SQLite in temp dirs, no runner), one after the other on the same
host. Against each, one keep-alive connection sends --requests of each kind back to back, after 20
uncounted: GET /healthz, GET /v1/runners (an authenticated read), POST /v1/test_cases (a body in and a
201 out), and the guidinghand SDK's `runners.list()` (what an eval author's script does in a loop).
Printed: p50 in milliseconds, and the server's CPU milliseconds per request (/proc: every thread of it),
for each server. A response is two writes (headers, then body): with Nagle on, the body waits until the
client ACKs the headers, which Linux's delayed ACK holds for up to 40 ms when the client sends nothing
else meanwhile. The CPU per request is what a burst of other callers' requests takes from the 2 cores
and the one event loop (bench/live_abuse.py).
"""

from __future__ import annotations

import argparse
import contextlib
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

# The server's CLI, changed back as its variant (argv[1]) says, in the same process: `h11` and a revision
# parse HTTP with h11, `nagle` serves on a listening socket made as before (protocol 0).
SERVE = """
import socket, sys
import uvicorn
import gh_server.cli as cli
if sys.argv[1] not in ("now", "nagle"):
    config_init = uvicorn.Config.__init__
    def h11_config(self, *a, **kw):
        config_init(self, *a, **{**kw, "http": "h11"})
    uvicorn.Config.__init__ = h11_config
if sys.argv[1] == "nagle":
    def listen_socket(host, port):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port)); sock.listen(2048); sock.set_inheritable(True)
        return sock
    cli.listen_socket = listen_socket
sys.exit(cli.main(sys.argv[2:]))
"""


def cpu_s(pid: int) -> float:
    """The process's user and system CPU seconds so far, all its threads (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(variant: str, n: int, code: Path = REPO) -> dict[str, tuple[float, float]]:
    """(p50 seconds, server CPU seconds per request) of each kind of request, against `code`'s server."""
    work = Path(tempfile.mkdtemp(prefix="gh-bench-rtt-"))
    port, key = free_port(), "gh_live_" + secrets.token_urlsafe(24)
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "GH_SERVER_API_KEY": key, "PYTHONPATH": str(code)}  # `code`'s gh_server before ours
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE, variant, "--data-dir", str(work), "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning"],
        env=env, cwd=code, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"gh-server ({variant}) did not start")
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
                cpu0 = cpu_s(server.pid)
                for _ in range(n):
                    t0 = time.perf_counter()
                    call()
                    took.append(time.perf_counter() - t0)
                rows[name] = (pct(took, 0.5), (cpu_s(server.pid) - cpu0) / n)
        sdk.close()
        return rows
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--before", metavar="REV", help="also the server at this git revision (with h11)")
    args = ap.parse_args()
    if args.requests < 1:
        ap.error("--requests wants at least 1")
    results: dict[str, dict[str, tuple[float, float]]] = {}
    with contextlib.ExitStack() as cleanup:
        if args.before:
            tree = Path(tempfile.mkdtemp(prefix="gh-bench-rtt-rev-"))
            cleanup.callback(shutil.rmtree, tree, ignore_errors=True)
            made = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree / "code"),
                                   args.before], capture_output=True, text=True, timeout=120)
            if made.returncode != 0:
                ap.error(f"--before {args.before}: no such revision here ({made.stderr.strip()})")
            cleanup.callback(subprocess.run, ["git", "-C", str(REPO), "worktree", "remove", "--force",
                                              str(tree / "code")], timeout=120)
        for variant in ("now", "h11", "nagle"):
            results[variant] = measure(variant, args.requests)
        if args.before:
            results[args.before[:10]] = measure(args.before, args.requests, tree / "code")
    names = list(results)
    print(f"{args.requests} requests of each kind, one after another on one connection: "
          "p50 ms / server CPU ms per request")
    print(f"{'request':<22} " + " ".join(f"{n:>15}" for n in names))
    for kind in results["now"]:
        cells = [f"{results[n][kind][0] * 1000:6.1f} /{results[n][kind][1] * 1000:6.2f}" for n in names]
        print(f"{kind:<22} " + " ".join(f"{c:>15}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
