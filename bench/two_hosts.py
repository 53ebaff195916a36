"""Two hosts, one registry: does a second runner add throughput on a start state only the first saved,
and how fast is its first pull?

A start state is saved (built and pushed) on runner A. Then, side by side in one run:
1. N attempts on it over A alone (2 slots): attempts per minute;
2. N attempts over A and B (2 slots each; B never saw the version and pulls it on its first lease):
   attempts per minute, and the ratio to (1);
3. B's first pull: its seconds against the bytes pulled, next to reading, hashing (sha256) and
   writing the same bytes on the local disk (the version's files, copied to a temp file).

Runners are real daemons on the real QEMU provider with their own state dirs; the registry is
Debian's docker-registry on loopback. A small dispatcher stands in for the scheduler: it keeps each
runner's slots full from one queue (a refused lease goes back to the queue) and plays a `noop` agent
(the task ends at once). Each attempt: restore the version, setup `true`, check before, task, check after.

    .venv/bin/python bench/two_hosts.py [--attempts 40] [--slots 2]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from registry.hosts import Host, build_state, finish, start_host, state_lease  # noqa: E402
from registry.server import RegistryProcess  # noqa: E402

IMAGES = Path(os.environ.get("GH_IMAGES_DIR", "/var/tmp/gh-runner/images"))


async def dispatch(hosts: list[Host], ssid: str, n: int, slots: int, tag: str) -> tuple[float, list[Any]]:
    """Run n attempts over the hosts, `slots` at a time on each; returns (seconds, results)."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(f"at_{tag}_{i:03d}")
    results: list[Any] = []

    async def worker(h: Host) -> None:
        while True:
            try:
                aid = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            start = len(h.peer.received)
            await h.peer.send(state_lease(aid, ssid, "true"))
            answer = await h.peer.wait_for(
                lambda r, a=aid: getattr(r.msg, "attempt_id", None) == a
                and r.msg.type in ("lease_accept", "lease_refuse"), timeout=300, start=start)
            if answer.msg.type == "lease_refuse":
                print(f"  {h.name} refused {aid}: {answer.msg.code} {answer.msg.reason}")
                queue.put_nowait(aid)
                await asyncio.sleep(0.5)  # a refusing runner is left alone a moment, as the server does
                continue
            res = await finish(h, aid)
            results.append((h.name, res))

    t0 = time.monotonic()
    await asyncio.gather(*(worker(h) for h in hosts for _ in range(slots)))
    return time.monotonic() - t0, results


def local_copy_seconds(files: list[Path], scratch: Path) -> tuple[float, int]:
    """Read, sha256 and write the same bytes on the local disk (what a pull does besides the network)."""
    total = 0
    t0 = time.monotonic()
    for f in files:
        h = hashlib.sha256()
        out = scratch / (f.name + ".copy")
        with f.open("rb") as src, out.open("wb") as dst:
            while chunk := src.read(1024 * 1024):
                h.update(chunk)
                dst.write(chunk)
                total += len(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        out.unlink()
    return time.monotonic() - t0, total


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attempts", type=int, default=40)
    ap.add_argument("--slots", type=int, default=2)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gh-bench-two-hosts-", dir="/var/tmp"))
    root.chmod(0o755)  # noqa: ASYNC240 - set-up
    reg = RegistryProcess.start(root / "registry")
    hosts: list[Host] = []
    try:
        a = await start_host("A", root, IMAGES, reg, args.slots)
        hosts.append(a)
        ssid = "ss_bench" + secrets.token_hex(3)
        t0 = time.monotonic()
        built = await build_state(a, ssid, "echo bench > /gh-marker; sync")
        assert built.ok and built.registry_ref, (built.error, built.registry_error)
        print(f"start state saved and pushed on A in {time.monotonic() - t0:.1f} s: {built.registry_ref}")

        secs_a, res_a = await dispatch([a], ssid, args.attempts, args.slots, "alone")
        b = await start_host("B", root, IMAGES, reg, args.slots)
        hosts.append(b)
        secs_ab, res_ab = await dispatch([a, b], ssid, args.attempts, args.slots, "both")

        errors = [r for _, r in res_a + res_ab if r.error]
        per_min_a = len(res_a) / secs_a * 60
        per_min_ab = len(res_ab) / secs_ab * 60
        on_b = [r for name, r in res_ab if name == "B"]
        fetch = max((r.metrics.phase_seconds.get("fetch", 0.0) for r in on_b), default=0.0)
        lib = b.daemon.library
        assert lib is not None
        first = dict(lib.last_pull)
        # A quiet pull as well: a fresh runner's library (C, no daemon) while nothing else runs, and
        # the local copy of the same files right after it.
        from gh_runner.library import Library, open_registry
        from providers.qemu import QemuProvider  # type: ignore[attr-defined]

        settings = b.daemon.config.registry
        assert settings is not None
        quiet = Library(QemuProvider(IMAGES, root / "C", "regtc-bench"), open_registry(settings), settings, root / "C")
        checksum = next(i.checksum for i in await quiet.provider.list_images() if i.name == "linux-tiny")
        await quiet.acquire(ssid, 1, "linux-tiny", checksum, held=False)
        calm = dict(quiet.last_pull)
        await quiet.close()
        await quiet.provider.close()
        vdir = a.state_dir / "states" / ssid / "v1"
        files = sorted(p for p in vdir.iterdir() if p.is_file())
        local_s, local_bytes = local_copy_seconds(files, root)
        mib = lib.bytes_pulled / 2**20
        print()
        print(f"attempts                 A alone: {len(res_a)} in {secs_a:.1f} s = {per_min_a:.1f}/min")
        print(f"                         A and B: {len(res_ab)} in {secs_ab:.1f} s = {per_min_ab:.1f}/min "
              f"(B ran {len(on_b)}); ratio {per_min_ab / per_min_a:.2f}x")
        print(f"errors                   {len(errors)}" + (f": {errors[0].error}" if errors else ""))
        print(f"B's first pull           {fetch:.2f} s for {mib:.1f} MiB ({lib.pulls_done} pull(s)): "
              f"{mib / max(fetch, 1e-6):.0f} MiB/s (fetch phase, incl. manifest, import and the wait)")
        print(f"  its steps              manifest {first['manifest']:.2f} s, blobs {first['blobs']:.2f} s, "
              f"import (qemu-img rebase -u, rename) {first['import']:.2f} s, while A ran 2 machines")
        print(f"a quiet pull (runner C)  {calm['seconds']:.2f} s: manifest {calm['manifest']:.2f} s, blobs "
              f"{calm['blobs']:.2f} s ({mib / max(calm['blobs'], 1e-6):.0f} MiB/s), import {calm['import']:.2f} s")
        print(f"local read+sha256+write  {local_s:.2f} s for {local_bytes / 2**20:.1f} MiB: "
              f"{local_bytes / 2**20 / max(local_s, 1e-6):.0f} MiB/s; quiet pull's blobs / local = "
              f"{calm['blobs'] / max(local_s, 1e-6):.2f}x, whole quiet pull / local = "
              f"{calm['seconds'] / max(local_s, 1e-6):.2f}x")
    finally:
        for h in hosts:
            await h.stop()
        reg.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
