"""No way out of the score: every hostile input an agent controls (docs/agents.md, "What counts against whom"),
run against the real stack, `gh-runner local` on linux-tiny, one try each (tests/e2e/escape.py). Prints a table
of input, outcome, retries and why, and the count of our errors, which must be 0 (exit 1 otherwise).

    .venv/bin/python bench/escape.py                 # every input (about 15-25 min on 2 TCG cores)
    .venv/bin/python bench/escape.py --short         # the suite's few (tests/e2e/test_escape.py)
    .venv/bin/python bench/escape.py --only answer-nul,model-never-ends
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "tests"))  # as pytest has it: the test kit

from kit.scratch import scratch_dir

from tests.e2e import escape
from tests.e2e.test_escape import SHORT

IMAGES = Path(os.environ.get("GH_IMAGES_DIR", "/var/tmp/gh-runner/images"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--short", action="store_true", help="only the suite's few inputs")
    ap.add_argument("--only", help="comma-separated inputs (command or model modes)")
    ap.add_argument("--images-dir", type=Path, default=IMAGES)
    args = ap.parse_args()
    chosen = args.only.split(",") if args.only else (SHORT if args.short else
                                                     [*escape.COMMAND_MODES, *escape.MODEL_MODES])
    modes = [m for m in chosen if m in escape.COMMAND_MODES]
    model_modes = [m for m in chosen if m in escape.MODEL_MODES]
    unknown = set(chosen) - set(modes) - set(model_modes)
    if unknown:
        ap.error(f"unknown inputs: {', '.join(sorted(unknown))}")
    # A run names at most 20 agents: the command agents in one, the model agents in another.
    campaigns = []
    for cmd, model in ((modes, []), ([], model_modes)):
        if cmd or model:
            with scratch_dir("gh-bench-escape-") as work:
                campaigns.append(escape.run(work, args.images_dir, cmd, model))
    rows = [r for c in campaigns for r in c.rows()]
    width = max(len(r.input) for r in rows)
    print(f"{'input':<{width}}  {'outcome':<8} retries  why")
    for r in rows:
        print(f"{r.input:<{width}}  {r.outcome:<8} {r.retries:>7}  {r.why}")
    ours = sum(c.errors_of_ours() for c in campaigns)
    counted = sum(len(c.report["attempts"]) for c in campaigns)
    retried = sum(len(c.report["retried_attempts"]) for c in campaigns)
    leftover = [d for c in campaigns for d in c.leftover]
    print(f"\nour errors: {ours} (must be 0); attempts: {counted} counted, {retried} retried; "
          f"left behind: {leftover or 'nothing'}")
    return 0 if ours == 0 and not leftover else 1


if __name__ == "__main__":
    sys.exit(main())
