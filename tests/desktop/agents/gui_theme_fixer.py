"""A test agent (command kind, docs/agents.md) that fixes DSK-01 (examples/desktop-basics.yaml: the
dark theme switched on) through the screen and the input devices only, never `/exec`: it presses
ctrl+alt+t, watches the screen until a window has appeared and stopped changing, types the command
that sets the light theme with Return, and answers.

argv[1]: the command to type. Stdlib only: it runs as its own uid under the system python3
(tests/agentfiles.py).
"""

from __future__ import annotations

import json
import struct
import sys
import time
import urllib.request
import zlib
from collections.abc import Callable

APPEARS_WITHIN = 180.0  # a terminal's first start in a restored desktop, under TCG on a loaded host
SETTLES_WITHIN = 30.0
LOOK_EVERY = 1.0
# Screen rows that change when a window appears (a terminal is hundreds of rows tall) and at most
# while nothing but the panel's clock moves (a line of text).
WINDOW_ROWS = 150
QUIET_ROWS = 40
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # PNG colour type -> samples per pixel


def rows(png: bytes) -> list[bytes]:
    """The PNG's scanlines as stored. The runner's screenshots are unfiltered (gh_common/png.py), so a
    row's bytes are its pixels: comparing rows tells how much of the screen changed, with zlib alone."""
    pos, stride, idat = 8, 0, []
    while pos + 8 <= len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        data = png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, _height, depth, colour = struct.unpack(">IIBB", data[:10])
            stride = 1 + (width * CHANNELS[colour] * depth + 7) // 8
        elif kind == b"IDAT":
            idat.append(data)
        pos += 12 + length
    raw = zlib.decompress(b"".join(idat))
    return [raw[i:i + stride] for i in range(0, len(raw), stride)]


def rows_changed(a: bytes, b: bytes) -> int:
    ra, rb = rows(a), rows(b)
    if len(ra) != len(rb):
        return max(len(ra), len(rb))
    return sum(x != y for x, y in zip(ra, rb, strict=True))


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
    if look_until(lambda _last, now: rows_changed(before, now) >= WINDOW_ROWS, APPEARS_WITHIN) is None:
        print("no window appeared after ctrl+alt+t", file=sys.stderr)
        return 1
    # A new window that has stopped changing is painted and has the focus (the window manager gives
    # it to a window it maps): the keys go to it now.
    look_until(lambda last, now: rows_changed(last, now) <= QUIET_ROWS, SETTLES_WITHIN)
    call("/input", {"events": [{"type": "type", "text": command + "\n"}]})
    print("Your windows have the normal light look again.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
