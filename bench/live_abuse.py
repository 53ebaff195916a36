"""The live channel against its own members: each attack of issue 49 run on the real stack, with the API's
worst latency while it runs beside its idle p99, and whether the victims' view and takeover still work.

    .venv/bin/python bench/live_abuse.py [--images-dir DIR] [--window-s 10] [--attacks A,B] [--attacker-nice 0,19]

A real gh-server and gh-runner as processes (tests/e2e/faults.py Stack), one attempt of linux-tiny in its task
(a command agent that only waits), a member key that attacks and another member key that watches. A poller in
a process of its own asks `GET /v1/runners` every 50 ms all along; the idle p99 is of a window with no attack.
Its latency is timed from its request sent (httpcore's trace) to its answer: the server's part, its socket's
and its loop's waits included. The whole round trip is printed beside it (`trip ms`): on this VM the
poller's own send() of a 100-byte request sometimes took 35-40 ms, on its CPU inside the kernel, with
gh-server's loop idle and on time meanwhile, and it did so in the idle window as in an attack's (an
instrumented run: a timing middleware outermost, a loop-lag probe, /proc/thread-self/schedstat).
For each attack, for --window-s seconds:

  no_attack       none: the victim's watch alone, as every window has it (the baseline of what an attack adds).
  deflated_2mib   the attacker's watcher offers per-message deflate and sends 2 MiB messages of KeyEvents (3 KB
                  each deflated), reconnecting when dropped: the issue's attack (9.9 s worst before).
  small_flood     64 KiB messages of KeyEvents as fast as the socket takes them, reconnecting when dropped.
  set_encodings   SetEncodings messages as fast as they go (each made QEMU send the display again).
  unread_open     20 viewers that send 64 KiB messages from the moment their socket opens (the relay reads none
                  until their view is open); gh-server's resident memory before and after is printed too.
  tickets_only    unread_open's 20 tickets asked for at once and never opened: a control, what the 20 API calls
                  alone cost beside the sockets.
  seats           12 idle watchers of one member's key (a key of its own) held open, then the admin takes the
                  attempt over.

The attacker stands for a member on another host, but here its client runs on the server's 2 cores: its
threads (20 sockets in unread_open, each with websockets' reader thread, masking 64 KiB frames) take CPU
the server would have on a lab host. `--attacker-nice` runs each attack once per nice value given (each
attack thread and every thread it starts), side by side in one run: at 0 the client's CPU counts against
the server as it would on one shared host, at 19 it yields the cores to the server, as a remote client
would never take them. Each window prints the bench client's CPU seconds in it (the attack's threads and
the victim's watch) and gh-server's. Every API call goes through one shared client: a client per call
builds an SSL context each time (~20 ms of CPU), which alone made unread_open's first half second cost
the server's cores ~0.4 s before.

The victim, during each window: the other member's watcher opens a view and gets a full frame; in the
seats attack, the admin's takeover view gets a full frame, and the attempt is handed back. Target (issue 49):
worst within 3x the idle p99, and nothing the victims do refused. Each window's worst is also put beside the
no_attack window's worst (the same victim's watch, no attack): what the attack itself adds, apart from the
victim's own view opening, which moves a full screen through the server. Everything is removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing as mp
import os
import struct
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from agentfiles import AGENT_PYTHON  # noqa: E402
from e2e.faults import Stack, marker_case  # noqa: E402
from kit.rfb import Viewer  # noqa: E402
from kit.scratch import scratch_dir  # noqa: E402
from websockets.sync.client import ClientConnection, connect  # noqa: E402

HANDSHAKE = b"RFB 003.008\n", b"\x01", b"\x01"
KEYS = struct.pack(">BBxxI", 4, 1, 0x61)
POLL_GAP_S = 0.05
POLL_TIMEOUT_S = 30.0
WAITER = {"id": "waiter", "kind": "command", "timeout": 1800,
          "command": [AGENT_PYTHON, "-c", "import sys, time; sys.stdin.read(); time.sleep(1500); print('waited')"]}


ATTACKS = ("no_attack", "deflated_2mib", "small_flood", "set_encodings", "unread_open", "tickets_only", "seats")


def poll(base_url: str, key: str, conn: Connection) -> None:
    """The poller's process: (start, seconds from its request sent, seconds in all) of each GET /v1/runners
    until told to stop. From sent is the server's part: the client's own send() on this VM once took 35 ms
    of CPU inside the kernel for a 100-byte request, in the idle window as in an attack's (httpcore's trace)."""
    out: list[tuple[float, float, float]] = []
    sent = [0.0]

    def trace(event: str, info: dict[str, object]) -> None:
        if event == "http11.send_request_body.complete":
            sent[0] = time.monotonic()

    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=POLL_TIMEOUT_S) as http:
        while not conn.poll():
            t0 = sent[0] = time.monotonic()
            with contextlib.suppress(httpx.HTTPError):  # a stalled server's timeout is its latency
                http.get("/v1/runners", extensions={"trace": trace}).raise_for_status()
            t1 = time.monotonic()
            out.append((t0, t1 - sent[0], t1 - t0))
            time.sleep(POLL_GAP_S)
    conn.send(out)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Bench:
    def __init__(self, stack: Stack, aid: str) -> None:
        self.stack, self.aid = stack, aid
        self.base = stack.server.base_url
        self.admin = stack.server.api_key
        # One client for every API call, shared by the attack threads (httpx's client is thread-safe): a
        # call of its own each (httpx.post) built an SSL context each time, ~20 ms of this host's CPU per
        # ticket, so unread_open's 20 tickets took ~0.4 s of the server's 2 cores in its first half second.
        self.http = httpx.Client(base_url=self.base, timeout=60)
        self.attacker = self.new_key("attacker")
        self.victim = self.new_key("victim")

    def new_key(self, name: str) -> str:
        r = self.http.post("/v1/api_keys", json={"name": name, "role": "member"},
                           headers={"Authorization": f"Bearer {self.admin}"})
        r.raise_for_status()
        return str(r.json()["key"])

    def ticket(self, key: str) -> str | None:
        r = self.http.post(f"/v1/attempts/{self.aid}/view", headers={"Authorization": f"Bearer {key}"})
        return self.base.replace("http://", "ws://") + r.json()["url"] if r.status_code == 200 else None

    def raw(self, key: str, deflate: bool = False) -> ClientConnection | None:
        url = self.ticket(key)
        if url is None:
            return None
        return connect(url, subprotocols=["binary"], max_size=None, open_timeout=30, close_timeout=1,  # type: ignore[list-item]
                       ping_interval=None, compression="deflate" if deflate else None)

    def victim_watches(self) -> bool:
        url = self.ticket(self.victim)
        if url is None:
            return False
        try:
            with Viewer(url) as v:
                v.handshake(timeout=60)
                v.update(incremental=False, timeout=60)
                return any(v.fb)
        except Exception as e:
            print(f"  victim's view failed: {type(e).__name__}: {e}")
            return False

    def takeover_works(self) -> bool:
        h = {"Authorization": f"Bearer {self.admin}"}
        r = self.http.post(f"/v1/attempts/{self.aid}/takeover", headers=h)
        if r.status_code != 200:
            print(f"  takeover refused: {r.status_code} {r.text}")
            return False
        try:
            with Viewer(self.base.replace("http://", "ws://") + r.json()["view"]["url"]) as v:
                v.handshake(timeout=60)
                v.update(incremental=False, timeout=60)
                return any(v.fb)
        except Exception as e:
            print(f"  takeover's view failed: {type(e).__name__}: {e}")
            return False
        finally:
            self.http.post(f"/v1/attempts/{self.aid}/handback", headers=h)

    def seats(self) -> tuple[str, float, float, bool, str]:
        """12 idle watchers of the attacker's key, then the admin's takeover: the seats attack's window."""
        held: list[Viewer] = []
        attacker = self.new_key("seats")  # a key of its own: the attacks before may have used the other's tickets
        t0 = time.monotonic()
        for _ in range(12):
            url = self.ticket(attacker)
            if url is None:
                continue
            with contextlib.suppress(Exception):
                v = Viewer(url)
                v.handshake(timeout=60)
                held.append(v)
        ok = self.takeover_works()
        # One key seats at most MAX_WATCHES_PER_KEY_MACHINE (gh_server/live/screen_relay.py) of a machine's
        # watchers: another member's watch still finds a seat.
        other = "another member's watch " + ("works" if self.victim_watches() else "refused")
        window = ("seats", t0, time.monotonic(), ok and self.victim_watches(),
                  f"{len(held)} of 12 watchers seated; {other}")
        for v in held:
            v.close()
        return window

    # -- attacks: each runs until `stop` is set -----------------------------------------------------

    def _sender(self, stop: threading.Event, messages: Callable[[], bytes], deflate: bool = False) -> None:
        while not stop.is_set():
            ws = self.raw(self.attacker, deflate)
            if ws is None:
                stop.wait(0.2)
                continue
            try:
                for part in HANDSHAKE:
                    ws.send(part)
                while not stop.is_set():
                    ws.send(messages())
            except Exception:
                pass  # dropped: again
            finally:
                with contextlib.suppress(Exception):
                    ws.close()

    def no_attack(self, stop: threading.Event) -> None:
        """No attack: the window holds only what every attack's window holds besides it (the victim's watch)."""
        stop.wait()

    def deflated_2mib(self, stop: threading.Event) -> None:
        big = KEYS * (2 * 1024 * 1024 // 8)
        self._sender(stop, lambda: big, deflate=True)

    def small_flood(self, stop: threading.Event) -> None:
        chunk = KEYS * (64 * 1024 // 8)
        self._sender(stop, lambda: chunk)

    def set_encodings(self, stop: threading.Event) -> None:
        enc = struct.pack(">BxHii", 2, 2, 16, -223)
        self._sender(stop, lambda: enc)

    def unread_open(self, stop: threading.Event) -> None:
        chunk = KEYS * (64 * 1024 // 8)

        def one() -> None:
            ws = self.raw(self.attacker)
            if ws is None:
                return
            with contextlib.suppress(Exception):
                while not stop.is_set():
                    ws.send(chunk)
            with contextlib.suppress(Exception):
                ws.close()

        threads = [threading.Thread(target=one, daemon=True) for _ in range(20)]
        for t in threads:
            t.start()
        stop.wait()
        for t in threads:
            t.join(10)


    def tickets_only(self, stop: threading.Event) -> None:
        """unread_open's 20 tickets asked for at once, and no socket opened: what the API calls alone cost."""
        threads = [threading.Thread(target=self.ticket, args=(self.attacker,), daemon=True) for _ in range(20)]
        for t in threads:
            t.start()
        stop.wait()
        for t in threads:
            t.join(10)


def niced(nice: int, attack: Callable[[threading.Event], None], stop: threading.Event) -> None:
    """`attack(stop)` in this thread at `nice` (Linux: a thread's own; the threads it starts inherit it)."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    attack(stop)


def cpu_s(pid: int) -> float:
    """The process's user and system CPU seconds so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def qemu_pids(stack_name: str) -> list[int]:
    """The QEMU processes of this stack's machines (their domain names start with the stack's name)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                cmd = (d / "cmdline").read_bytes()
                if b"qemu-system" in cmd and f"guest=gh-{stack_name}".encode() in cmd:
                    pids.append(int(d.name))
    return pids


def softirq_s() -> float:
    """The host's CPU seconds in softirq so far (/proc/stat): on loopback, the TCP receive path of every
    socket runs there, often inside the syscall of whichever process sends."""
    return int(Path("/proc/stat").read_text().split("\n", 1)[0].split()[7]) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images-dir", type=Path, default=Path(os.environ.get("GH_TEST_IMAGES_DIR",
                                                                          "/var/tmp/gh-runner/images")))
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--attacks", default=",".join(ATTACKS),
                    help="which attacks, comma-separated (default all: %(default)s)")
    ap.add_argument("--attacker-nice", default="0",
                    help="the attack threads' nice values, comma-separated: each attack runs once per value")
    args = ap.parse_args()
    attacks = [a for a in args.attacks.split(",") if a]
    try:
        nices = [int(n) for n in args.attacker_nice.split(",") if n]
    except ValueError:
        ap.error(f"--attacker-nice wants integers, comma-separated: {args.attacker_nice!r}")
    if not nices or any(not -20 <= n <= 19 for n in nices):
        ap.error(f"--attacker-nice wants nice values from -20 to 19: {args.attacker_nice!r}")
    if unknown := set(attacks) - set(ATTACKS):
        ap.error(f"no such attack: {', '.join(sorted(unknown))} (known: {', '.join(ATTACKS)})")
    # The attackers' sockets are dropped mid-send by design: websockets' client logs each as an internal error.
    logging.getLogger("websockets").setLevel(logging.CRITICAL)
    case = marker_case("LIVE-ABUSE-01", minutes=30)
    with scratch_dir("gh-bench-live-abuse-") as work, \
            Stack(work, "liveabuse", args.images_dir, slots=1, server_settings={"agents": {"waiter": WAITER}}) as stack:
        run = stack.run([case], repeat=1, name="live abuse", agents=("waiter",))
        aid = str(stack.wait_phase("task", timeout=900)["attempt_id"])
        bench = Bench(stack, aid)
        here, there = mp.Pipe()
        poller = mp.get_context("spawn").Process(target=poll, args=(bench.base, bench.admin, there), daemon=True)
        poller.start()
        windows: list[tuple[str, float, float, bool, str]] = []
        try:
            assert bench.victim_watches(), "the victim cannot watch before any attack"
            t0 = time.monotonic()
            time.sleep(args.window_s)  # the idle window: nothing but the poller
            windows.append(("idle", t0, time.monotonic(), True, ""))
            assert stack.server.proc is not None and stack.runner is not None
            server_pid, runner_pid = stack.server.proc.pid, stack.runner.proc.pid
            guests = qemu_pids(stack.name)  # what else takes the 2 cores here (on a lab host QEMU runs on KVM)
            for name, nice in [(a, n) for a in attacks if a != "seats" for n in nices]:
                stop = threading.Event()
                before = rss_kib(server_pid)
                attack = threading.Thread(target=niced, args=(nice, getattr(bench, name), stop), daemon=True)
                cpu0, server_cpu0, runner_cpu0 = time.process_time(), cpu_s(server_pid), cpu_s(runner_pid)
                qemu_cpu0, softirq0 = sum(cpu_s(p) for p in guests), softirq_s()
                t0 = time.monotonic()
                attack.start()
                time.sleep(args.window_s / 2)
                ok = bench.victim_watches()
                time.sleep(max(0.0, args.window_s - (time.monotonic() - t0)))
                note = (f"rss {before // 1024} -> {rss_kib(server_pid) // 1024} MiB; "
                        f"client cpu {time.process_time() - cpu0:.1f} s, "
                        f"server cpu {cpu_s(server_pid) - server_cpu0:.1f} s, "
                        f"runner {cpu_s(runner_pid) - runner_cpu0:.1f} s, "
                        f"qemu {sum(cpu_s(p) for p in guests) - qemu_cpu0:.1f} s, "
                        f"host softirq {softirq_s() - softirq0:.2f} s")
                end = time.monotonic()
                stop.set()
                attack.join(30)  # a sender blocked on a socket the server stopped reading ends with it
                windows.append((name if len(nices) == 1 else f"{name}@{nice}", t0, end, ok, note))
            if "seats" in attacks:
                windows.append(bench.seats())
        finally:
            here.send("stop")
            samples: list[tuple[float, float, float]] = here.recv() if here.poll(POLL_TIMEOUT_S + 30) else []
            poller.join(30)
            with contextlib.suppress(Exception):
                stack.api.test_runs.cancel(run)
        in_idle = [(s, t) for at, s, t in samples if windows[0][1] <= at < windows[0][2]]
        idle = [s for s, _ in in_idle]
        p99 = pct(idle, 0.99) if idle else float("nan")
        print(f"\nGET /v1/runners every {POLL_GAP_S * 1000:.0f} ms, from its request sent to its answer; idle p50 "
              f"{pct(idle, 0.5) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms (n={len(idle)}); its whole round trip, the "
              f"client's send() too, idle worst {max([t for _, t in in_idle], default=float('nan')) * 1000:.1f} ms")
        worst_of = {name: max([s for at, s, _ in samples if start <= at < end], default=float("nan"))
                    for name, start, end, _, _ in windows}
        base = next((w for n, w in worst_of.items() if n.split("@")[0] == "no_attack"), float("nan"))
        print(f"{'attack':<18} {'worst ms':>9} {'x idle p99':>10} {'x no_attack':>11} {'at s':>5} {'trip ms':>8} "
              f"{'n':>5}  victim  note")
        for name, start, end, ok, note in windows[1:]:
            during = [(s, at - start) for at, s, _ in samples if start <= at < end]
            worst, when = max(during) if during else (float("nan"), float("nan"))
            trip = max([t for at, _, t in samples if start <= at < end], default=float("nan"))
            print(f"{name:<18} {worst * 1000:9.1f} {worst / p99:10.2f} {worst / base:11.2f} {when:5.1f} "
                  f"{trip * 1000:8.1f} {len(during):5d}  {'works' if ok else 'REFUSED':<7} {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
