"""A command agent that holds its attempt in the task phase until the test lets it go.

argv[1]: a directory. It writes `<attempt_id>.entered` there at once, then waits (up to 500 s) for a
file named `release`, and answers "released". The test uses it to keep an attempt in progress while
it saves a new version of the attempt's start state.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main() -> None:
    doc = json.load(sys.stdin)
    gate = Path(sys.argv[1])
    (gate / f"{doc['attempt_id']}.entered").write_text("1")
    deadline = time.monotonic() + 500
    while not (gate / "release").exists():
        if time.monotonic() > deadline:
            print("never released", file=sys.stderr)
            sys.exit(2)
        time.sleep(0.2)
    print("released")


if __name__ == "__main__":
    main()
