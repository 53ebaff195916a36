"""Agent kind `osworld` on the real linux-desktop through `gh-runner local`: the tests' own agent written to
OSWorld's interface (tests/osworld_agent/scripted_agent.py) fixes DSK-01 (examples/desktop-basics.yaml)
with OSWorld's computer_13 actions (TYPING the fix into the open terminal, PRESS enter, DONE), which go to
the machine as input events through the hypervisor; its steps and words are on the replay's input frames.

The pyautogui variants act with OSWorld's pyautogui code, run in the guest as the signed-in user
(linux-desktop installs pyautogui: image-builder/imagebuilder/pyautogui.py), after reading the session's
accessibility tree: once through `gh-runner local`, once through a real gh-server and gh-runner (the tests'
Stack), whose run's exports are read back as a user would (ATIF checked against Harbor's recorded schema,
OSWorld's result layout as show_result.py reads it)."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from export.atif_check import atif_errors
from startstates.conftest import Stack

from gh_server.settings import AgentConfig

from .conftest import DESKTOP_TEST_TIMEOUT_S
from .test_smoke import FIX, acted, dsk01, local_run

pytestmark = [pytest.mark.desktop, pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(DESKTOP_TEST_TIMEOUT_S)]

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
    plan: list[list[Any]] = [[{"action_type": "TYPING", "parameters": {"text": FIX}},
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


PYAUTOGUI_CODE = f"pyautogui.write({FIX!r}); pyautogui.press('enter')"


def assert_looked_at_the_terminal(record: Path) -> None:
    looks = [json.loads(line) for line in record.read_text().splitlines()]
    assert looks and all(o["png"] for o in looks), looks
    tree = looks[0]["accessibility_tree"]
    assert isinstance(tree, str) and tree.startswith("<desktop-frame") and "Terminal" in tree, tree and tree[:2000]


def test_an_osworld_agent_fixes_a_desktop_case_with_pyautogui_code(work: Path, desktop_images_dir: Path) -> None:
    record = work / "observations-pyautogui.jsonl"
    run = local_run(work, desktop_images_dir, work / "state", "ow-pyautogui", dsk01(terminal_open=True),
                    osworld_agent(work, "pyautogui", [[PYAUTOGUI_CODE], ["DONE"]], "screenshot_a11y_tree", record))
    assert run.attempt is not None, (run.proc.returncode, run.proc.stdout[-3000:], run.proc.stderr[-3000:])
    assert run.attempt["outcome"] == "passed", (run.attempt.get("error"), run.attempt.get("check"), run.frames)
    execs = acted(run.frames)
    assert len(execs) == 1 and execs[0]["note"]["action"] == PYAUTOGUI_CODE, execs
    assert_looked_at_the_terminal(record)


def test_an_osworld_agent_passes_a_desktop_case_through_gh_server_and_its_run_exports(
        work: Path, desktop_images_dir: Path) -> None:
    """Issue 50's done-when through the server: the agent configured in gh-server's settings, the case made and
    run through the SDK, the run's exports fetched from `GET /v1/test_runs/{id}/export`."""
    record = work / "observations-server.jsonl"
    [(agent_id, agent)] = osworld_agent(work, "pyautogui", [[PYAUTOGUI_CODE], ["DONE"]], "screenshot_a11y_tree",
                                        record)["agents"].items()
    stack = Stack(desktop_images_dir, image="linux-desktop", agents={agent_id: AgentConfig(id=agent_id, **agent)})
    stack.start()
    try:
        gh = stack.sdk()
        c = dsk01(terminal_open=True)["cases"][0]
        case = gh.test_cases.create(c["name"], c["prompt"], c["start_state"], c["success"], key=c["key"],
                                    setup_script=c["setup_script"], limits=c["limits"], category=c["category"])
        rid = str(gh.test_runs.create(test_case_ids=[case["test_case_id"]], agents=[agent_id])["test_run_id"])
        gh.test_runs.wait(rid, timeout=DESKTOP_TEST_TIMEOUT_S - 600, poll_interval=2)
        [attempt] = gh.test_runs.list_all_attempts(rid)
        assert attempt["outcome"] == "passed", attempt
        assert_looked_at_the_terminal(record)
        aid = str(attempt["attempt_id"])

        atif = export(stack, rid, "atif")
        root = f"{rid}-atif/{aid}/"
        trajectory = json.loads(atif[root + "trajectory.json"])
        assert atif_errors(trajectory, {k.removeprefix(root): v for k, v in atif.items() if k.startswith(root)}) == []
        assert any(PYAUTOGUI_CODE in json.dumps(step) for step in trajectory["steps"]), trajectory["steps"]
        assert trajectory["extra"]["gh"]["assisted"] is False

        layout = export(stack, rid, "osworld")
        [result] = [k for k in layout if k.endswith("/result.txt")]
        # {action_space}/{observation_type}/{model}/{domain}/{task_id}/, as show_result.py walks it
        assert result.split("/")[3:6] == [agent_id, c["category"], c["key"]], result
        assert float(layout[result]) == 1.0
        steps = [json.loads(line) for line in layout[result.replace("result.txt", "traj.jsonl")].splitlines()]
        assert steps and all(f"{result.rsplit('/', 1)[0]}/{s['screenshot_file']}" in layout for s in steps), steps
    finally:
        stack.stop()


def export(stack: Stack, rid: str, fmt: str) -> dict[str, bytes]:
    r = httpx.get(f"{stack.base_url}/v1/test_runs/{rid}/export", params={"format": fmt}, timeout=300,
                  headers={"Authorization": f"Bearer {stack.admin_key}"})
    assert r.status_code == 200, r.text
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r:gz") as tar:
        return {m.name: f.read() for m in tar.getmembers() if m.isfile() and (f := tar.extractfile(m)) is not None}
