"""A command agent for tests/e2e/test_resume.py: ten steps, a save point, five steps more, then it tells
the test (a file) and waits for the test to say its runner was killed; then it acts until the machine,
back from the save point, refuses an action `machine_restored`, looks again, counts the steps the
guest holds and fixes the case. argv[1]: a directory the test and this agent share."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def call(url: str, token: str, path: str, body: dict[str, object] | None = None) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(url + path, method="GET" if body is None else "POST",
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:  # long: a request waits on the server while the machine is away
        with urllib.request.urlopen(req, timeout=600) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw[:1] == b"{" else {})
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def step(url: str, token: str, n: int) -> None:
    status, res = call(url, token, "/exec", {"script": f"echo {n} >> /root/steps && sync", "timeout": 60})
    assert status == 200 and res.get("exit_code") == 0, (n, status, res)


def main() -> None:
    doc = json.load(sys.stdin)
    shared = Path(sys.argv[1])
    url, token = doc["machine"]["url"], doc["machine"]["token"]
    for n in range(1, 11):
        step(url, token, n)
    status, point = call(url, token, "/save_point", {})
    assert status == 200 and point.get("step") == 10, (status, point)
    for n in range(11, 16):
        step(url, token, n)
    (shared / "at-step-15").write_text(str(point.get("save_point_id")))
    deadline = time.monotonic() + 600
    while not (shared / "killed").exists():
        assert time.monotonic() < deadline, "the test never killed the runner"
        time.sleep(0.2)
    seen = []
    while len(seen) < 20:
        status, res = call(url, token, "/exec", {"script": "echo 16 >> /root/steps", "timeout": 60})
        code = (res.get("error") or {}).get("code") if status != 200 else "ok"  # type: ignore[union-attr]
        seen.append(f"{status} {code}")
        if code == "machine_restored":
            break
        time.sleep(1)
    status, _ = call(url, token, "/screen")  # looks again
    assert status == 200, status
    status, res = call(url, token, "/exec", {"script": "wc -l < /root/steps; touch /root/fixed", "timeout": 60})
    assert status == 200, (status, res)
    print(f"{', '.join(seen)}; the guest holds {str(res.get('stdout')).strip()} steps")


if __name__ == "__main__":
    main()
