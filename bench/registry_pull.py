"""One blob through the registry client against a local copy, side by side in one run.

Pushes a random blob (default 50 MiB) to Debian's docker-registry on loopback,
then, alternating, R times each: pull it with gh_runner.registry (streamed, sha256 checked as it
comes, written to NAME.partial, fsync'd, renamed), and read + sha256 + write + fsync the same bytes
on the local disk. Prints the medians and their ratio (the target: a pull within 2x of the
local copy; it measured ORAS's Python SDK at 0.24 s against 0.34 s for 50 MB).

    .venv/bin/python bench/registry_pull.py [--mib 50] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from registry.server import RegistryProcess  # noqa: E402

from gh_runner.registry import Registry  # noqa: E402


def local_copy(src: Path, dst: Path) -> float:
    t0 = time.monotonic()
    h = hashlib.sha256()
    with src.open("rb") as f, dst.open("wb") as out:
        while chunk := f.read(1024 * 1024):
            h.update(chunk)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    dst.unlink()
    return time.monotonic() - t0


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gh-bench-registry-pull-", dir="/var/tmp"))
    reg = RegistryProcess.start(root / "registry")
    try:
        blob = root / "blob"
        blob.write_bytes(os.urandom(args.mib * 1024 * 1024))
        async with Registry(reg.url) as r:
            t0 = time.monotonic()
            desc = await r.push_blob("bench/pull", blob, "application/octet-stream")
            push_s = time.monotonic() - t0
            pulls, copies = [], []
            for _ in range(args.rounds):
                out = root / "pulled"
                t0 = time.monotonic()
                await r.pull_blob("bench/pull", desc, out)
                pulls.append(time.monotonic() - t0)
                out.unlink()
                copies.append(local_copy(blob, root / "copy"))
        p, c = statistics.median(pulls), statistics.median(copies)
        print(f"push (chunked above 64 MiB)       {push_s:.2f} s for {args.mib} MiB")
        print(f"pull, verified (median of {args.rounds})     {p:.3f} s = {args.mib / p:.0f} MiB/s")
        print(f"local read+sha256+write (median)  {c:.3f} s = {args.mib / c:.0f} MiB/s")
        print(f"pull / local                      {p / c:.2f}x")
    finally:
        reg.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
