"""Agent kind `osworld` on the real linux-desktop through `gh-runner local`: the tests' own agent written to
OSWorld's interface (tests/osworld_agent/scripted_agent.py) fixes DSK-01 (examples/desktop-basics.yaml)
with OSWorld's computer_13 actions (TYPING the fix into the open terminal, PRESS enter, DONE), which go to
the machine as input events through the hypervisor; its steps and words are on the replay's input frames.

The pyautogui variant needs pyautogui in the guest: osworld-desktop installs it
(image-builder/imagebuilder/assets/osworld-desktop/pyautogui.txt), linux-desktop does not. It runs DSK-01
on osworld-desktop when that image is in the desktop images dir, and is skipped, saying so, when not."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .test_smoke import FIX, acted, dsk01, local_run

pytestmark = [pytest.mark.desktop, pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(3600)]

AGENT = Path(__file__).parents[1] / "osworld_agent" / "scripted_agent.py"


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="gh-desktop-osworld-", dir="/var/tmp"))
    d.chmod(0o755)  # libvirt-qemu reaches the state dir's overlays; the sandbox's uid reaches the agent
    (d / "agent").mkdir(mode=0o755)
    shutil.copyfile(AGENT, d / "agent" / AGENT.name)
    (d / "agent" / AGENT.name).chmod(0o644)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def osworld_agent(work: Path, space: str, plan: list[list[Any]], observation: str = "screenshot",
                  record: Path | None = None) -> dict[str, Any]:
    """The agents file of one osworld agent; with `record`, the agent writes each observation there."""
    if record is not None:
        record.touch()
        record.chmod(0o666)  # the command agents' sandbox uid appends to it
    extra = {"record": str(record)} if record is not None else {}
    return {"agents": {f"ow-{space}": {
        "kind": "osworld", "agent": "scripted_agent:make", "python_path": [str(work / "agent")],
        "observation": observation, "action_space": space, "max_steps": 5,
        "env": {"GH_TEST_OSWORLD_PLAN": json.dumps({"actions": plan, **extra})}}}}


def test_an_osworld_agent_fixes_a_desktop_case_with_computer_13_actions(work: Path,
                                                                       desktop_images_dir: Path) -> None:
    """With OSWorld's screenshot_a11y_tree observation: each look has the screen and the session's tree as
    the machine's /accessibility serves it, the open terminal's window in it."""
    plan = [[{"action_type": "TYPING", "parameters": {"text": FIX}},
             {"action_type": "PRESS", "parameters": {"key": "enter"}}], [{"action_type": "DONE"}]]
    record = work / "observations.jsonl"
    run = local_run(work, desktop_images_dir, work / "state", "ow-computer_13", dsk01(terminal_open=True),
                    osworld_agent(work, "computer_13", plan, "screenshot_a11y_tree", record))
    assert run.attempt is not None, (run.proc.returncode, run.proc.stdout[-3000:], run.proc.stderr[-3000:])
    events = acted(run.frames)
    assert run.attempt["outcome"] == "passed", (run.attempt.get("error"), run.attempt.get("check"), events)
    assert events and all(e["type"] in ("type", "key") for e in events), events  # input events, no exec
    assert {e["note"]["step"] for e in events} == {1} and all(e["note"]["text"] == "step 1" for e in events)
    assert any(e["type"] == "type" and e["text"] == FIX for e in events), events
    looks = [json.loads(line) for line in record.read_text().splitlines()]
    assert looks and all(o["png"] for o in looks), looks
    tree = looks[0]["accessibility_tree"]
    assert isinstance(tree, str) and tree.startswith("<desktop-frame") and "Terminal" in tree, tree and tree[:2000]


def test_an_osworld_agent_fixes_a_desktop_case_with_pyautogui_code(work: Path, desktop_images_dir: Path) -> None:
    if not (desktop_images_dir / "osworld-desktop" / "image.yaml").is_file():
        pytest.skip(f"no osworld-desktop image in {desktop_images_dir} (the desktop image with pyautogui: "
                    "image-builder/build osworld-desktop)")
    code = f"pyautogui.write({FIX!r}); pyautogui.press('enter')"
    cases = dsk01(terminal_open=True)
    cases["cases"][0]["start_state"] = "osworld-desktop"
    run = local_run(work, desktop_images_dir, work / "state", "ow-pyautogui", cases,
                    osworld_agent(work, "pyautogui", [[code], ["DONE"]]))
    assert run.attempt is not None, (run.proc.returncode, run.proc.stdout[-3000:], run.proc.stderr[-3000:])
    assert run.attempt["outcome"] == "passed", (run.attempt.get("error"), run.attempt.get("check"), run.frames)
    execs = acted(run.frames)
    assert len(execs) == 1 and execs[0]["note"]["action"] == code, execs
