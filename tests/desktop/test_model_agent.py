"""The model agents' GUI test (docs/agents.md) on the real linux-desktop guest: a scripted model of each
API and each openai-chat `output` fixes DSK-01 (examples/desktop-basics.yaml: the dark theme switched on,
checked with xfconf-query) with GUI actions only, no shell tool: it looks at the screen, opens a terminal
with the key chord ctrl+alt+t, waits, types the xfconf-query command that fixes the theme plus Enter,
looks again and answers. Everything runs as an operator would: `gh-runner local CASES --agents a,b,...
--server-config FILE --config examples/desktop-runner.yaml` (on a case file made from DSK-01), all
agents in one run so the desktop's warm snapshot (a boot to the session plus a 2 GiB memory save) is
paid once, one machine at a time (`--slots 1`: the host has 2 shared cores).

The one boundary faked is the model (tests/gateway/modelserver.py, replies built from the SDKs' own
types); the control plane, runner, QEMU, the desktop session and its input are real. The scripted model
cannot see: it waits long enough for a terminal to open under TCG before it types.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gateway.modelserver import Reply, chat, claude, computer_call, member, response, said, text
from kit.libvirt import LIBVIRT_URI, REPO, ensure_libvirtd
from kit.model_agents import OPEN_MODELS, acted, check_every_agent, one_case, run_local, seen_by_model
from kit.scratch import scratch_dir
from openai.types.responses import computer_action as ca
from replaypage import replay_data

from .gui import colours

pytestmark = [pytest.mark.desktop, pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(3600)]

CASES = REPO / "examples" / "desktop-basics.yaml"
RUNNER_CONFIG = REPO / "examples" / "desktop-runner.yaml"
KEY = "sk-desktop-9b2e71c4-never-in-a-replay"
FIX = "xfconf-query -c xsettings -p /Net/ThemeName -s Adwaita"  # DSK-01's fix, typed into a terminal
ANSWER = "Your windows have the normal light look again."
OPENED = 30  # seconds a terminal may take to open and take the keyboard, under TCG on a loaded host

# Per agent (by the model name it sends): the replies in order, one per step.
SCRIPTS: dict[str, list[Reply]] = {
    "claude": [
        claude(text("Let me see the screen, then open a terminal."), member("screenshot"),
               member("key", text="ctrl+alt+t"), member("wait", duration=OPENED)),
        claude(text("Setting the light theme."), member("type", text=FIX), member("key", text="Return"),
               member("screenshot")),
        claude(text(ANSWER))],
    "gpt": [
        response(said("Opening a terminal."), computer_call(
            ca.Screenshot(type="screenshot"), ca.Keypress(type="keypress", keys=["CTRL", "ALT", "T"]),
            *[ca.Wait(type="wait")] * (OPENED // 2))),  # the Responses wait is 2 s
        response(said("Setting the light theme."), computer_call(
            ca.Type(type="type", text=FIX), ca.Keypress(type="keypress", keys=["ENTER"]),
            ca.Screenshot(type="screenshot"))),
        response(said(ANSWER))],
    "qwen-tools": [
        chat("Opening a terminal.", ("computer", {"action": "screenshot"}),
             ("computer", {"action": "key", "keys": ["ctrl", "alt", "t"]}),
             ("computer", {"action": "wait", "seconds": OPENED})),
        chat("Setting the light theme.", ("computer", {"action": "type", "text": FIX + "\n"}),
             ("computer", {"action": "screenshot"})),
        chat(ANSWER)],
    "opencua-pyautogui": [
        chat(f"I'll open a terminal.\n```python\npyautogui.hotkey('ctrl', 'alt', 't')\ntime.sleep({OPENED})\n```"),
        chat("Setting the light theme.\n```python\npyautogui.write(" + json.dumps(FIX) + ")\n"
             "pyautogui.press('enter')\n```"),
        chat("DONE")],
    "uitars": [  # one action per reply; its wait is 5 s
        chat("Thought: open a terminal.\nAction: hotkey(key='ctrl alt t')"),
        *[chat("Thought: the terminal is opening.\nAction: wait()")] * (OPENED // 5),
        chat("Thought: set the light theme.\nAction: type(content=" + json.dumps(FIX + "\\n") + ")"),
        chat("Thought: done.\nAction: finished(content=" + json.dumps(ANSWER) + ")")],
}
AGENTS: dict[str, dict[str, Any]] = {
    "claude": {"api": "anthropic"},
    "gpt": {"api": "openai-responses"},
    **OPEN_MODELS,
}


@pytest.fixture()
def work() -> Iterator[Path]:
    with scratch_dir("gh-model-desktop-") as d:  # libvirt-qemu reaches the state dir's overlays
        yield d


def test_model_agents_fix_the_desktop_with_gui_actions_only(work: Path, desktop_images_dir: Path) -> None:
    ensure_libvirtd()
    data = one_case(CASES, "DSK-01", wait_after="xfconf-query -c xsettings -p /Net/ThemeName | grep -qi dark")
    # GH_TEST_DESKTOP_STATE_DIR: a kept runner state dir whose desktop warm snapshot a rerun reuses.
    state = Path(os.environ.get("GH_TEST_DESKTOP_STATE_DIR") or work / "state")
    run = run_local(work, data, SCRIPTS, AGENTS, KEY, "--slots", "1", "--config", str(RUNNER_CONFIG),
                    "--images-dir", str(desktop_images_dir), "--state-dir", str(state), "--libvirt-uri", LIBVIRT_URI,
                    timeout=3400, cwd=REPO)
    check_every_agent(run, AGENTS, KEY)
    for name, a in run.by_agent.items():
        page = Path(a["replay_path"])
        frames = replay_data(page)["frames"]
        # What the model saw first is a painted desktop (a blank screen is a fault of the machine, not the model's).
        first = next(f for f in frames if f["label"] == "screen")
        assert colours((page.parent / first["src"]).read_bytes()) > 50, (name, "the model's first screen is blank")
        assert a["outcome"] == "passed", (name, a.get("error"), a.get("check"), a.get("metrics"))
        steps = len(SCRIPTS[name])
        m = a["metrics"]
        assert m["model"]["steps"] == steps and m["model"]["tokens_in"] == 100 * steps, (name, m)
        assert m["model"]["tokens_out"] == 20 * steps and m["cost_cents"] == 1, (name, m)
        assert KEY not in page.read_text()
        labels = [f["label"] for f in frames]
        # The check ran in the session, before (the dark theme: False) and after (fixed: True).
        assert a["check"]["before"].splitlines()[-1] == "False" and a["check"]["passed"] is True, (name, a["check"])
        assert a["check"]["after"].splitlines()[-1] == "True", (name, a["check"])
        # Every step's screen, as the model saw it.
        assert len(seen_by_model(frames)) >= steps, (name, labels)
        did = acted(frames)
        assert all(f["label"] == "input" for f in did), (name, labels)  # GUI only: no exec
        assert did[0]["event"]["note"]["step"] == 1, (name, did[0])
        # The model's words go with its turn's first action, here a screenshot for some (a screen frame).
        first_step = [f["event"]["note"] for f in frames if ((f["event"] or {}).get("note") or {}).get("step") == 1]
        assert any(n.get("text") for n in first_step), (name, first_step)
        events = [f["event"] for f in did]
        chords = [e for e in events if e["type"] == "key" and {k.lower() for k in e["keys"]} >= {"ctrl", "alt", "t"}]
        assert chords, (name, events)
        assert any(e["type"] == "type" and FIX in e["text"] for e in events), (name, events)
        assert did[-1]["event"]["note"]["step"] == steps - 1, (name, events)  # the last step only answers
    assert {k: v["pass_rate"] for k, v in run.report["agents"].items()} == dict.fromkeys(AGENTS, 1.0)
    # No shell tool was offered to any model.
    assert not any("shell" in json.dumps(b.get("tools", [])) for b in run.seen.bodies)
