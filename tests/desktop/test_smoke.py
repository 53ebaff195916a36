"""The desktop smoke's agents (scripts/test.sh runs the `desktop_smoke` tests on every run): a real
desktop case, DSK-01 of examples/desktop-basics.yaml (the dark theme switched on, checked with
xfconf-query), passed by agents that only look at the screen and press keys, each in a `gh-runner
local` run as an operator would start it:
- `gui`, a command agent (tests/desktop/agents/gui_theme_fixer.py) using the machine API's screen and
  input, never exec: it opens a terminal with ctrl+alt+t, watches the screen until the window is
  there, and types the fix: the hypervisor's keyboard is all that changes the setting;
- `claude`, the built-in model agent against a scripted model (tests/gateway/modelserver.py), fixing
  it in one step of computer actions and answering in the next. A scripted model cannot see when a
  window is ready for its keys, so its case starts with a terminal open and focused (the setup waits
  for it); it types the fix there.

Both runs share one runner state dir, so the desktop's warm snapshot (a boot to the signed-in session
and a 2 GiB memory save) is made once. GH_TEST_DESKTOP_STATE_DIR keeps that dir across runs: a host
that already made the snapshot for this image restores from it at once (providers/qemu/warm.py keys
it by the image's version and checksum).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from agentfiles import agent_command
from e2e.procs import domains
from gateway.modelserver import agents_config, by_model, claude, member, model_server, text
from replaypage import replay_data

from .conftest import LIBVIRT_URI, REPO, ensure_libvirtd

pytestmark = [pytest.mark.desktop, pytest.mark.desktop_smoke, pytest.mark.libvirt, pytest.mark.slow,
              pytest.mark.timeout(3600)]

CASES = REPO / "examples" / "desktop-basics.yaml"
RUNNER_CONFIG = REPO / "examples" / "desktop-runner.yaml"
GH_RUNNER = str(Path(sys.executable).parent / "gh-runner")
GUI_AGENT = Path(__file__).parent / "agents" / "gui_theme_fixer.py"
KEY_ENV = "GH_E2E_MODEL_KEY"
KEY = "sk-desktop-smoke-5d1f0a-never-in-a-replay"
FIX = "xfconf-query -c xsettings -p /Net/ThemeName -s Adwaita"  # DSK-01's fix, typed into a terminal
ANSWER = "Your windows have the normal light look again."
MODEL_SCRIPT = [
    claude(text("Setting the light theme in the open terminal."), member("type", text=FIX),
           member("key", text="Return")),
    claude(text(ANSWER)),
]
# Appended to DSK-01's setup for the scripted model: a terminal open, and the keyboard's, before it starts.
TERMINAL_OPEN = """
setsid xfce4-terminal >/dev/null 2>&1 &
i=0
until xdotool getactivewindow getwindowname 2>/dev/null | grep -qi terminal; do
  if [ $i -ge 600 ]; then echo "no terminal has the keyboard after 120 s" >&2; exit 1; fi
  sleep 0.2; i=$((i+1))
done
"""


def dsk01(*, terminal_open: bool = False) -> dict[str, Any]:
    """DSK-01, its check waiting (bounded, 10 s) after the agent for the typed command to have run: the
    terminal runs it after the agent has moved on. The check before must still see the dark theme."""
    data = yaml.safe_load(CASES.read_text())
    data["cases"] = [c for c in data["cases"] if c["key"] == "DSK-01"]
    case = data["cases"][0]
    case["success"]["check_script"] = (
        'if [ "$GH_CHECK_PHASE" = after ]; then\n'
        '  i=0; while xfconf-query -c xsettings -p /Net/ThemeName | grep -qi dark && [ $i -lt 50 ]; do\n'
        '    sleep 0.2; i=$((i+1)); done\n'
        'fi\n' + case["success"]["check_script"])
    if terminal_open:
        case["setup_script"] += TERMINAL_OPEN
    return dict(data)


@dataclass
class Run:
    proc: subprocess.CompletedProcess[str]
    attempt: dict[str, Any] | None  # the one agent's attempt, None when the run wrote no report
    frames: list[dict[str, Any]]  # its replay's frames


def local_run(work: Path, images: Path, state: Path, agent: str, cases: dict[str, Any],
              server: dict[str, Any]) -> Run:
    """`gh-runner local` of `cases` with one agent, one machine at a time, in runner state dir `state`."""
    d = work / agent
    d.mkdir()
    (d / "cases.yaml").write_text(yaml.safe_dump(cases))
    (d / "server.yaml").write_text(yaml.safe_dump(server))
    report = d / "out" / "report.json"
    proc = subprocess.run(
        [GH_RUNNER, "local", str(d / "cases.yaml"), "--agents", agent, "--repeat", "1", "--slots", "1",
         "--server-config", str(d / "server.yaml"), "--config", str(RUNNER_CONFIG), "--report", str(report),
         "--images-dir", str(images), "--state-dir", str(state), "--libvirt-uri", LIBVIRT_URI],
        capture_output=True, text=True, timeout=1700, env={**os.environ, KEY_ENV: KEY}, cwd=REPO)
    if not report.is_file():
        return Run(proc, None, [])
    attempt = json.loads(report.read_text())["attempts"][0]
    return Run(proc, attempt, replay_data(Path(attempt["replay_path"]))["frames"])


@pytest.fixture(scope="module")
def smoke(desktop_images_dir: Path) -> Iterator[dict[str, Any]]:
    """{"gui": Run, "claude": Run, "bodies": what the model server was sent}."""
    ensure_libvirtd()
    work = Path(tempfile.mkdtemp(prefix="gh-desktop-smoke-", dir="/var/tmp"))
    work.chmod(0o755)  # libvirt-qemu reaches the state dir's overlays
    state = Path(os.environ.get("GH_TEST_DESKTOP_STATE_DIR") or work / "state")
    try:
        gui = local_run(work, desktop_images_dir, state, "gui", dsk01(), {"agents": {
            "gui": {"kind": "command", "command": agent_command(GUI_AGENT, FIX)}}})
        with model_server(by_model({"claude": MODEL_SCRIPT})) as (url, seen):
            model = local_run(work, desktop_images_dir, state, "claude", dsk01(terminal_open=True),
                              agents_config(url, {"claude": {"api": "anthropic"}}, KEY_ENV))
        yield {"gui": gui, "claude": model, "bodies": seen.bodies}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def acted(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the agent did to the machine, in order: its input and exec frames' events."""
    return [f["event"] for f in frames if f["label"] in ("input", "exec")]


def assert_fixed_by_keys(attempt: dict[str, Any], events: list[dict[str, Any]]) -> None:
    assert attempt["outcome"] == "passed", (attempt.get("error"), attempt.get("check"), events)
    # The check ran in the session before (the dark theme: False) and after (the light one: True).
    check = attempt["check"]
    assert check["before"].splitlines()[-1] == "False" and check["after"].splitlines()[-1] == "True", check
    assert events and all(e["type"] in ("key", "type") for e in events), events  # keys only: no exec, no click
    assert any(e["type"] == "type" and FIX in e["text"] for e in events), events


def test_a_gui_only_command_agent_fixes_a_desktop_case_through_the_hypervisor(smoke: dict[str, Any]) -> None:
    run = smoke["gui"]
    assert run.attempt is not None, (run.proc.returncode, run.proc.stdout[-3000:], run.proc.stderr[-3000:])
    events = acted(run.frames)
    assert_fixed_by_keys(run.attempt, events)
    assert any(e["type"] == "key" and {k.lower() for k in e["keys"]} == {"ctrl", "alt", "t"} for e in events), events


def test_a_model_agent_fixes_a_desktop_case_in_one_step(smoke: dict[str, Any]) -> None:
    run = smoke["claude"]
    assert run.attempt is not None, (run.proc.returncode, run.proc.stdout[-3000:], run.proc.stderr[-3000:])
    events = acted(run.frames)
    assert_fixed_by_keys(run.attempt, events)
    assert run.attempt["metrics"]["model"]["steps"] == len(MODEL_SCRIPT), run.attempt["metrics"]
    assert {e["note"]["step"] for e in events if e.get("note")} == {1}, events  # all the first step's
    seen = [f for f in run.frames
            if f["label"] == "screen" and ((f["event"] or {}).get("note") or {}).get("seen_by_model")]
    assert len(seen) >= len(MODEL_SCRIPT), run.frames  # every step's screen, as the model saw it
    assert not any("shell" in json.dumps(b.get("tools", [])) for b in smoke["bodies"])  # no shell offered


@pytest.mark.parametrize("agent", ["gui", "claude"])
def test_each_run_passes_and_leaves_no_machine(smoke: dict[str, Any], agent: str) -> None:
    proc = smoke[agent].proc
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert KEY not in proc.stdout + proc.stderr
    runner = re.search(r"runner (local-\d+) with", proc.stdout)
    assert runner, proc.stdout
    assert domains(f"gh-{runner.group(1)}-") == []
