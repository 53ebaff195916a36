"""A command agent that only looks: it asks the machine API for the screen, over and over, until the test
lets it go (the takeover tests hold it mid-look).

argv[1]: a directory. It writes `<attempt_id>.token` (its machine API's url and token, so the test can ask
as the agent would) and then appends one line per screen it got to `<attempt_id>.screens`: the wall-clock
time it asked and the time it got the answer. It ends when a file `<attempt_id>.done` appears (answer
"looked N times"), or after 900 s (exit 2). A screen refused (not 200) ends it with exit 3.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def main() -> None:
    doc = json.load(sys.stdin)
    gate = Path(sys.argv[1])
    aid = doc["attempt_id"]
    url, token = doc["machine"]["url"], doc["machine"]["token"]
    (gate / f"{aid}.token").write_text(json.dumps({"url": url, "token": token}))
    screens = gate / f"{aid}.screens"
    deadline = time.monotonic() + 900
    looked = 0
    while not (gate / f"{aid}.done").exists():
        if time.monotonic() > deadline:
            print("never let go", file=sys.stderr)
            sys.exit(2)
        asked = time.time()
        req = urllib.request.Request(url + "/screen", headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=3600) as resp:
                resp.read()
        except urllib.error.HTTPError as e:
            print(f"screen answered {e.code}: {e.read()[:300]!r}", file=sys.stderr)
            sys.exit(3)
        looked += 1
        with screens.open("a") as f:
            f.write(f"{asked} {time.time()}\n")
        time.sleep(0.2)
    print(f"looked {looked} times")


if __name__ == "__main__":
    main()
