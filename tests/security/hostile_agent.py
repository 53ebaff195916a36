"""A hostile command agent: it tries to reach what grades it, and answers with what each try got.

argv: the server's data dir, the server's pid, a nonce (markers in /tmp, so two copies can wait for each
other: each one's tries on the other need the other alive). stdlib only (tests/agentfiles.py).
Its answer is JSON: {try: "denied: <errno>" | "LEAKED: <what>"}.
"""

from __future__ import annotations

import base64
import glob
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

ALLOWED_ENV = {"PATH", "LANG", "HOME", "TMPDIR", "GH_MACHINE_API_URL", "GH_MACHINE_API_TOKEN", "GH_ATTEMPT_ID"}


def attempt(what: str, fn) -> str:  # type: ignore[no-untyped-def]
    try:
        got = fn()
    except PermissionError as e:  # only a refusal counts: a missing file is no proof of anything
        return f"denied: {type(e).__name__}"
    except OSError as e:
        return f"UNCLEAR: {what}: {e}"
    return f"LEAKED: {what}: {str(got)[:200]}"


def opened(path: str) -> str:
    # Non-blocking: a pipe it may open must not hang the try; opening it at all is the leak.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    os.close(fd)
    return "opened"


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(4096)


def websocket(base: str, path: str, token: str | None) -> str:
    """Open a WebSocket by hand (stdlib only) and say what the server did: refused the upgrade, or
    closed at once (its code and reason); anything else it sends is a leak."""
    u = urllib.parse.urlsplit(base)
    with socket.create_connection((u.hostname or "127.0.0.1", u.port or 80), timeout=30) as s:
        key = base64.b64encode(os.urandom(16)).decode()
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        s.sendall((f"GET {path} HTTP/1.1\r\nHost: {u.netloc}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{auth}\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                return "denied: the server hung up"
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        status = head.split(b" ")[1].decode()
        if status != "101":
            return f"denied: HTTP {status}"
        while len(rest) < 2 or len(rest) < 2 + (rest[1] & 0x7F):
            chunk = s.recv(4096)
            if not chunk:
                return "denied: closed without a frame"
            rest += chunk
        if rest[0] & 0x0F == 8:
            return f"denied: closed {int.from_bytes(rest[2:4], 'big')} {rest[4:2 + (rest[1] & 0x7F)].decode()}"
        return f"LEAKED: {path} sent a frame"


def vnc_ports() -> str:
    """QEMU's VNC server would listen on 5900 + display by default: nothing may answer there."""
    for port in range(5900, 5911):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                return f"LEAKED: port {port}: {s.recv(12)!r}"
        except ConnectionRefusedError:
            continue
        except OSError as e:
            return f"UNCLEAR: port {port}: {e}"
    return "denied: nothing listens on 5900-5910"


def peers() -> list[int]:
    me = os.getpid()
    found = []
    for d in glob.glob("/proc/[0-9]*"):
        pid = int(d.rsplit("/", 1)[1])
        try:
            if pid != me and b"hostile_agent.py" in read(f"{d}/cmdline") and b"python" in read(f"{d}/cmdline"):
                found.append(pid)
        except OSError:
            continue
    return found


def main() -> int:
    doc = json.load(sys.stdin)
    data_dir, server_pid, nonce = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    out: dict[str, str] = {}
    extra = sorted(set(os.environ) - ALLOWED_ENV)
    out["environment"] = f"LEAKED: {extra}" if extra else "denied: only the documented variables"
    out["data_dir"] = attempt("listing", lambda: os.listdir(data_dir))
    out["admin_key"] = attempt("key file", lambda: read(os.path.join(data_dir, "admin-api-key")))
    out["database"] = attempt("database", lambda: read(os.path.join(data_dir, "gh-server.db")))
    out["server_environ"] = attempt("server environ", lambda: read(f"/proc/{server_pid}/environ"))
    out["server_fds"] = attempt("server fds", lambda: os.listdir(f"/proc/{server_pid}/fd"))
    # The API with the machine token: it opens the machine API only, never the Evals API.
    req = urllib.request.Request(doc["machine"]["url"].split("/v1/")[0] + "/v1/test_cases",
                                 headers={"Authorization": f"Bearer {doc['machine']['token']}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            out["evals_api"] = f"LEAKED: HTTP {r.status}"
    except urllib.error.HTTPError as e:
        out["evals_api"] = f"denied: HTTP {e.code}"
    # Live views of a machine: no ticket with the machine token, no runner's view socket, no guessed ticket,
    # no display of libvirt's to open (no TCP port; its per-domain directories closed to us).
    base = doc["machine"]["url"].split("/v1/")[0]
    req = urllib.request.Request(base + "/v1/start_states/ss_anything/view", method="POST", data=b"",
                                 headers={"Authorization": f"Bearer {doc['machine']['token']}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            out["view_ticket"] = f"LEAKED: HTTP {r.status}"
    except urllib.error.HTTPError as e:
        out["view_ticket"] = f"denied: HTTP {e.code}"
    req = urllib.request.Request(f"{base}/v1/attempts/{doc['attempt_id']}/view", method="POST", data=b"",
                                 headers={"Authorization": f"Bearer {doc['machine']['token']}"})
    try:  # its own attempt's machine: watching it is a person's, never the agent's
        with urllib.request.urlopen(req, timeout=30) as r:
            out["attempt_view_ticket"] = f"LEAKED: HTTP {r.status}"
    except urllib.error.HTTPError as e:
        out["attempt_view_ticket"] = f"denied: HTTP {e.code}"
    out["runner_view_socket"] = websocket(base, "/v1/runners/views/abcdefgh12345678", doc["machine"]["token"])
    out["live_view_socket"] = websocket(base, "/v1/live/lv_" + "A" * 43, None)
    out["libvirt_domain_dirs"] = attempt("libvirt's per-domain dirs", lambda: os.listdir("/var/lib/libvirt/qemu"))
    out["vnc_tcp"] = vnc_ports()
    deadline = time.monotonic() + 60
    while not peers() and time.monotonic() < deadline:
        time.sleep(0.1)
    others = peers()
    if not others:
        out["peer"] = "no other attempt's agent ran at the same time"
    for pid in others[:1]:
        proc = f"/proc/{pid}"
        out["peer_environ"] = attempt("another attempt's environ (its token)", lambda: read(f"{proc}/environ"))  # noqa: B023
        out["peer_stdin"] = attempt("another attempt's request document", lambda: opened(f"{proc}/fd/0"))  # noqa: B023
        try:
            home = os.readlink(f"{proc}/cwd")
            out["peer_home"] = attempt("another attempt's HOME", lambda: os.listdir(home))  # noqa: B023
        except OSError as e:
            out["peer_home"] = f"denied: {type(e).__name__}" if isinstance(e, PermissionError) else f"UNCLEAR: {e}"
    # Stay until the peer is done too: its tries on this process need it alive.
    with open(f"/tmp/gh-hostile-{nonce}-{os.getpid()}", "w"):
        pass
    while len(glob.glob(f"/tmp/gh-hostile-{nonce}-*")) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
