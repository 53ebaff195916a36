"""The desktop smoke's agents (scripts/test.sh runs the `desktop_smoke` tests on every run): one real
desktop case, DSK-01 of examples/desktop-basics.yaml (the dark theme switched on, checked with
xfconf-query), passed by two agents that only look at the screen and press keys, in one `gh-runner
local` run as an operator would start it:
- `gui`, a command agent (tests/desktop/agents/gui_theme_fixer.py) using the machine API's screen and
  input, never exec: the hypervisor's keyboard is all that changes the setting;
- `claude`, the built-in model agent against a scripted model (tests/gateway/modelserver.py), fixing
  it in one step of computer actions and answering in the next.

One run, `--slots 1`: the desktop's warm snapshot (a boot to the signed-in session and a 2 GiB memory
save) is made once for both. GH_TEST_DESKTOP_STATE_DIR keeps the runner's state dir across runs, so
a host that already made the snapshot for this image restores from it at once (providers/qemu/warm.py
keys it by the image's version and checksum).
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
OPENED = 30  # seconds a terminal may take to open and take the keyboard, under TCG on a loaded host
MODEL_SCRIPT = [
    claude(text("Opening a terminal and setting the light theme."), member("key", text="ctrl+alt+t"),
           member("wait", duration=OPENED), member("type", text=FIX), member("key", text="Return")),
    claude(text(ANSWER)),
]


def dsk01_only() -> dict[str, Any]:
    """DSK-01, its check waiting (bounded, 10 s) after the agent for the typed command to have run: the
    terminal runs it after the agent has moved on. The check before must still see the dark theme."""
    data = yaml.safe_load(CASES.read_text())
    data["cases"] = [c for c in data["cases"] if c["key"] == "DSK-01"]
    success = data["cases"][0]["success"]
    success["check_script"] = (
        'if [ "$GH_CHECK_PHASE" = after ]; then\n'
        '  i=0; while xfconf-query -c xsettings -p /Net/ThemeName | grep -qi dark && [ $i -lt 50 ]; do\n'
        '    sleep 0.2; i=$((i+1)); done\n'
        'fi\n' + success["check_script"])
    return dict(data)


@pytest.fixture(scope="module")
def smoke_run(desktop_images_dir: Path) -> Iterator[dict[str, Any]]:
    """The run's report, by agent: {"gui": attempt, "claude": attempt}, plus what the model server saw."""
    ensure_libvirtd()
    work = Path(tempfile.mkdtemp(prefix="gh-desktop-smoke-", dir="/var/tmp"))
    work.chmod(0o755)  # libvirt-qemu reaches the state dir's overlays
    try:
        cases = work / "cases.yaml"
        cases.write_text(yaml.safe_dump(dsk01_only()))
        report = work / "out" / "report.json"
        state = Path(os.environ.get("GH_TEST_DESKTOP_STATE_DIR") or work / "state")
        with model_server(by_model({"claude": MODEL_SCRIPT})) as (url, seen):
            config = agents_config(url, {"claude": {"api": "anthropic"}}, KEY_ENV)
            config["agents"]["gui"] = {"kind": "command", "command": agent_command(GUI_AGENT, FIX)}
            server_config = work / "server.yaml"
            server_config.write_text(yaml.safe_dump(config))
            proc = subprocess.run(
                [GH_RUNNER, "local", str(cases), "--agents", "gui,claude", "--repeat", "1", "--slots", "1",
                 "--server-config", str(server_config), "--config", str(RUNNER_CONFIG), "--report", str(report),
                 "--images-dir", str(desktop_images_dir), "--state-dir", str(state), "--libvirt-uri", LIBVIRT_URI],
                capture_output=True, text=True, timeout=3400, env={**os.environ, KEY_ENV: KEY}, cwd=REPO)
        assert report.is_file(), (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
        result = json.loads(report.read_text())
        attempts = {a["agent_id"]: a for a in result["attempts"]}
        # The replay pages live in the work dir: read them now.
        frames = {name: replay_data(Path(a["replay_path"]))["frames"] for name, a in attempts.items()}
        yield {"proc": proc, "attempts": attempts, "frames": frames, "bodies": seen.bodies}
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
    assert any(e["type"] == "key" and {k.lower() for k in e["keys"]} == {"ctrl", "alt", "t"} for e in events), events
    assert any(e["type"] == "type" and FIX in e["text"] for e in events), events


def test_a_gui_only_command_agent_fixes_a_desktop_case_through_the_hypervisor(smoke_run: dict[str, Any]) -> None:
    assert "gui" in smoke_run["attempts"], smoke_run["proc"].stdout[-3000:]
    assert_fixed_by_keys(smoke_run["attempts"]["gui"], acted(smoke_run["frames"]["gui"]))


def test_a_model_agent_fixes_a_desktop_case_in_one_step(smoke_run: dict[str, Any]) -> None:
    assert "claude" in smoke_run["attempts"], smoke_run["proc"].stdout[-3000:]
    attempt = smoke_run["attempts"]["claude"]
    events = acted(smoke_run["frames"]["claude"])
    assert_fixed_by_keys(attempt, events)
    assert attempt["metrics"]["model"]["steps"] == len(MODEL_SCRIPT), attempt["metrics"]
    assert {e["note"]["step"] for e in events if e.get("note")} == {1}, events  # all the first step's
    assert not any("shell" in json.dumps(b.get("tools", [])) for b in smoke_run["bodies"])  # no shell offered


def test_the_run_passes_and_leaves_no_machine(smoke_run: dict[str, Any]) -> None:
    proc = smoke_run["proc"]
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert KEY not in proc.stdout + proc.stderr
    runner = re.search(r"runner (local-\d+) with", proc.stdout)
    assert runner, proc.stdout
    assert domains(f"gh-{runner.group(1)}-") == []
