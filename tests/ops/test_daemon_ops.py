"""The real `gh-runner` daemon as a subprocess, as systemd would run it: NOTIFY_SOCKET pointed at a
datagram socket of this test, WATCHDOG_USEC set, metrics on a loopback port. The test sees READY=1
after the welcome, STATUS= lines that follow the slots, WATCHDOG=1 pings, STOPPING=1 on SIGTERM,
and scrapes the metrics endpoint while an attempt runs and after it finished.

The machine provider is the runner tests' double (GH_RUNNER_TEST_PROVIDER), the control plane the
runner tests' websocket peer: this test is about the daemon's systemd and Prometheus faces.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
from kit.net import free_port
from prometheus_client.parser import text_string_to_metric_families
from runner.peer import Peer, make_lease

from gh_wire.protocol import TaskEnd

REPO = Path(__file__).resolve().parents[2]
WAIT = 60.0  # generous: a loaded, shared machine


class NotifySocket:
    """The service manager's end: collects every datagram the daemon sends."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="gh-notify-")
        self.path = str(Path(self.dir) / "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setblocking(False)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._event = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._collect())

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await loop.sock_recv(self.sock, 65536)
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append((time.monotonic(), fields))
            self._event.set()

    async def wait_for(self, pred: Callable[[dict[str, str]], bool], timeout: float = WAIT,
                       start: int = 0) -> int:
        """Index of the first message from `start` on that matches."""
        deadline = time.monotonic() + timeout
        i = start
        while True:
            while i < len(self.messages):
                if pred(self.messages[i][1]):
                    return i
                i += 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching notify message; got {[m for _, m in self.messages][-10:]}")
            self._event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout=min(left, 0.5))

    def close(self) -> None:
        self._task.cancel()
        self.sock.close()
        os.unlink(self.path)
        os.rmdir(self.dir)


async def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.get(f"http://127.0.0.1:{port}/metrics")
    r.raise_for_status()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


@pytest.fixture
async def notify() -> AsyncIterator[NotifySocket]:
    n = NotifySocket()
    try:
        yield n
    finally:
        n.close()


@pytest.mark.slow
async def test_daemon_speaks_sd_notify_and_serves_metrics(peer: Peer, notify: NotifySocket) -> None:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="gh-ops-daemon-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GH_RUNNER_")}
        env.pop("CREDENTIALS_DIRECTORY", None)
        env.update({
            "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}",
            "GH_RUNNER_TEST_PROVIDER": "runner.doubles:make_provider",
            "GH_TEST_PROVIDER_STATE": str(Path(tmp) / "provider.json"),
            "GH_TEST_PROVIDER_DELAY": "0.2",
            "GH_RUNNER_TOKEN": Peer.token,
            "HOME": tmp,
            "NOTIFY_SOCKET": notify.path,
            "WATCHDOG_USEC": "2000000",  # a ping at least every second
        })
        p = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gh_local.cli", "--server", peer.url, "--name", "ops-runner", "--slots", "2",
            "--state-dir", f"{tmp}/state", "--images-dir", f"{tmp}/img", "--log-format", "json",
            "--metrics-listen", f"127.0.0.1:{port}", "--drain-grace", "60",
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            ready = await notify.wait_for(lambda m: m.get("READY") == "1")
            status = notify.messages[ready][1]["STATUS"]
            assert "connected to 127.0.0.1" in status and "as ops-runner (rn_test)" in status
            assert status.endswith("busy 0/2"), status
            assert peer.of_type("hello"), "READY=1 must come after the session is up"
            # The watchdog is fed from the main loop: pings keep coming, about every second.
            first = await notify.wait_for(lambda m: m.get("WATCHDOG") == "1", start=ready)
            second = await notify.wait_for(lambda m: m.get("WATCHDOG") == "1", start=first + 1)
            third = await notify.wait_for(lambda m: m.get("WATCHDOG") == "1", start=second + 1)
            gap = notify.messages[third][0] - notify.messages[second][0]
            assert 0.5 < gap < 10, gap

            s = await scrape(port)
            assert s[("gh_runner_connected", ())] == 1
            assert s[("gh_runner_slots", ())] == 2 and s[("gh_runner_slots_busy", ())] == 0

            await peer.send(make_lease("at_ops1", limits={"minutes": 5}))
            await peer.wait_type("lease_accept")
            busy = await notify.wait_for(lambda m: m.get("STATUS", "").endswith("busy 1/2"), start=ready)
            await peer.wait_type("attempt_status", where=lambda m: m.phase == "task", timeout=WAIT)
            s = await scrape(port)
            assert s[("gh_runner_slots_busy", ())] == 1 and s[("gh_runner_machines_running", ())] == 1
            await peer.send(TaskEnd(attempt_id="at_ops1", answer="fixed"))
            await notify.wait_for(lambda m: m.get("STATUS", "").endswith("busy 0/2"), start=busy + 1)
            await peer.wait_until(lambda: "at_ops1" in peer.applied)
            deadline = time.monotonic() + WAIT
            while (s := await scrape(port)).get(("gh_runner_attempts_total", (("outcome", "passed"),))) != 1:
                assert time.monotonic() < deadline, s
                await asyncio.sleep(0.2)  # polling an HTTP endpoint: there is no event to wait on
            assert s[("gh_runner_attempts_total", (("outcome", "error"),))] == 0
            assert any(k[0] == "gh_runner_phase_duration_seconds_count" for k in s)
            assert s[("gh_runner_main_loop_last_tick_timestamp_seconds", ())] > 0

            n = len(notify.messages)
            p.send_signal(signal.SIGTERM)
            stop = await notify.wait_for(lambda m: m.get("STOPPING") == "1", start=n)
            assert "draining" in notify.messages[stop][1]["STATUS"]
            _out, err = await asyncio.wait_for(p.communicate(), WAIT)
            assert p.returncode == 0, err.decode()[-2000:]
            assert Peer.token not in err.decode()
            with pytest.raises(httpx.ConnectError):  # the listener went away with the daemon
                await scrape(port)
        finally:
            if p.returncode is None:
                p.kill()
                await p.wait()


async def test_metrics_port_in_use_is_a_clear_error(peer: Peer) -> None:
    with socket.socket() as taken, tempfile.TemporaryDirectory(prefix="gh-ops-daemon-") as tmp:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("GH_RUNNER_")}
        env.update({"PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}",
                    "GH_RUNNER_TEST_PROVIDER": "runner.doubles:make_provider", "GH_RUNNER_TOKEN": Peer.token,
                    "HOME": tmp})
        p = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gh_local.cli", "--server", peer.url, "--state-dir", f"{tmp}/state",
            "--images-dir", f"{tmp}/img", "--metrics-listen", f"127.0.0.1:{port}", "--log-format", "console",
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            _out, err = await asyncio.wait_for(p.communicate(), WAIT)
        finally:
            if p.returncode is None:
                p.kill()
                await p.wait()
        assert p.returncode == 2
        assert f"cannot listen for metrics on 127.0.0.1:{port}" in err.decode()
        assert not peer.of_type("hello"), "the runner must not connect when it cannot serve what was asked"
