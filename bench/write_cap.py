"""How far past its disk write cap a guest gets before the runner stops it, and what the cap's
watch costs, measured side by side in one run on linux-tiny.

    .venv/bin/python bench/write_cap.py [--images-dir DIR] [--cap-mib N] [--rounds N]

Per round: a machine with the cap writes zeros (`dd ... conv=fsync`) until it is stopped; the
bench prints the cap, what the machine directory held when the watch fired (the overshoot is
bounded by the guest's write rate times the poll interval), and the guest's write rate measured
on an uncapped machine in the same run. Also the cost of one poll (`allocated_bytes`).
Everything it makes is named gh-benchcap-* and removed at the end, even on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from providers.base import MachineSource
from providers.errors import MachineLimitExceeded
from providers.qemu import QemuMachine, QemuProvider
from providers.qemu.diskcap import POLL_INTERVAL_S, allocated_bytes

MIB = 1024 * 1024
FILL = "dd if=/dev/zero of=/fill bs=1M count={count} conv=fsync 2>&1 | tail -1; echo done"


async def bench(args: argparse.Namespace, work: Path) -> None:
    p = QemuProvider(args.images_dir, work / "state", "benchcap")
    made: list[QemuMachine] = []
    try:
        await p.start()
        # The guest's write rate, uncapped.
        m = await p.create_machine("rate", MachineSource(image="linux-tiny"), timeout=300)
        assert isinstance(m, QemuMachine)
        made.append(m)
        await m.wait_ready(300)
        t0 = time.monotonic()
        await m.run_script(FILL.format(count=args.cap_mib), timeout=600)
        rate = args.cap_mib / (time.monotonic() - t0)
        polls = []
        for _ in range(200):
            t = time.perf_counter()
            allocated_bytes(m.dir)
            polls.append(time.perf_counter() - t)
        await m.destroy()
        p.write_cap_bytes = args.cap_mib * MIB
        over = []
        for i in range(args.rounds):
            m = await p.create_machine(f"cap{i}", MachineSource(image="linux-tiny"), timeout=300)
            assert isinstance(m, QemuMachine)
            made.append(m)
            await m.wait_ready(300)
            try:
                await m.run_script(FILL.format(count=args.cap_mib * 4), timeout=600)
                raise SystemExit("the machine was not stopped")
            except MachineLimitExceeded as e:
                used = int(str(e).split("wrote ")[1].split(" MiB")[0])
                over.append(used - args.cap_mib)
            await m.destroy()
        print(f"guest write rate (TCG here)      {rate:8.1f} MiB/s")
        print(f"poll interval                    {POLL_INTERVAL_S:8.2f} s  -> bound ~{rate * POLL_INTERVAL_S:.0f} MiB")
        print(f"cap                              {args.cap_mib:8d} MiB")
        print(f"overshoot at stop (median, max)  {statistics.median(over):8.1f} / {max(over)} MiB  "
              f"({statistics.median(over) / args.cap_mib:.2f}x of the cap)")
        print(f"one poll (allocated_bytes)       {statistics.median(polls) * 1e6:8.1f} us  "
              f"({statistics.median(polls) / POLL_INTERVAL_S * 100:.4f}% of the interval)")
    finally:
        for m in made:
            await m.destroy()
        await p.reap(set())
        await p.close()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images-dir", type=Path, default=Path("/var/tmp/gh-runner/images"))
    ap.add_argument("--cap-mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gh-benchcap-", dir="/var/tmp"))
    work.chmod(0o755)
    asyncio.run(bench(args, work))


if __name__ == "__main__":
    main()
