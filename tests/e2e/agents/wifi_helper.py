"""A test agent (command kind, docs/agents.md) that needs a password only the customer knows.

It opens `cat > file` on the guest's console, asks the simulated customer to type the Wi-Fi
password (the customer types it into the focused console, through the runner), ends the input, and
writes the Wi-Fi configuration from the file. It never prints the password.
"""

from __future__ import annotations

import json
import sys
import time

import httpx

WRITE_CONFIG = ("test -s /root/typed && printf 'ssid=HomeNet\\npsk=%s\\n' \"$(cat /root/typed)\" > /etc/wifi.conf "
                "&& rm -f /root/typed && echo configured")


def main() -> int:
    doc = json.load(sys.stdin)
    url, token = doc["machine"]["url"], doc["machine"]["token"]
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(timeout=120, headers=headers) as http:
        def post(path: str, body: dict[str, object]) -> dict[str, object]:
            r = http.post(f"{url}{path}", json=body)
            r.raise_for_status()
            return dict(r.json())

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
