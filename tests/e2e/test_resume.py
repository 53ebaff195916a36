"""A runner SIGKILLed mid-task comes back and the same attempt goes on from its save point (issue 51,
part 3): not retried, no new attempt, the same try. And a runner that does not come back: the attempt
goes on on another runner, whose only way to the lost runner's disk is the registry.

Real gh-server, real gh-runner, the real linux-tiny guest. A command agent takes ten steps, asks for a
save point, takes five more; the runner is then killed with SIGKILL and started again on the same state
dir. Its hello lists the save point among its start-state versions, and the server gives it the attempt
back from there: the guest holds the ten steps and not the five after, the agent's first action on the
restored machine is refused `machine_restored` (it looks again), and it fixes the case, which passes.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kit.libvirt import domains
from kit.scratch import scratch_dir
from registry.server import RegistryProcess

from .faults import Stack, leftovers, marker_case
from .procs import BIN
from .resume_kit import command_agent, other_runner, past_the_save_point, pushed, until

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(1500)]

CASE = marker_case("RESUME-01", minutes=10)
AGENT = Path(__file__).parent / "agents" / "resumer.py"


@pytest.fixture
def work() -> Iterator[Path]:
    with scratch_dir("gh-resume-") as w:
        yield w


def resumer_agent(work: Path) -> tuple[Path, dict[str, Any]]:
    return command_agent(work, AGENT, "resumer", 1200)


def test_a_runner_killed_at_step_15_comes_back_and_the_attempt_resumes_at_step_10(
        images_dir: Path, work: Path) -> None:
    shared, resumer = resumer_agent(work)
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
    # The first action after the loss is refused machine_restored, nothing before it (a wait while the
    # machine is away is the server's, unseen).
    assert a["answer"] == "409 machine_restored; the guest holds 10 steps", a["answer"]
    assert save_point_id in [p["save_point_id"] for p in a["save_points"]], a["save_points"]
    assert "the attempt goes on from a save point" in runner_log


def moved_to(stack: Stack, attempt_id: str, runner_id: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {stack.server.api_key}"}
    while True:
        got = httpx.get(f"{stack.server.base_url}/v1/attempts/{attempt_id}", headers=headers, timeout=30).json()
        if got.get("runner_id") == runner_id:
            return
        assert got.get("status") == "running", got
        assert time.monotonic() < deadline, f"the attempt did not move within {timeout:.0f} s: {got}"
        time.sleep(0.5)


@contextlib.contextmanager
def at_step_15(work: Path, images_dir: Path, name: str, grace_s: float
               ) -> Iterator[tuple[Stack, RegistryProcess, Path, str, str]]:
    """A registry, gh-server and a first runner pushing there, and the resumer's try on that runner once the
    agent took its 15th step (its save point at step 10 made): the stack, registry, config, run, attempt."""
    with past_the_save_point(work, images_dir, name, grace_s=grace_s, case=CASE, agent=AGENT,
                             told="at-step-15") as got:
        yield got


def test_a_runner_that_never_comes_back_has_its_attempt_go_on_elsewhere_from_the_registry(
        images_dir: Path, work: Path) -> None:
    with at_step_15(work, images_dir, "resume", grace_s=10) as (stack, registry, config, run, attempt_id):
        shared = work / "agent"
        ref = pushed(stack, attempt_id, timeout=300)
        assert ref.startswith(f"{registry.host}/resume/states@sha256:"), ref
        with other_runner(stack, images_dir, config, "resumeb") as other:
            assert stack.runner is not None
            stack.runner.kill()  # and it never comes back
            (shared / "killed").touch()
            done, attempts = stack.finish(run, timeout=900)
            lost_left = domains(f"gh-{stack.name}-")  # the lost runner's machines: its host is gone with it

    assert done["status"] == "completed", done
    assert len(attempts) == 1, [(x["outcome"], x["error"]) for x in attempts]  # the same attempt, not retried
    a = attempts[0]
    assert (a["outcome"], a["try"], a["runner_id"], a["metrics"]["resumed"]) == ("passed", 1, other.runner_id, 1), a
    # The first action after the loss is refused machine_restored, nothing before it (a wait while the
    # machine is away is the server's, unseen).
    assert a["answer"] == "409 machine_restored; the guest holds 10 steps", a["answer"]
    assert "the attempt goes on from a save point" in other.log and "start state pulled" in other.log
    assert other.left == [], other.left
    # The lost runner's machines (its attempt's, its hot pool's) stayed with its host; the stack destroyed them.
    assert f"gh-{stack.name}-{a['attempt_id']}" in lost_left and stack.left == lost_left, (lost_left, stack.left)


def test_drain_migrate_hands_the_running_try_to_another_runner(images_dir: Path, work: Path) -> None:
    """`gh-runner drain --migrate`: the runner saves its running try now, pushes the save point, and the try
    goes on on another runner from there, the same attempt; the draining runner exits 0 with nothing left."""
    with at_step_15(work, images_dir, "migrate", grace_s=120) as (stack, _, config, run, attempt_id):
        shared = work / "agent"
        with other_runner(stack, images_dir, config, "migrateb") as other:
            drained = subprocess.run([str(BIN / "gh-runner"), "drain", "--migrate", "--state-dir", str(stack.state)],
                                     capture_output=True, text=True, timeout=60)
            assert drained.returncode == 0 and "draining" in drained.stdout, drained
            moved_to(stack, attempt_id, other.runner_id, timeout=600)
            (shared / "killed").touch()  # the agent acts again only once the try is on the other runner
            assert stack.runner is not None
            assert stack.runner.proc.wait(timeout=600) == 0  # drained: its copy was cancelled, nothing to wait for
            done, attempts = stack.finish(run, timeout=900)

    assert done["status"] == "completed", done
    assert len(attempts) == 1, [(x["outcome"], x["error"]) for x in attempts]  # the same attempt, not retried
    a = attempts[0]
    assert (a["outcome"], a["runner_id"], a["metrics"]["resumed"]) == ("passed", other.runner_id, 1), a
    # Saved as the drain began, after the agent's 15th step: it goes on from there, not from step 10.
    # The first action after the loss is refused machine_restored, nothing before it (a wait while the
    # machine is away is the server's, unseen).
    assert a["answer"] == "409 machine_restored; the guest holds 15 steps", a["answer"]
    assert "the attempt goes on from a save point" in other.log
    assert stack.left == [] and leftovers(stack.name, stack.state) == [], stack.left
    assert not list((stack.state / "states").glob(f"ss_{attempt_id[3:]}p*")), "the drained runner kept its save points"
    assert other.left == [], other.left
