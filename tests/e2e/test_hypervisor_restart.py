"""Issue 27, defect 2: a libvirtd restart pauses the runner; it does not spend every try.

Real gh-server, real gh-runner (2 slots), the real linux-tiny guest and the host's real libvirtd,
killed while two attempts are in their task and started again 4 s later the way
scripts/libvirt-up.sh starts it (always, even when the test fails: other suites share this host).
Before issue 27 every retry was leased again at once to the same runner, failed in milliseconds
on the missing hypervisor, and the run completed with tries that had no verdict. Now the runner
refuses leases while libvirt does not answer (`hypervisor_down`, said in its log and the runners
list: `paused: hypervisor_down`, polled from the API through the restart, and back to null once
libvirt answers), the server spaces the retries, and every try ends scored.

Runs the restart once: it disturbs every VM on the host for a few seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from guidinghand import Eager

from .procs import RestartableServer, Runner, domains, wait_for_log

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
CASE: dict[str, Any] = {
    "key": "HV-01", "name": "Marker file", "prompt": "Please create /root/fixed.",
    "start_state": "linux-tiny", "setup_script": "rm -f /root/fixed",
    "success": {"check_script": "[ -f /root/fixed ] && echo True || echo False"},
    "metadata": {"reference_fix": "sleep 8; touch /root/fixed", "reference_answer": "done"},
    "limits": {"minutes": 2},
}


def libvirt_up() -> None:
    subprocess.run([str(REPO / "scripts" / "libvirt-up.sh")], check=True, capture_output=True, timeout=120)


def restart_libvirtd(down_for: float) -> None:
    try:
        out = subprocess.run(["pgrep", "-x", "libvirtd"], capture_output=True, text=True, timeout=10)
        for pid in out.stdout.split():
            os.kill(int(pid), signal.SIGTERM)
        time.sleep(down_for)
    finally:
        libvirt_up()


def log_events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_bytes().splitlines():
        with contextlib.suppress(ValueError):
            e = json.loads(line)
            if isinstance(e, dict):
                out.append(e)
    return out


class PausedWatch:
    """Polls the runners list (`GET /v1/runners`) in a thread and keeps every change of the runner's
    `(status, paused)`, so that a pause of a few seconds is seen whatever the run does meanwhile."""

    def __init__(self, base_url: str, api_key: str, name: str) -> None:
        self.url, self.headers, self.name = f"{base_url}/v1/runners", {"Authorization": f"Bearer {api_key}"}, name
        self.seen: list[tuple[str, str | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="paused-watch", daemon=True)

    def __enter__(self) -> PausedWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _poll(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                r = httpx.get(self.url, params={"q": self.name}, headers=self.headers, timeout=5)
                row = next(x for x in r.json()["data"] if x["name"] == self.name)
                now = (str(row["status"]), row.get("paused"))
                if not self.seen or self.seen[-1] != now:
                    self.seen.append(now)
            self._stop.wait(0.2)


@pytest.fixture
def work() -> Iterator[Path]:
    w = Path(tempfile.mkdtemp(prefix="gh-hvrestart-", dir="/var/tmp"))
    w.chmod(0o755)
    try:
        yield w
    finally:
        shutil.rmtree(w, ignore_errors=True)


def test_a_libvirtd_restart_pauses_the_runner_and_every_try_is_scored(images_dir: Path, work: Path) -> None:
    config = work / "server.yaml"
    config.write_text(yaml.safe_dump({"runner_grace_seconds": 120}))
    server = RestartableServer(work / "server", config, work / "gh-server.log")
    name = "hvr" + secrets.token_hex(3)
    state = work / "runner-state"
    state.mkdir(mode=0o755)
    runner: Runner | None = None
    client: Eager | None = None
    try:
        server.start()
        client = Eager(api_key=server.api_key, base_url=server.base_url, timeout=60)
        token = client.runners.create(name)["token"]
        runner = Runner(server.base_url, token, name, images_dir, state, slots=2)
        log = Path(runner.log.name)
        case = client.test_cases.batch([CASE])["data"][0]  # type: ignore[list-item]
        run = client.test_runs.create(test_case_ids=[case["test_case_id"]], agents=["reference"], repeat=2,
                                      name="libvirtd restart")
        wait_for_log(log, lambda e: e.get("event") == "phase" and e.get("phase") == "task", timeout=900)
        with PausedWatch(server.base_url, server.api_key, name) as watch:
            restart_libvirtd(4.0)
            done = dict(client.test_runs.wait(run["test_run_id"], timeout=1200, poll_interval=2))
        attempts = [dict(a) for a in client.test_runs.list_all_attempts(run["test_run_id"])]
        events = log_events(log)
    finally:
        libvirt_up()  # whatever happened above, libvirtd runs again
        if runner is not None:
            runner.stop(timeout=180)
        if client is not None:
            client.close()
        server.stop()
        left = domains(f"gh-{name}-")
        for d in left:
            subprocess.run(["virsh", "-c", "qemu:///system", "destroy", d], capture_output=True, timeout=60)

    assert left == [], f"machines left behind: {left}"
    assert done["status"] == "completed", done
    last = [a for a in attempts if a.get("is_last", True)]
    assert len(last) == 2
    assert all(a["outcome"] in ("passed", "failed") for a in last), \
        f"a try ended without a verdict: {[(a['outcome'], a.get('error')) for a in attempts]}"
    assert not any(a["outcome"] == "failed" for a in attempts), attempts  # `reference` fixes it when it runs
    # The runner said it paused, and that it resumed.
    said = [str(e.get("event", "")) for e in events]
    assert any(s.startswith("hypervisor unreachable") for s in said), "the runner never said it paused"
    assert any(s.startswith("hypervisor answers again") for s in said), "the runner never said it resumed"
    # The runners list said so while libvirt was gone, and went back once it answered.
    assert ("online", "hypervisor_down") in watch.seen, f"the runners list never showed the pause: {watch.seen}"
    after = watch.seen[watch.seen.index(("online", "hypervisor_down")) + 1:]
    assert ("online", None) in after, f"the runners list never showed the runner resumed: {watch.seen}"
