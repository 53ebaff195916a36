"""What the trust statistics (gh_server/trust.py) cost `results` on a 5,000-attempt run, side by side in one run.

The run is made as bench/api_results.py makes it (250 cases x 2 agents x 10 tries, 5% errors retried),
in-process on SQLite. Then `gh_server.results.results` is timed, interleaved, with the trust additions
(intervals, pass@k, flaky, infrastructure errors, axes, validation marks, paired agents) and without
them (trust.enrich replaced by the identity; results' one query still selects the extra columns, so
"without" is a little slower than results without those columns), and the ratio printed.

    .venv/bin/python bench/results_trust.py [--rounds 30] [--cases 250] [--repeat 10]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--cases", type=int, default=250)
    p.add_argument("--repeat", type=int, default=10)
    args = p.parse_args()

    from api_results import finish_attempts

    from gh_server import results as res
    from gh_server import trust
    from gh_server.api.test_runs import create_run
    from gh_server.app import create_state
    from gh_server.db import upgrade
    from gh_server.models import TestCase, TestRun, new_id
    from gh_server.settings import Settings

    d = tempfile.mkdtemp(prefix="gh-bench-trust-", dir="/var/tmp")
    st = create_state(Settings(data_dir=Path(d), start_background_tasks=False))
    upgrade(st.engine)
    with st.db.begin() as s:
        cases = [TestCase(id=new_id("tc_"), key=f"BT-{i}", name=f"bench {i}", prompt="fix it",
                          start_state="linux-tiny", success={"check_script": "echo True"}, limits={},
                          tags=[f"t{i % 7}"], category=f"c{i % 5}") for i in range(args.cases)]
        s.add_all(cases)
        s.flush()
        run = create_run(s, name="bench", test_set_id=None, agents=["noop", "reference"],
                         items=[(c, args.repeat, ["noop", "reference"]) for c in cases])
        run_id = run.id
    attempts = finish_attempts(str(st.engine.url), run_id)

    real = trust.enrich

    def plain(session: Any, run: Any, out: dict[str, Any], rows: Any) -> dict[str, Any]:
        return out

    times: dict[str, list[float]] = {"without": [], "with": []}
    with st.db() as s:
        run = s.get(TestRun, run_id)
        for _ in range(3):  # warm-up
            res.results(s, run)
        for _ in range(args.rounds):
            for name, fn in (("without", plain), ("with", real)):
                trust.enrich = fn  # type: ignore[assignment]
                t = time.perf_counter()
                res.results(s, run)
                times[name].append(time.perf_counter() - t)
    trust.enrich = real  # type: ignore[assignment]
    st.engine.dispose()
    shutil.rmtree(d, ignore_errors=True)
    a, b = statistics.median(times["without"]), statistics.median(times["with"])
    print(f"== results() on a {attempts:,}-attempt run (SQLite, {args.rounds} interleaved rounds) ==")
    print(f"  without the trust additions  p50 {a * 1000:8.1f} ms")
    print(f"  with them                    p50 {b * 1000:8.1f} ms   ratio {b / a:5.2f}x")


if __name__ == "__main__":
    main()
