"""Agent kind `osworld` through `gh-runner local` on the real linux-tiny guest: gh-server starts OSWorld's
loop (gh_server/agents/osworld/) in the command agents' sandbox, the loop imports the test's own agent
(scripted_agent.py, OSWorld's reset/predict interface) from `python_path`, looks through the machine API,
runs its pyautogui step in the guest (noted in the replay with its step and words) and ends with FAIL,
OSWorld's infeasible answer, which this case's check passes. linux-tiny has no desktop: its pyautogui code
fails in the guest, as OSWorld's own does on a machine without pyautogui, and the loop goes on."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kit.libvirt import domains
from kit.scratch import scratch_dir
from replaypage import replay_data

pytestmark = [pytest.mark.libvirt, pytest.mark.timeout(900)]

GH_RUNNER = str(Path(sys.executable).parent / "gh-runner")
AGENT = Path(__file__).parent / "scripted_agent.py"
CODE = "pyautogui.hotkey('ctrl', 'alt', 't')"
CASE = {
    "key": "OSW-INF", "name": "Infeasible request", "start_state": "linux-tiny", "runs_on": "vm",
    "prompt": "Install Photoshop on this machine.", "setup_script": "true\n", "limits": {"minutes": 3, "steps": 5},
    "success": {"check_script": 'if [ "$GH_CHECK_PHASE" = after ] && [ "$GH_AGENT_ANSWER" = infeasible ]; then\n'
                                "  echo True\nelse\n  echo False\nfi\n"},
}


@pytest.fixture()
def work() -> Iterator[Path]:
    with scratch_dir("gh-osworld-agent-test-") as d:
        d.chmod(0o755)
        yield d


def test_an_osworld_agent_runs_as_it_is_and_fail_is_its_infeasible_answer(work: Path, images_dir: Path) -> None:
    agent_dir = work / "agent"  # where the sandbox's uid reaches it (the checkout may be under /root)
    agent_dir.mkdir(mode=0o755)
    shutil.copyfile(AGENT, agent_dir / AGENT.name)
    (agent_dir / AGENT.name).chmod(0o644)
    plan = {"actions": [[CODE, "WAIT"], ["FAIL"]]}
    (work / "cases.yaml").write_text(yaml.safe_dump({"cases": [CASE]}))
    (work / "server.yaml").write_text(yaml.safe_dump({"agents": {"ow": {
        "kind": "osworld", "agent": "scripted_agent:make", "python_path": [str(agent_dir)],
        "observation": "screenshot", "action_space": "pyautogui", "max_steps": 10,
        "env": {"GH_TEST_OSWORLD_PLAN": json.dumps(plan)}}}}))
    report = work / "out" / "report.json"
    proc = subprocess.run([GH_RUNNER, "local", str(work / "cases.yaml"), "--agents", "ow", "--repeat", "1",
                           "--server-config", str(work / "server.yaml"), "--report", str(report),
                           "--images-dir", str(images_dir)], capture_output=True, text=True, timeout=800)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    attempt = json.loads(report.read_text())["attempts"][0]
    assert attempt["outcome"] == "passed", attempt
    frames = replay_data(Path(attempt["replay_path"]))["frames"]
    execs = [f["event"] for f in frames if f["label"] == "exec"]
    assert len(execs) == 1, frames
    assert execs[0]["note"] == {"agent": "external", "step": 1, "text": "step 1", "action": CODE}, execs
    assert len([f for f in frames if f["label"] == "screen"]) >= 2  # the first look and the one after step 1
    runner = proc.stdout.split("runner ", 1)[1].split()[0]
    assert domains(f"gh-{runner}-") == []
