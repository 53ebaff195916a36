"""A libvirtd restart pauses the runner; it does not spend every try.

Real gh-server, real gh-runner (2 slots), the real linux-tiny guest and the host's real libvirtd,
killed while two attempts are in their task and started again 4 s later the way
scripts/libvirt-up.sh starts it (always, even when the test fails: other suites share this host).
Once, every retry was leased again at once to the same runner, failed in milliseconds
on the missing hypervisor, and the run completed with tries that had no verdict. Now the runner
refuses leases while libvirt does not answer (`hypervisor_down`, said in its log and the runners
list: `paused: hypervisor_down`, polled from the API through the restart, and back to null once
libvirt answers), the server spaces the retries, and every try ends scored.

Runs the restart once: it disturbs every VM on the host for a few seconds.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kit.scratch import scratch_dir

from .faults import Stack, libvirt_up, log_events, marker_case, restart_libvirtd

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(1800)]

# The outage falls inside the task: its fix runs through gh-execd, which needs no libvirt, so only the
# runner's own probe (every 10 s while up, gh_runner/hypervisor.py) can find libvirtd gone: it stays
# down longer than that, and the fix outlasts it.
CASE = marker_case("HV-01", fix="sleep 20; touch /root/fixed")


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
    with scratch_dir("gh-hvrestart-") as w:
        yield w


def test_a_libvirtd_restart_pauses_the_runner_and_every_try_is_scored(images_dir: Path, work: Path) -> None:
    with Stack(work, "hvr", images_dir, slots=2, server_settings={"runner_grace_seconds": 120}) as stack:
        try:
            run = stack.run([CASE], repeat=2, name="libvirtd restart")
            stack.wait_phase("task", timeout=900)
            with PausedWatch(stack.server.base_url, stack.server.api_key, stack.name) as watch:
                restart_libvirtd(12.0)
                done, attempts = stack.finish(run, timeout=1200)
            events = log_events(stack.runner_log)
        finally:
            libvirt_up()  # whatever happened above, libvirtd runs again (before the stack stops)

    assert stack.left == [], f"machines left behind: {stack.left}"
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
