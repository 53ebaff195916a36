"""OpsObserver: daemon hooks in, sd_notify datagrams and metric values out (real socket, real registry)."""

from __future__ import annotations

import asyncio
import socket

from prometheus_client.parser import text_string_to_metric_families

from gh_runner.metrics import RunnerMetrics
from gh_runner.notify import Notifier
from gh_runner.observers import OpsObserver
from gh_wire.protocol import AttemptMetrics, AttemptResult, Welcome


def drain(sock: socket.socket) -> list[str]:
    out = []
    sock.settimeout(0.2)
    try:
        while True:
            out.append(sock.recv(4096).decode())
    except TimeoutError:
        return out
    finally:
        sock.settimeout(5)


def value(m: RunnerMetrics, name: str, **labels: str) -> float:
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    raise KeyError(name)


def make(path: str, watchdog_usec: str | None = None) -> tuple[OpsObserver, RunnerMetrics]:
    env = {"NOTIFY_SOCKET": path}
    if watchdog_usec:
        env["WATCHDOG_USEC"] = watchdog_usec
    m = RunnerMetrics(slots=2, name="r1")
    return OpsObserver(name="r1", server="wss://evals.example.com/v1/runners/connect", slots=2,
                       notifier=Notifier(env), metrics=m), m


def test_ready_once_then_status_lines(manager: tuple[socket.socket, str]) -> None:
    sock, path = manager
    obs, m = make(path)
    obs.welcome(Welcome(runner_id="rn_1"))
    assert sock.recv(4096) == b"READY=1\nSTATUS=connected to evals.example.com as r1 (rn_1); busy 0/2"
    obs.busy_changed(1, 2)
    assert sock.recv(4096) == b"STATUS=connected to evals.example.com as r1 (rn_1); busy 1/2"
    obs.journal_backlog(3)
    assert sock.recv(4096).endswith(b"busy 1/2; 3 result(s) awaiting ack")
    obs.disconnected("server closed the session: the runner token is revoked or unknown (close code 4001)")
    assert b"disconnected from evals.example.com" in sock.recv(4096)
    assert value(m, "gh_runner_connection_state", gh_runner_connection_state="revoked") == 1
    assert value(m, "gh_runner_connected") == 0
    obs.reconnect_scheduled(2, 4.0)
    assert b"reconnecting to evals.example.com in 4 s (2 failed)" in sock.recv(4096)
    obs.welcome(Welcome(runner_id="rn_1"))
    again = drain(sock)
    assert again and all("READY=1" not in d for d in again)  # READY only after the first welcome
    assert value(m, "gh_runner_reconnects_total") == 1
    assert value(m, "gh_runner_connected") == 1
    assert value(m, "gh_runner_slots_busy") == 1 and value(m, "gh_runner_machines_running") == 1
    assert value(m, "gh_runner_journal_backlog") == 3


def test_attempts_reaped_drain_and_stop(manager: tuple[socket.socket, str]) -> None:
    sock, path = manager
    obs, m = make(path)
    obs.attempt_finished(AttemptResult(attempt_id="at_1", outcome="failed",
                                       metrics=AttemptMetrics(phase_seconds={"setup": 1.5})))
    obs.reaped(["gh-r1-at_old1", "gh-r1-at_old2"])
    assert value(m, "gh_runner_attempts_total", outcome="failed") == 1
    assert value(m, "gh_runner_phase_duration_seconds_count", phase="setup") == 1
    assert value(m, "gh_runner_reaped_leftovers_total") == 2
    obs.draining(1)
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=draining: 1 attempt(s) in flight, no new leases"
    obs.stopped(0)
    assert sock.recv(4096) == b"STATUS=stopped (exit code 0)"


async def test_startup_pings_until_the_main_loop_ticks(manager: tuple[socket.socket, str]) -> None:
    sock, path = manager
    sock.setblocking(False)
    obs, _m = make(path, watchdog_usec="200000")  # ping every 0.1 s
    obs.start()
    loop = asyncio.get_running_loop()
    got: list[bytes] = []
    while sum(1 for g in got if g == b"WATCHDOG=1") < 3:
        got.append(await asyncio.wait_for(loop.sock_recv(sock, 4096), 10))
    assert got[0].startswith(b"STATUS=starting: r1, 2 slot(s), server evals.example.com")
    obs.tick()  # the daemon's loop has taken over: the start-up pinger must stop
    await asyncio.sleep(0)
    assert obs._startup_pinger is not None
    await asyncio.wait_for(asyncio.gather(obs._startup_pinger, return_exceptions=True), 5)
    assert obs._startup_pinger.done()
    obs.stopped(0)
