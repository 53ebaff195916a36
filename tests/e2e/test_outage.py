"""An attempt that enters its task while the control plane is gone is never
scored against its agent.

Real gh-server, real gh-runner, the real linux-tiny guest. The server is SIGKILLed at the moment
the attempt starts its first screen (the step just before the task: the runner's `running` status
then goes out to nobody) and started again on the same port and data dir a few seconds later. The
runner reconnects; its hello says the attempt is in its task. Then either the agent gets its turn
late (with the time lost on the attempt) or the attempt is our `error` and is retried: never a
`failed` "time_limit" because no agent ever came.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.scratch import scratch_dir

from .faults import Stack, marker_case

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(1200)]

CASE = marker_case("OUTAGE-01")


@pytest.fixture
def work() -> Iterator[Path]:
    with scratch_dir("gh-outage-") as w:
        yield w


def test_a_task_begun_while_the_server_is_down_is_never_scored_against_the_agent(
        images_dir: Path, work: Path) -> None:
    with Stack(work, "outage", images_dir, slots=1, server_settings={"runner_grace_seconds": 120}) as stack:
        run = stack.run([CASE], repeat=1, name="outage")

        # The cut: at the step just before the task, so the `running` status finds no server.
        first = stack.wait_phase("first_screen", timeout=600)
        stack.server.kill()
        stack.wait_phase("task", attempt_id=first["attempt_id"], timeout=120)
        time.sleep(3)  # the server stays down a few seconds into the task
        stack.server.start()

        done, attempts = stack.finish(run, timeout=900)

    assert stack.left == [], f"machines left behind: {stack.left}"
    assert done["status"] == "completed", done
    hit = next(a for a in attempts if a["attempt_id"] == first["attempt_id"])
    assert hit["outcome"] != "failed", f"scored against the agent: {hit}"
    if hit["outcome"] == "passed":  # the agent got its turn late, and the attempt says how late
        lost = (hit.get("metrics") or {}).get("task_seconds_lost")
        assert lost is not None and lost > 0, hit
    else:  # ours: an error, retried, and the retry got its verdict
        assert hit["outcome"] == "error", hit
        retry = [a for a in attempts if a.get("retry_of") == hit["attempt_id"]]
        assert retry and retry[0]["outcome"] == "passed", attempts
    last = [a for a in attempts if a.get("is_last", True)]
    assert [a["outcome"] for a in last] == ["passed"], attempts
