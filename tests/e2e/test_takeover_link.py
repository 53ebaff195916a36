"""The runner's link cut while a person holds an attempt's machine: the attempt is our error, as any
attempt whose runner's link is lost, and stays assisted (docs/server-api.md, "Takeovers").

Real gh-server and gh-runner processes, the real linux-tiny guest; the link is cut on loopback with
nftables (tests/e2e/faults.py `link_cut`) past the dead-peer bound of both sides. The agent is a command
that only waits (the system python3, as every test agent: tests/agentfiles.py), so the attempt is in its
task when the admin takes it over.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from agentfiles import AGENT_PYTHON
from kit.scratch import scratch_dir

from . import faults
from .faults import Stack, marker_case

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(1500)]

CASE = marker_case("TAKEOVER-LINK-01", minutes=5)
WAITER = {"id": "waiter", "kind": "command", "timeout": 900,
          "command": [AGENT_PYTHON, "-c", "import sys, time; sys.stdin.read(); time.sleep(120); print('waited')"]}


@pytest.fixture
def work() -> Iterator[Path]:
    with scratch_dir("gh-takeover-link-") as w:
        yield w


def logged(path: Path, text: str, timeout: float) -> None:
    """Until gh-server's log has `text` (its log is another process's)."""
    deadline = time.monotonic() + timeout
    while text not in path.read_text(errors="replace"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gh-server never logged {text!r} within {timeout:.0f} s")
        time.sleep(0.5)


def test_the_runners_link_cut_during_a_takeover_is_our_error_and_the_attempt_stays_assisted(
        images_dir: Path, work: Path) -> None:
    with Stack(work, "tolink", images_dir, slots=1,
               server_settings={"runner_grace_seconds": 30, "agents": {"waiter": WAITER}}) as stack:
        run = stack.run([CASE], repeat=1, name="takeover link", agents=("waiter",))
        hit = stack.wait_phase("task", timeout=900)["attempt_id"]
        headers = {"Authorization": f"Bearer {stack.server.api_key}"}
        took = httpx.post(f"{stack.server.base_url}/v1/attempts/{hit}/takeover", headers=headers, timeout=60)
        assert took.status_code == 200, took.text

        log = work / "gh-server.log"
        with faults.link_cut(stack.server.port):
            # The server gives the runner's socket up (its dead-peer bound), which ends the hold, then its
            # attempts once the runner is gone past its grace period (an error, retried: as without a hold).
            logged(log, f"takeover of {hit} ended: attempt_ended", timeout=300)
            logged(log, "attempts of runners gone past the grace period", timeout=300)

        done, attempts = stack.finish(run, timeout=1200)

    assert stack.left == [], f"machines left behind: {stack.left}"
    a = next(x for x in attempts if x["attempt_id"] == hit)
    assert a["outcome"] == "error" and a["error_cause"] != "case", a  # ours, never a verdict on the agent
    assert a["assisted"] is True, a
    assert [t["ended_by"] for t in a["takeovers"]] == ["attempt_ended"], a["takeovers"]
    retry = [x for x in attempts if x.get("retry_of") == hit]
    assert retry and retry[0]["assisted"] is False and retry[0]["takeovers"] == [], attempts
    assert done["status"] == "completed", done
