"""A small command agent for the tests: reads the request document on stdin, uses the machine API,
prints its final answer. argv[1]: where to write the request document it got; argv[2]: mode."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request


def call(url: str, token: str, path: str, body: dict[str, object] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url + path, method="GET" if body is None else "POST",
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def main() -> None:
    doc = json.load(sys.stdin)
    out_path, mode = sys.argv[1], sys.argv[2]
    # Write, then rename: a retry's agent has another uid (the sandbox) and may not overwrite the
    # first one's file, but may replace it in the test's world-writable directory.
    tmp = f"{out_path}.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({**doc, "pid": os.getpid()}, f)
    os.replace(tmp, out_path)
    url, token = doc["machine"]["url"], doc["machine"]["token"]
    if mode == "fail":
        print("boom: could not think", file=sys.stderr)
        sys.exit(3)
    if mode == "hang":
        time.sleep(600)
    if mode == "steps":  # input until the step limit refuses one, then carry on as if nothing happened
        while call(url, token, "/input", {"events": [{"type": "key", "keys": ["A"]}]})[0] == 200:
            pass
        time.sleep(600)
    if mode == "exec-fail":  # gives up (exit 4) when its exec is refused
        status, body = call(url, token, "/exec", {"script": "true", "timeout": 30})
        if status != 200:
            print(f"exec answered {status}", file=sys.stderr)
            sys.exit(4)
    if mode == "hang-once":  # the first attempt hangs (its server is killed under it); its retry answers
        marker = out_path + ".once"
        if not os.path.exists(marker):
            open(marker, "w").close()
            time.sleep(600)
        print("done on the retry")
        return
    if mode == "save_point":  # a save point between two steps; prints what the machine API answered
        call(url, token, "/exec", {"script": "touch /root/before", "timeout": 30})
        status, body = call(url, token, "/save_point", {})
        point = json.loads(body)
        print(f"save_point {status} {point.get('save_point_id')} step {point.get('step')}")
        return
    if mode == "resume":  # a save point, then on through its runner's loss (tests/gateway/test_resume.py)
        call(url, token, "/exec", {"script": "echo step 1", "timeout": 30})
        status, body = call(url, token, "/save_point", {})
        assert status == 200, (status, body)
        call(url, token, "/exec", {"script": "echo step 2", "timeout": 30})
        seen = []
        while len(seen) < 10:  # until the machine is back from its save point
            status, body = call(url, token, "/exec", {"script": "echo step 3", "timeout": 30})
            code = ((json.loads(body) or {}).get("error") or {}).get("code") if status != 200 else None
            seen.append(f"{status} {code}")
            if code == "machine_restored":
                break
        call(url, token, "/screen")  # looks again
        status, _ = call(url, token, "/exec", {"script": "echo fixed", "timeout": 30})
        print(f"{', '.join(seen)}; then {status}")
        return
    if mode == "approve":
        status, body = call(url, token, "/approval", {"request": "restart the print spooler"})
        status2, _ = call(url, token, "/approval", {"request": ""})
        print(f"approval {status} {json.loads(body).get('decision')} empty {status2}")
        return
    if mode in ("ask", "ask-twice"):
        status, body = call(url, token, "/ask", {"question": "What is your Wi-Fi called?"})
        if mode == "ask-twice":
            status, body = call(url, token, "/ask", {"question": "Is it connected now?"})
        print(f"ask {status} {json.loads(body).get('answer', '')}")
        return
    if mode == "many":  # 50 machine requests in a row, each answered or the agent fails
        for i in range(50):
            status, body = call(url, token, "/exec", {"script": f"echo {i}", "timeout": 1})
            assert status == 200, (i, status, body)
        print("50 answered")
        return
    status, png = call(url, token, "/screen")
    assert status == 200 and png.startswith(b"\x89PNG"), (status, png[:20])
    status, _bad = call(url, "wrong-token", "/exec", {"script": "true"})
    assert status == 401, status
    status, body = call(url, token, "/input", {"events": [{"type": "type", "text": "hi"}]})
    assert status == 200, (status, body)
    status, body = call(url, token, "/exec", {"script": "cat /etc/hostname", "timeout": 30})
    assert status == 200, (status, body)
    res = json.loads(body)
    print(f"fixed: {res['stdout'].strip()} (exit {res['exit_code']})")


if __name__ == "__main__":
    main()
