"""A test agent (command kind, docs/agents.md) that fixes the machine at once through the machine
API, types something (so the replay has an input frame), then keeps working past the case's
`limits.minutes`: the runner must stop the task at the limit and still run the check after. With
`--quick` it answers as soon as the fix is in."""

from __future__ import annotations

import json
import sys
import time

import httpx


def main() -> int:
    doc = json.load(sys.stdin)
    url, token = doc["machine"]["url"], doc["machine"]["token"]
    headers = {"Authorization": f"Bearer {token}"}
    fix = "chmod 0755 /opt/tool/hello.sh"
    with httpx.Client(timeout=120) as http:
        r = http.post(f"{url}/exec", json={"script": fix, "timeout": 60}, headers=headers)
        r.raise_for_status()
        if r.json().get("exit_code") != 0:
            print(f"fix failed: {r.text}", file=sys.stderr)
            return 1
        http.post(f"{url}/input", json={"events": [{"type": "type", "text": "echo fixed\n"}]}, headers=headers)
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
