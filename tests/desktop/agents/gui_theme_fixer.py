"""A test agent (command kind, docs/agents.md) that fixes DSK-01 (examples/desktop-basics.yaml: the
dark theme switched on) through the screen and the input devices only, never `/exec`: it presses
ctrl+alt+t, watches the screen until the terminal's window has appeared and stopped changing, types
the command that sets the light theme with Return, and answers.

argv[1]: the command to type. Stdlib only: it runs as its own uid under the system python3
(tests/agentfiles.py).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Callable

APPEARS_WITHIN = 180.0  # a terminal's first start in a restored desktop, under TCG on a loaded host
SETTLES_WITHIN = 30.0
LOOK_EVERY = 1.0


def main() -> int:
    doc = json.load(sys.stdin)
    url, token = doc["machine"]["url"], doc["machine"]["token"]
    command = sys.argv[1]

    def call(path: str, body: dict[str, object] | None = None) -> bytes:
        req = urllib.request.Request(f"{url}{path}", method="GET" if body is None else "POST",
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            return bytes(resp.read())

    def look_until(done: Callable[[bytes, bytes], bool], within: float) -> bytes | None:
        """The screen once `done(previous, now)` holds, looking every second; None past `within`."""
        deadline = time.monotonic() + within
        last = call("/screen")
        while time.monotonic() < deadline:
            time.sleep(LOOK_EVERY)
            now = call("/screen")
            if done(last, now):
                return now
            last = now
        return None

    before = call("/screen")
    call("/input", {"events": [{"type": "key", "keys": ["ctrl", "alt", "t"]}]})
    if look_until(lambda _last, now: now != before, APPEARS_WITHIN) is None:
        print("no window appeared after ctrl+alt+t", file=sys.stderr)
        return 1
    # A window that has stopped changing is painted and its shell has started: it takes the keys now.
    look_until(lambda last, now: now == last, SETTLES_WITHIN)
    call("/input", {"events": [{"type": "type", "text": command + "\n"}]})
    print("Your windows have the normal light look again.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
