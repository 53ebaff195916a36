"""What an unauthenticated oversized POST costs gh-server, with and without the body limit.

Two real gh-server processes (SQLite in temp dirs), side by side in one run: one with the default
`max_body_bytes` (4 MiB), one with the limit set past the body (as before the limit existed). Each
gets the same unauthenticated POST /v1/test_cases of SIZE MB, streamed in chunks; the bench prints
each server's peak RSS growth (VmHWM) and how long the answer took, and their ratio.

    .venv/bin/python bench/body_limit.py [--mb 60]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import tempfile
import time
from pathlib import Path

import httpx


def _serve(port: int, data_dir: str, limit: int) -> None:
    import uvicorn

    from gh_server.app import create_app
    from gh_server.settings import Settings

    settings = Settings(data_dir=Path(data_dir), host="127.0.0.1", port=port, admin_api_key="gh_live_bench_key",
                        gateway=False, max_body_bytes=limit)
    uvicorn.run(create_app(settings), host="127.0.0.1", port=port, log_level="warning")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _measure(pid: int, port: int, mb: int) -> tuple[int, float, int]:
    chunk = b" " * (1024 * 1024)

    def body():  # type: ignore[no-untyped-def]
        for _ in range(mb):
            yield chunk

    before = _kb(pid, "VmHWM")
    t0 = time.perf_counter()
    with httpx.Client(timeout=120) as c:
        try:
            status = c.post(f"http://127.0.0.1:{port}/v1/test_cases", content=body(),
                            headers={"content-type": "application/json", "content-length": str(mb * len(chunk))}
                            ).status_code
        except httpx.HTTPError:
            status = -1  # the server answered and closed before taking the whole body
    took = time.perf_counter() - t0
    return status, took, _kb(pid, "VmHWM") - before


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=60)
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as d:
        for name, limit in (("limited (4 MiB)", 4 * 1024 * 1024), ("unlimited", (args.mb + 1) * 1024 * 1024)):
            port = _port()
            proc = mp.get_context("spawn").Process(target=_serve, args=(port, os.path.join(d, name[:3]), limit))
            proc.start()
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise SystemExit("gh-server did not start") from None
                    time.sleep(0.1)
            assert proc.pid is not None
            results[name] = _measure(proc.pid, port, args.mb)
            proc.terminate()
            proc.join(30)
    for name, (status, took, grew) in results.items():
        print(f"{name:16s} HTTP {status:4d}  answered in {took:6.2f} s  peak RSS +{grew / 1024:7.1f} MiB")
    (_, t_lim, g_lim), (_, t_unl, g_unl) = results["limited (4 MiB)"], results["unlimited"]
    growth = f"{g_unl / g_lim:.1f}x" if g_lim > 0 else f"+{g_unl / 1024:.1f} MiB vs none"
    print(f"ratio unlimited/limited: peak RSS growth {growth}, time {t_unl / max(t_lim, 1e-6):.1f}x")


if __name__ == "__main__":
    main()
