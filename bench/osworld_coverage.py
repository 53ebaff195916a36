"""How much of an OSWorld checkout `gh-runner import osworld` turns into cases, per start state, offline.

    .venv/bin/python bench/osworld_coverage.py PATH/evaluation_examples/test_all.json \
        [--start-state osworld-desktop --start-state linux-desktop --start-state linux-tiny] [--markdown]

Nothing is fetched: every `download` and `cloud_file` gets a small stand-in, so the counts say what the
translation supports (the files' real sizes, which decide `download_too_large` on a start state without a
file store, are not known offline). Prints per start state the totals by reason, per domain imported and
skipped by reason, and, for the `unsupported_*` reasons, the names behind them; --markdown prints the
per-domain table of docs/osworld.md.
OSWorld's task files are not in this repository: point it at a checkout of xlang-ai/OSWorld.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
from pathlib import Path

from gh_local.osworld import check
from gh_local.osworld.fetch import Fetcher
from gh_local.osworld.importer import import_tasks
from gh_local.osworld.target import Target
from gh_local.osworld.task import load_tasks


class _Everything(frozenset[str]):
    def __contains__(self, item: object) -> bool:
        return True


class OfflineFetcher(Fetcher):
    def _download(self, url: str) -> bytes:
        return b"offline stand-in\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("--start-state", action="append", default=None)
    ap.add_argument("--top", type=int, default=12, help="names listed per start state")
    ap.add_argument("--markdown", action="store_true", help="the per-domain table, for docs/osworld.md")
    ap.add_argument("--every-name", action="store_true",
                    help="take gh_osworld to implement every metric, getter and table rule: the ceiling the "
                         "importer allows on osworld-desktop")
    args = ap.parse_args()
    if args.every_name:
        everything = _Everything()
        for attr in ("METRICS", "GETTERS", "TABLE_RULES"):
            setattr(check.guest_names, attr, everything)
    tasks = load_tasks(args.paths)
    # By position, not by id: OSWorld's index lists 11 ids under both chrome and thunderbird, a different task in each.
    domains = [t.domain or "?" for t in tasks]
    with tempfile.TemporaryDirectory(prefix="gh-osworld-coverage-") as files:
        for start_state in args.start_state or ["osworld-desktop", "linux-desktop", "linux-tiny"]:
            fetcher = OfflineFetcher(Path(files))
            cases, report = import_tasks(tasks, Target.named(start_state), fetcher)
            if args.markdown:
                print(f"\n**{start_state}**: {report.totals()}\n")
                print("| domain | tasks | imported | skipped, by reason |\n|---|---|---|---|")
                for d in dict.fromkeys(domains):
                    rs = [r for r, rd in zip(report.results, domains, strict=True) if rd == d]
                    why = collections.Counter(str(r.reason) for r in rs if r.reason is not None)
                    print(f"| {d} | {len(rs)} | {sum(r.reason is None for r in rs)} | "
                          + ", ".join(f"{k} {n}" for k, n in why.most_common()) + " |")
                continue
            print(f"{start_state}: {report.totals()}")
            evaluators = collections.Counter(c["metadata"]["osworld_evaluator"].split("(")[0] for c in cases)
            print("   imported, by first metric: " + ", ".join(f"{k} {n}" for k, n in evaluators.most_common()))
            names = collections.Counter(f"{r.reason} {r.detail.rsplit(': ', 1)[-1]}" for r in report.results
                                        if r.reason is not None and r.reason.value.startswith("unsupported"))
            for name, n in names.most_common(args.top):
                print(f"   {n:4d}  {name}")


if __name__ == "__main__":
    main()
