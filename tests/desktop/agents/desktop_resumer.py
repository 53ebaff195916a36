"""A command agent for tests/desktop/test_resume_registry_desktop.py: tests/e2e/agents/resumer.py's flow on
linux-desktop with a GUI application open. It writes a note, opens Mousepad on it, notes Mousepad's pid,
takes a few steps and asks for a save point; then it writes /home/user/after, tells the test (the file
`saved`: the save point and the pid, as JSON) and waits for the test to say its runner was killed. Then it
acts until the machine, back from the save point, refuses an action `machine_restored`, looks again, reads
what the restored desktop holds (Mousepad's pid and window, /home/user/after), fixes the case and answers
with what it read. argv[1]: a directory the test and this agent share. Stdlib only (tests/agentfiles.py)."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

NOTE = "/home/user/resume-note.txt"
# Mousepad titles its window after the file: a visible window so named is the note's.
WINDOW = "xdotool search --onlyvisible --name resume-note"
AFTER = "/home/user/after"  # written after the save point: a restored guest must not hold it
FIXED = "/home/user/fixed"  # what the case's check looks for
SAVE_S = 900  # a desktop's save point is a 2 GiB memory save: minutes under TCG on a loaded host
KILLED_S = 3600  # the test pushes the save point to the registry and starts a second runner first


def call(url: str, token: str, path: str, body: dict[str, object] | None = None,
         timeout: float = 660) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(url + path, method="GET" if body is None else "POST",
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:  # long: a request waits on the server while the machine is away (its restore: up to 600 s)
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw[:1] == b"{" else {})
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def sh(url: str, token: str, script: str) -> str:
    """The stdout of `script`, run in the signed-in session; it must succeed."""
    status, res = call(url, token, "/exec", {"script": script, "timeout": 120})
    assert status == 200 and res.get("exit_code") == 0, (script, status, res)
    return str(res.get("stdout") or "")


def window_shown(url: str, token: str, timeout: float) -> None:
    """Mousepad's window on the screen (it maps seconds after its start under TCG): polled, with a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        status, res = call(url, token, "/exec", {"script": f"{WINDOW} >/dev/null", "timeout": 60})
        assert status == 200, (status, res)
        if res.get("exit_code") == 0:
            return
        assert time.monotonic() < deadline, f"Mousepad's window did not show within {timeout:.0f} s"
        time.sleep(1)


def main() -> None:
    doc = json.load(sys.stdin)
    shared = Path(sys.argv[1])
    url, token = doc["machine"]["url"], doc["machine"]["token"]
    sh(url, token, f"echo before > {NOTE}; setsid mousepad {NOTE} >/dev/null 2>&1 &")
    window_shown(url, token, 300)
    pids = sh(url, token, "pgrep -x mousepad").split()
    assert len(pids) == 1, pids
    pid = pids[0]
    for n in range(1, 4):
        sh(url, token, f"echo {n} >> /home/user/steps")
    status, point = call(url, token, "/save_point", {}, timeout=SAVE_S)
    assert status == 200 and point.get("save_point_id"), (status, point)
    sh(url, token, f"touch {AFTER} && sync")
    # Written whole, then renamed: the test reads it as soon as it is there.
    tmp = shared / "saved.tmp"
    tmp.write_text(json.dumps({"save_point_id": point["save_point_id"], "pid": pid}))
    tmp.rename(shared / "saved")
    deadline = time.monotonic() + KILLED_S
    while not (shared / "killed").exists():
        assert time.monotonic() < deadline, "the test never killed the runner"
        time.sleep(0.2)
    seen: list[str] = []
    while len(seen) < 20:
        status, res = call(url, token, "/exec", {"script": "echo 4 >> /home/user/steps", "timeout": 60})
        got = res.get("error")
        error: dict[str, object] = got if isinstance(got, dict) else {}
        code = "ok" if status == 200 else error.get("code")
        # A refusal without a code is told with its message: the test's failure then says what it was.
        seen.append(f"{status} {code or error.get('message')}")
        if code == "machine_restored":
            break
        time.sleep(1)
    status, _ = call(url, token, "/screen")  # looks again
    assert status == 200, status
    # One line each: the window, Mousepad's pids now (none: an empty line), the post-save file.
    held = sh(url, token, f"if {WINDOW} >/dev/null; then echo shown; else echo gone; fi; "
                          "echo $(pgrep -x mousepad); "
                          f"if [ -e {AFTER} ]; then echo present; else echo absent; fi; "
                          f"touch {FIXED}").splitlines()
    assert len(held) == 3, held
    window, now, after = held
    print(f"{', '.join(seen)}; mousepad {pid} before, {now or 'none'} now, window {window}; after {after}")


if __name__ == "__main__":
    main()
