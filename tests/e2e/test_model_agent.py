"""Model agents (docs/agents.md) on the real linux-tiny guest: `gh-runner local examples/...yaml --agents <model agents>
--server-config FILE` against a scripted model server (tests/gateway/modelserver.py, replies built from
the SDKs' own types), one agent per API and `output`: GUI only (typing the fix into the guest's console
and pressing Enter), and one with `shell` (an exec). Each must pass the case, and the replay must show
every step: the screen the model saw, its words, each action, the exec's script, exit code and output.
The one boundary faked is the model; the control plane, runner, QEMU and guest are real.

The GUI case on the desktop image (linux-desktop: a terminal opened with ctrl+alt+t) is
tests/desktop/test_model_agent.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gateway.modelserver import Reply, chat, claude, computer_call, member, response, said, text, tool
from kit.model_agents import OPEN_MODELS, acted, check_every_agent, one_case, run_local, seen_by_model
from kit.scratch import scratch_dir
from openai.types.responses import computer_action as ca
from replaypage import replay_data

pytestmark = pytest.mark.timeout(1500)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "linux-basics.yaml"
KEY = "sk-e2e-4f1c9a7d-never-in-a-replay"
FIX = "printf 'mode=production\\n' > /opt/app/app.conf"  # FIL-01's fix, typed into the console
ANSWER = "Your app's config is back: mode=production."

# Per agent (by the model name it sends): the replies in order.
SCRIPTS: dict[str, list[Reply]] = {
    "claude-shell": [claude(text("I'll write the config file."),
                            tool("shell", script=FIX + " && cat /opt/app/app.conf")),
                     claude(text(ANSWER))],
    "claude-gui": [claude(text("I'll type the fix into the console."), member("type", text=FIX),
                          member("key", text="Return")),
                   claude(text(ANSWER))],
    "gpt-gui": [response(said("Typing the fix."), computer_call(ca.Type(type="type", text=FIX),
                                                                ca.Keypress(type="keypress", keys=["ENTER"]))),
                response(said(ANSWER))],
    "qwen-tools": [chat("Typing the fix.", ("computer", {"action": "type", "text": FIX + "\n"})), chat(ANSWER)],
    "opencua-pyautogui": [chat("I'll type it.\n```python\npyautogui.write(" + json.dumps(FIX) + ")\n"
                               "pyautogui.press('enter')\n```"), chat("DONE")],
    "uitars": [chat("Thought: type the fix.\nAction: type(content=" + json.dumps(FIX + "\\n") + ")"),
               chat("Thought: done.\nAction: finished(content=" + json.dumps(ANSWER) + ")")],
}
AGENTS: dict[str, dict[str, Any]] = {
    "claude-shell": {"api": "anthropic", "tools": ["computer", "shell"]},
    "claude-gui": {"api": "anthropic"},
    "gpt-gui": {"api": "openai-responses"},
    **OPEN_MODELS,
}


@pytest.fixture()
def work() -> Iterator[Path]:
    with scratch_dir("gh-model-e2e-") as d:
        yield d


def test_model_agents_fix_a_real_guest_and_the_replay_shows_every_step(work: Path, images_dir: Path) -> None:
    data = one_case(EXAMPLES, "FIL-01", wait_after="[ ! -f /opt/app/app.conf ]")
    data["cases"][0]["limits"] = {"minutes": 4}
    run = run_local(work, data, SCRIPTS, AGENTS, KEY, "--images-dir", str(images_dir), timeout=1400)
    check_every_agent(run, AGENTS, KEY)
    result = run.report
    for name, a in run.by_agent.items():
        assert a["outcome"] == "passed", (name, a.get("error"), a.get("metrics"))
        m = a["metrics"]
        assert m["model"]["steps"] == 2 and m["model"]["tokens_in"] == 200 and m["cost_cents"] == 1, (name, m)
        page = Path(a["replay_path"])
        assert KEY not in page.read_text()
        frames = replay_data(page)["frames"]
        labels = [f["label"] for f in frames]
        assert len(seen_by_model(frames)) >= 2, (name, labels)  # the first screen and the one after its actions
        steps = acted(frames)
        assert steps and steps[0]["event"]["note"]["step"] == 1 and steps[0]["event"]["note"]["text"], (name, labels)
        if name == "claude-shell":
            (ex,) = [f for f in frames if f["label"] == "exec"]
            assert ex["event"]["script"].startswith("printf 'mode=production") and ex["event"]["exit_code"] == 0
            assert "mode=production" in ex["event"]["stdout_tail"]
        else:
            assert any(f["event"]["type"] == "type" for f in steps), (name, steps)
    assert result["agents"]["claude-shell"]["pass_rate"] == 1.0
    # What each agent spent, per agent (the server's test_run_results; the rows are checked above).
    assert {k: v["cost_cents"] for k, v in result["results"]["by_agent"].items()} == dict.fromkeys(AGENTS, 1)
