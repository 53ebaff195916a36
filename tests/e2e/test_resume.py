"""A runner SIGKILLed mid-task comes back and the same attempt goes on from its save point (issue 51,
part 3): not retried, no new attempt, the same try.

Real gh-server, real gh-runner, the real linux-tiny guest. A command agent takes ten steps, asks for a
save point, takes five more; the runner is then killed with SIGKILL and started again on the same state
dir. Its hello lists the save point among its start-state versions, and the server gives it the attempt
back from there: the guest holds the ten steps and not the five after, the agent's first action on the
restored machine is refused `machine_restored` (it looks again), and it fixes the case, which passes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentfiles import agent_command
from kit.scratch import scratch_dir

from .faults import Stack, leftovers, marker_case

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(1500)]

CASE = marker_case("RESUME-01", minutes=10)
AGENT = Path(__file__).parent / "agents" / "resumer.py"


@pytest.fixture
def work() -> Iterator[Path]:
    with scratch_dir("gh-resume-") as w:
        yield w


def until(path: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout:.0f} s")
        time.sleep(0.5)
    return path.read_text()


def test_a_runner_killed_at_step_15_comes_back_and_the_attempt_resumes_at_step_10(
        images_dir: Path, work: Path) -> None:
    shared = work / "agent"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # the agent runs with a uid of its own
    resumer = {"id": "resumer", "kind": "command", "timeout": 1200, "command": agent_command(AGENT, str(shared))}
    with Stack(work, "resume", images_dir, slots=1,
               server_settings={"runner_grace_seconds": 120, "agents": {"resumer": resumer}}) as stack:
        run = stack.run([CASE], repeat=1, name="resume", agents=("resumer",))
        save_point_id = until(shared / "at-step-15", timeout=900)
        assert stack.runner is not None
        stack.runner.kill()
        (shared / "killed").touch()
        stack.start_runner()
        done, attempts = stack.finish(run, timeout=900)
        runner_log = stack.runner_log.read_text(errors="replace")

    assert stack.left == [], f"machines left behind: {stack.left}"
    assert leftovers(stack.name, stack.state) == [], "the restarted runner left files behind"
    assert done["status"] == "completed", done
    assert len(attempts) == 1, [(x["outcome"], x["error"], x["metrics"]) for x in attempts]  # not retried
    a = attempts[0]
    assert (a["outcome"], a["try"], a["metrics"]["resumed"]) == ("passed", 1, 1), a
    assert a["answer"].endswith("409 machine_restored; the guest holds 10 steps"), a["answer"]
    assert save_point_id in [p["save_point_id"] for p in a["save_points"]], a["save_points"]
    assert "the attempt goes on from a save point" in runner_log
