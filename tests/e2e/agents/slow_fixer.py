"""A test agent (command kind, docs/agents.md) that fixes the machine at once through the machine
API, types something (so the replay has an input frame), then keeps working past the case's
`limits.minutes`: the runner must stop the task at the limit and still run the check after. With
`--quick` it answers as soon as the fix is in."""

from __future__ import annotations

import json
import sys
import time
import urllib.request


def post(url: str, token: str, body: dict[str, object]) -> dict[str, object]:
    # stdlib only: the agent runs as its own uid under the system python3 (tests/agentfiles.py)
    req = urllib.request.Request(url, method="POST", data=json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return dict(json.loads(resp.read()))


def main() -> int:
    doc = json.load(sys.stdin)
    url, token = doc["machine"]["url"], doc["machine"]["token"]
    fix = "chmod 0755 /opt/tool/hello.sh"
    res = post(f"{url}/exec", token, {"script": fix, "timeout": 60})
    if res.get("exit_code") != 0:
        print(f"fix failed: {res}", file=sys.stderr)
        return 1
    post(f"{url}/input", token, {"events": [{"type": "type", "text": "echo fixed\n"}]})
    if "--quick" in sys.argv:  # an ordinary agent: done once the fix is in
        print("I made the script executable again.")
        return 0
    time.sleep(limit_seconds(doc) * 10)  # far past the limit: only the runner's limit can end the task
    print("done")
    return 0


def limit_seconds(doc: dict) -> float:
    return float((doc.get("limits") or {}).get("minutes") or 1) * 60.0


if __name__ == "__main__":
    sys.exit(main())
