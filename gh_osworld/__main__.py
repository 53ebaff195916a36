"""`python3 -m gh_osworld SPEC.json`: prints the check's score (evaluate.py) as its last line and exits 0;
exits 1 with a message when no verdict can be given (a malformed spec, an unknown name, a crash): never a
verdict against the agent.

The score is printed as the check contract reads it (docs/osworld.md, "Scores"): `True` for 1, `False`
for 0, and anything between as Python's repr of the float (`0.9967...`), the shortest text that reads
back as the same number."""

from __future__ import annotations

import json
import sys
import traceback

from gh_osworld.evaluate import evaluate
from gh_osworld.spec import SpecError, parse


def show(score: float) -> str:
    if score == 1.0:
        return "True"
    if score == 0.0:
        return "False"
    return repr(score)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python3 -m gh_osworld SPEC.json", file=sys.stderr)
        return 2
    try:
        with open(argv[0], encoding="utf-8") as f:
            spec = parse(json.load(f))
        score = evaluate(spec)
    except SpecError as e:
        print(f"gh_osworld: the check's spec: {e}", file=sys.stderr)
        return 1
    except Exception:  # a crash of ours: no verdict, never a failure of the agent
        print("gh_osworld: the check crashed:", file=sys.stderr)
        traceback.print_exc(limit=8)
        return 1
    print(show(score))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
