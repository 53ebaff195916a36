"""A command agent that sets a machine up through the machine API (as an external agent must).

It writes its prompt into /root/by-external with one `exec`, reads it back, and answers with it.
"""

from __future__ import annotations

import json
import shlex
import sys
import urllib.request


def main() -> None:
    doc = json.load(sys.stdin)
    url, token = doc["machine"]["url"], doc["machine"]["token"]
    script = f"printf '%s' {shlex.quote(doc['prompt'])} > /root/by-external && cat /root/by-external"
    req = urllib.request.Request(url + "/exec", method="POST", data=json.dumps({"script": script}).encode(),
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        res = json.loads(resp.read())
    if res["exit_code"] != 0:
        print(f"exec failed: {res}", file=sys.stderr)
        sys.exit(1)
    print(res["stdout"])


if __name__ == "__main__":
    main()
