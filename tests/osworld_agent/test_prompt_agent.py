"""OSWorld's own published agent, PromptAgent (desktop-env 1.0.2 on PyPI, mm_agents/agent.py), as kind
`osworld` through `gh-runner local` on the real linux-tiny guest, its model a scripted OpenAI-compatible
server answering Chat Completions in OpenAI's wire format (tests/gateway/modelserver.py, built from the
openai SDK's types). Its first reply is pyautogui code (run in the guest, noted in the replay with the
model's words), its second FAIL: OSWorld's infeasible answer, which the case's check passes.

PromptAgent is not vendored: it is installed into a throwaway venv in /var/tmp (desktop-env with --no-deps,
and only what mm_agents/agent.py imports), once, from PyPI; a host that cannot reach PyPI and has no such
venv skips, saying so."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from gateway.modelserver import chat, model_server, sequence
from kit.libvirt import domains
from kit.scratch import scratch_dir
from replaypage import replay_data

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(1200)]

GH_RUNNER = str(Path(sys.executable).parent / "gh-runner")
VENV = Path("/var/tmp/gh-test-osworld-promptagent-venv")
# desktop-env without its declared dependencies (torch, transformers, easyocr: GBs); these are what
# mm_agents/agent.py imports at its top.
PROMPT_AGENT_IMPORTS = ["python-dotenv", "backoff", "dashscope", "google-generativeai", "openai", "requests",
                        "tiktoken", "pillow", "groq"]
FIRST = "I will open the terminal first.\n```python\npyautogui.hotkey('ctrl', 'alt', 't')\n```"
CODE = "pyautogui.hotkey('ctrl', 'alt', 't')"
CASE = {
    "key": "OSW-PA", "name": "Infeasible request", "start_state": "linux-tiny", "runs_on": "vm",
    "prompt": "Install Photoshop on this machine.", "setup_script": "true\n", "limits": {"minutes": 5, "steps": 5},
    "success": {"check_script": 'if [ "$GH_CHECK_PHASE" = after ] && [ "$GH_AGENT_ANSWER" = infeasible ]; then\n'
                                "  echo True\nelse\n  echo False\nfi\n"},
}


def prompt_agent_python() -> Path:
    python = VENV / "bin" / "python"
    if (VENV / "ready").is_file():
        return python
    try:
        urllib.request.urlopen("https://pypi.org/simple/desktop-env/", timeout=10).close()
    except OSError as e:
        pytest.skip(f"PyPI is out of reach and no PromptAgent venv is in {VENV}: {type(e).__name__}")
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(VENV)], check=True, timeout=120)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "--no-deps", "desktop-env==1.0.2"], check=True, timeout=600)
    subprocess.run([*pip, *PROMPT_AGENT_IMPORTS], check=True, timeout=1200)
    subprocess.run(["chmod", "-R", "go+rX", str(VENV)], check=True, timeout=120)  # the sandbox's uid runs it
    (VENV / "ready").write_text("")
    return python


def test_osworlds_prompt_agent_runs_unchanged_against_a_scripted_openai_server(images_dir: Path) -> None:
    python = prompt_agent_python()
    with scratch_dir("gh-osworld-promptagent-") as work, \
            model_server(sequence(chat(FIRST), chat("The task cannot be done here.\n```FAIL```"))) as (url, seen):
        work.chmod(0o755)
        agent_dir = work / "agent"  # where the sandbox's uid reaches it
        agent_dir.mkdir(mode=0o755)
        src = Path(__file__).parent / "prompt_agent_factory.py"
        shutil.copyfile(src, agent_dir / src.name)
        (agent_dir / src.name).chmod(0o644)
        (work / "cases.yaml").write_text(yaml.safe_dump({"cases": [CASE]}))
        (work / "server.yaml").write_text(yaml.safe_dump({"agents": {"prompt": {
            "kind": "osworld", "agent": "prompt_agent_factory:make", "python": str(python),
            "python_path": [str(agent_dir)], "observation": "screenshot", "action_space": "pyautogui",
            "max_steps": 5, "env": {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "sk-scripted",
                                    "GH_TEST_PROMPT_AGENT_MODEL": "gpt-4o"}}}}))
        report = work / "out" / "report.json"
        proc = subprocess.run([GH_RUNNER, "local", str(work / "cases.yaml"), "--agents", "prompt", "--repeat", "1",
                               "--server-config", str(work / "server.yaml"), "--report", str(report),
                               "--images-dir", str(images_dir)], capture_output=True, text=True, timeout=1000)
        assert proc.returncode == 0, (proc.stdout[-6000:], proc.stderr[-3000:])
        attempt = json.loads(report.read_text())["attempts"][0]
        assert attempt["outcome"] == "passed", attempt
        # PromptAgent's own requests: its system prompt with the case's instruction, and the screen as a PNG.
        assert len(seen.bodies) == 2 and [p for p, *_ in seen.requests] == ["/v1/chat/completions"] * 2
        first = json.dumps(seen.bodies[0])
        assert "Install Photoshop on this machine." in first and "data:image/png;base64," in first
        frames = replay_data(Path(attempt["replay_path"]))["frames"]
        execs = [f["event"] for f in frames if f["label"] == "exec"]
        assert len(execs) == 1 and execs[0]["note"]["step"] == 1, execs
        assert execs[0]["note"]["text"] == FIRST and execs[0]["note"]["action"] == CODE
        runner = proc.stdout.split("runner ", 1)[1].split()[0]
        assert domains(f"gh-{runner}-") == []
