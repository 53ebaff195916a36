"""A test agent (command kind, docs/agents.md) that needs a password only the customer knows.

It opens `cat > file` on the guest's console, asks the simulated customer to type the Wi-Fi
password (the customer types it into the focused console, through the runner), ends the input, and
writes the Wi-Fi configuration from the file. It never prints the password.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request

WRITE_CONFIG = ("test -s /root/typed && printf 'ssid=HomeNet\\npsk=%s\\n' \"$(cat /root/typed)\" > /etc/wifi.conf "
                "&& rm -f /root/typed && echo configured")


def main() -> int:
    doc = json.load(sys.stdin)
    url, token = doc["machine"]["url"], doc["machine"]["token"]

    def post(path: str, body: dict[str, object]) -> dict[str, object]:
        # stdlib only: the agent runs as its own uid under the system python3 (tests/agentfiles.py)
        req = urllib.request.Request(f"{url}{path}", method="POST", data=json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            return dict(json.loads(resp.read()))

    post("/input", {"events": [{"type": "type", "text": "cat > /root/typed\n"}]})
    answer = post("/ask", {"question": "Could you type your Wi-Fi password now, please?"})["answer"]
    post("/input", {"events": [{"type": "key", "keys": ["ENTER"]}, {"type": "key", "keys": ["CTRL", "D"]}]})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if post("/exec", {"script": WRITE_CONFIG, "timeout": 30}).get("stdout") == "configured\n":
            print(f"Your Wi-Fi is set up again. (The customer said: {answer})")
            return 0
        time.sleep(1)
    print("the typed password never arrived", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
