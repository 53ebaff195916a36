"""The resume of issue 51 on linux-desktop with a GUI application open, with the runner's host reachable
only through the registry for the second runner: tests/e2e/test_resume.py's lost runner, on the desktop
(tests/desktop/test_resume_desktop.py proves the desktop half in-process, without a server or a registry).

Real gh-server, two real gh-runners, Debian's docker-registry, the real linux-desktop guest. A command agent
(agents/desktop_resumer.py) opens Mousepad on a note, takes a few steps, asks for a save point and then
writes a file after it. The first runner pushes the save point to the registry and is SIGKILLed, never to
come back; a second runner, with its own state dir and the same registry, is given the same attempt and
makes its machine from the save point pulled from there. The same Mousepad process and its window are on the
restored desktop (restored with the memory, not started again), the file written after the save is not, the
agent's first action is refused `machine_restored` (it looks again), and it fixes the case, which passes.

About 2 minutes under TCG on 2 cores: the desktop's cold boot (about 65 s) is most of it; the save point
(555 MB with the memory) took 5 s, its push 4 s, its pull 2 s and the restore 2 s.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.faults import marker_case
from e2e.resume_kit import other_runner, past_the_save_point, pushed
from kit.libvirt import domains, virsh
from kit.scratch import scratch_dir

from .conftest import BOOT_TIMEOUT, DESKTOP_TEST_TIMEOUT_S, IMAGE

pytestmark = [pytest.mark.desktop, pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(DESKTOP_TEST_TIMEOUT_S)]

AGENT = Path(__file__).parent / "agents" / "desktop_resumer.py"
# The task's clock runs from the agent's start through the save (minutes under TCG), the push, the grace,
# the pull and the restore (the server waits up to 600 s for it): room for all of them on a loaded host.
CASE = marker_case("RESUME-DESKTOP-01", minutes=45, image=IMAGE, marker="/home/user/fixed")
AGENT_TIMEOUT_S = 45 * 60
# Both runners: a desktop's first boot to its session takes minutes under TCG (examples/desktop-runner.yaml).
# No warm snapshot (a fresh state dir would first boot, then save 2 GiB of memory, then restore: minutes more
# for nothing this test proves) and no hot pool (it would boot a second desktop beside the attempt's on the
# host's 2 cores): the save point under test is the only memory image made.
RUNNER_SETTINGS = {"warm_snapshots": False, "pool": "off",
                   "timeouts": {"machine": BOOT_TIMEOUT, "ready": BOOT_TIMEOUT}}
SAVED_S = BOOT_TIMEOUT + 900  # the boot, Mousepad's start, and a 2 GiB memory save under TCG
PUSH_S = 900  # the save point's disk and memory (about a GB) to a registry on loopback
FINISH_S = 1800  # the grace, the pull, the restore, the agent's last steps and the check


@pytest.fixture
def work() -> Iterator[Path]:
    with scratch_dir("gh-dresume-") as w:
        yield w


def test_a_desktop_with_mousepad_open_goes_on_on_another_runner_from_the_registry(
        desktop_images_dir: Path, work: Path) -> None:
    with past_the_save_point(work, desktop_images_dir, "dresume", grace_s=10, case=CASE, agent=AGENT, told="saved",
                             agent_timeout=AGENT_TIMEOUT_S, timeout=SAVED_S, runner_settings=RUNNER_SETTINGS
                             ) as (stack, registry, config, run, attempt_id):
        shared = work / "agent"
        saved = json.loads((shared / "saved").read_text())
        ref = pushed(stack, attempt_id, timeout=PUSH_S)
        assert ref.startswith(f"{registry.host}/dresume/states@sha256:"), ref
        with other_runner(stack, desktop_images_dir, config, "dresumeb") as other:
            assert stack.runner is not None
            stack.runner.kill()  # and it never comes back
            # Its host is gone with it: its desktop, left running, would only take the 2 cores' time from
            # the restore (TCG). Paused, it is still there for the stack to destroy (and for `lost_left`).
            lost = f"gh-{stack.name}-{attempt_id}"
            paused = virsh("suspend", lost, timeout=60)
            assert paused.returncode == 0, paused.stderr
            (shared / "killed").touch()
            done, attempts = stack.finish(run, timeout=FINISH_S)
            lost_left = domains(f"gh-{stack.name}-")

    assert done["status"] == "completed", done
    assert len(attempts) == 1, [(x["outcome"], x["error"]) for x in attempts]  # the same attempt, not retried
    a = attempts[0]
    assert (a["outcome"], a["try"], a["runner_id"], a["metrics"]["resumed"]) == ("passed", 1, other.runner_id, 1), a
    assert saved["save_point_id"] in [p["save_point_id"] for p in a["save_points"]], a["save_points"]
    # The agent's first action after the loss waited while the machine was away and was then refused
    # `machine_restored` (nothing else first); the same Mousepad process, its window shown, and nothing
    # written after the save.
    pid = saved["pid"]
    assert a["answer"] == f"409 machine_restored; mousepad {pid} before, {pid} now, window shown; after absent", \
        a["answer"]
    assert "the attempt goes on from a save point" in other.log and "start state pulled" in other.log
    assert other.left == [], other.left
    # The lost runner's machine stayed with its host; the stack destroyed it. Nothing else of it was made.
    assert lost_left == [lost] and stack.left == lost_left, (lost_left, stack.left)
