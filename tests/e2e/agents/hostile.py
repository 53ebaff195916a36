#!/usr/bin/env python3
"""A hostile command agent (stdlib only; run by gh-server in its sandbox): it does one hostile thing,
chosen by argv[1], then answers. What the machine API answered it is in its answer, as JSON
`{"statuses": {status: count}}`, so the caller sees every answer an agent saw. Used by
tests/gateway/test_escape.py, tests/e2e/test_escape.py and bench/escape.py.

Modes (docs/agents.md, "What counts against whom"):
  answer-nul, answer-long, answer-bytes, answer-endless    an answer that breaks its contract (stdout)
  input-10mb, input-unknown-key, input-offscreen, input-100k-events
  exec-nul-script, exec-nul-env, ask-nul, ask-flood, approval-flood, screen-8-threads
  kill-guest-agent, stop-guest-agent, remove-guest-agent    (as root, through /exec: the check's channel)
"""

from __future__ import annotations

import json
import sys
import threading
import urllib.error
import urllib.request
from collections import Counter

Statuses = Counter[int]


def call(url: str, token: str, path: str, body: object = None, raw: bytes | None = None) -> int:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url + path, method="GET" if data is None else "POST", data=data,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as e:
        e.read()
        return int(e.code)
    except (urllib.error.URLError, ConnectionError):
        return 0  # the server closed the connection on a body it refused


def in_threads(n: int, each: int, fn: object) -> Statuses:
    seen: Statuses = Counter()
    lock = threading.Lock()

    def work() -> None:
        for _ in range(each):
            s = fn()  # type: ignore[operator]
            with lock:
                seen[s] += 1
    threads = [threading.Thread(target=work) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return seen


# The check's channel, broken from inside the guest: qemu-ga and gh-execd (linux-tiny, where exec is root),
# qemu-ga (linux-desktop, where exec is the signed-in user with passwordless sudo). At once, inside the exec
# that does it (a process left in the background is ended with the exec's own process group): that exec's
# own answer may then fail, which is the agent's doing too.
_AS_ROOT = 'S=; [ "$(id -u)" = 0 ] || S="sudo -n"; '
_PIDS = "$(pidof qemu-ga gh-execd)"
CHANNEL = {
    "kill-guest-agent": _AS_ROOT + f"$S kill -9 {_PIDS}; echo killed",
    "stop-guest-agent": _AS_ROOT + f"$S kill -STOP {_PIDS}; echo stopped",
    "remove-guest-agent": _AS_ROOT + ("for p in /usr/sbin/qemu-ga /usr/bin/qemu-ga /usr/sbin/gh-execd; "
                                      f"do $S rm -f $p; done; $S kill -9 {_PIDS}; echo removed"),
}


def act(mode: str, url: str, token: str) -> Statuses:
    one = Counter[int]()
    if mode == "input-10mb":
        one[call(url, token, "/input", {"events": [{"type": "type", "text": "a" * 10_000_000}]})] += 1
    elif mode == "input-unknown-key":
        one[call(url, token, "/input", {"events": [{"type": "key", "keys": ["HYPERDRIVE"]}]})] += 1
        one[call(url, token, "/input", {"events": [{"type": "tap", "x": 1}]})] += 1
        one[call(url, token, "/input", {"events": [{"type": "click", "x": 1, "y": 1, "force": 9}]})] += 1
    elif mode == "input-offscreen":
        one[call(url, token, "/input", {"events": [{"type": "click", "x": 16000, "y": 16000}]})] += 1
        one[call(url, token, "/input", {"events": [{"type": "move", "x": 99_999, "y": -5}]})] += 1
    elif mode == "input-100k-events":
        one[call(url, token, "/input", {"events": [{"type": "move", "x": 1, "y": 1}] * 100_000})] += 1
    elif mode == "exec-nul-script":
        one[call(url, token, "/exec", {"script": "echo a\u0000b"})] += 1
    elif mode == "exec-nul-env":
        one[call(url, token, "/exec", {"script": "true", "env": {"X": "a\u0000b"}})] += 1
        one[call(url, token, "/exec", {"script": "true", "env": {"A=B": "c"}})] += 1
    elif mode == "ask-nul":
        one[call(url, token, "/ask", {"question": "why\u0000"})] += 1
        one[call(url, token, "/approval", {"request": "reboot\u0000"})] += 1
        one[call(url, token, "/input", {"events": [{"type": "type", "text": "a\u0000b"}]})] += 1
    elif mode == "ask-flood":
        one = in_threads(8, 25, lambda: call(url, token, "/ask", {"question": "Is it fixed?"}))
    elif mode == "approval-flood":
        one = in_threads(8, 125, lambda: call(url, token, "/approval", {"request": "reboot"}))
    elif mode == "screen-8-threads":
        one = in_threads(8, 25, lambda: call(url, token, "/screen"))
    elif mode in CHANNEL:
        one[call(url, token, "/exec", {"script": CHANNEL[mode], "timeout": 30})] += 1
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    return one


def main() -> None:
    mode = sys.argv[1]
    doc = json.load(sys.stdin)
    out = sys.stdout.buffer
    if mode == "answer-nul":
        out.write(b"fixed it\x00really")
        return
    if mode == "answer-long":
        out.write(("日" * 99_000).encode())
        return
    if mode == "answer-endless":  # prints without end: gh-server must not hold it all
        while True:
            out.write(b"y" * 65536)
    if mode == "answer-bytes":
        out.write(b"fixed \xff\xfe it")
        return
    seen = act(mode, doc["machine"]["url"], doc["machine"]["token"])
    out.write(json.dumps({"statuses": {str(k): v for k, v in sorted(seen.items())}}).encode())


if __name__ == "__main__":
    main()
