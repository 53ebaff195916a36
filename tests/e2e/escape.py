"""The escape campaign (docs/agents.md, "What counts against whom"): every hostile input an agent controls, run
against the real stack, `gh-runner local` on linux-tiny (its embedded gh-server, a real runner and guest), in
one run with one slot so each try follows the last on the same machine pool and runner. Command agents
(tests/e2e/agents/hostile.py) send the machine API's hostile requests and answers; model agents are answered
by the scripted model server (tests/gateway/modelserver.py, replies from the SDKs' own types).

Used by bench/escape.py (everything) and tests/e2e/test_escape.py (a few inputs)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from agentfiles import agent_command
from gateway.modelserver import Reply, by_model, chat, chat_raw, model_server
from kit.libvirt import domains

GH_RUNNER = str(Path(sys.executable).parent / "gh-runner")
HOSTILE = Path(__file__).parent / "agents" / "hostile.py"
KEY_ENV = "GH_ESCAPE_MODEL_KEY"

COMMAND_MODES = ["answer-nul", "answer-long", "answer-bytes", "answer-endless", "input-10mb", "input-unknown-key",
                 "input-offscreen", "input-100k-events", "exec-nul-script", "exec-nul-env", "ask-nul", "approval-flood",
                 "screen-8-threads", "kill-guest-agent", "stop-guest-agent", "remove-guest-agent"]
CLICK = ("computer", {"action": "click", "x": 10, "y": 10})
# Model agents (openai-chat, tool_calls): name -> (settings over agents_config's, replies in order).
MODEL_MODES: dict[str, tuple[dict[str, Any], list[Reply]]] = {
    "model-nul": ({"api": "openai-chat"}, [chat("fixed it\x00really")]),
    "model-10mb": ({"api": "openai-chat"}, [chat("x" * 10_000_000)]),
    "model-not-json": ({"api": "openai-chat", "max_invalid": 2}, [chat_raw("computer", "{not json")]),
    "model-outside-schema": ({"api": "openai-chat", "max_invalid": 2},
                             [chat(None, ("computer", {"action": "teleport", "x": 1}))]),
    "model-1000-actions": ({"api": "openai-chat"}, [chat(None, *[CLICK] * 1000), chat("done")]),
    "model-never-ends": ({"api": "openai-chat", "timeout": 5, "retries": 0}, [replace(chat("ok"), trickle=1.0)]),
}
CASE = {
    "key": "ESC-01", "name": "A file the agent must create", "prompt": "Please create /tmp/fixed.",
    "start_state": "linux-tiny", "setup_script": "rm -f /tmp/fixed\n",
    # The check reads the answer from its file too: an empty one before the task, as the variable.
    "success": {"check_script": 'test -f "$GH_AGENT_ANSWER_FILE" || exit 3\n'
                                "if [ -f /tmp/fixed ]; then echo True; else echo False; fi\n"},
    "limits": {"minutes": 2}, "runs_on": "vm",
}
# A short check bound and channel grace: a stopped channel costs the check's bound plus the grace.
RUNNER_CONFIG = {"timeouts": {"check": 30, "channel_back": 20}}


@dataclass
class Row:
    input: str
    outcome: str  # of the counted try
    retries: int
    why: str  # task_end reason / fault / failed_reason, or the error

    @property
    def ours(self) -> bool:
        return self.outcome == "error"


@dataclass
class Campaign:
    report: dict[str, Any]
    stdout: str
    leftover: list[str]

    def rows(self) -> list[Row]:
        retried: dict[str, int] = {}
        for a in self.report["retried_attempts"]:
            retried[a["agent_id"]] = retried.get(a["agent_id"], 0) + 1
        out = []
        for a in self.report["attempts"]:
            m = a.get("metrics") or {}
            end = m.get("task_end") or {}
            why = "/".join(str(x) for x in (end.get("reason"), end.get("fault"), m.get("failed_reason")) if x)
            out.append(Row(a["agent_id"], str(a["outcome"]), retried.get(a["agent_id"], 0),
                           why if a["outcome"] != "error" else f"{why} {a.get('error')}"[:200]))
        return sorted(out, key=lambda r: r.input)

    def errors_of_ours(self) -> int:
        return sum(1 for a in [*self.report["attempts"], *self.report["retried_attempts"]] if a["outcome"] == "error")


def run(work: Path, images_dir: Path, modes: list[str], model_modes: list[str] | None = None,
        timeout: float = 3600) -> Campaign:
    """One `gh-runner local` run with an agent per mode (command modes, then model ones), one try each."""
    model_modes = model_modes or []
    agents: dict[str, Any] = {m: {"id": m, "kind": "command", "command": agent_command(HOSTILE, m), "timeout": 300}
                              for m in modes}
    (work / "runner.yaml").write_text(yaml.safe_dump(RUNNER_CONFIG))
    (work / "cases.yaml").write_text(yaml.safe_dump({"repeat": 1, "cases": [CASE]}))
    out = work / "report.json"
    scripts = {m: MODEL_MODES[m][1] for m in model_modes}
    with model_server(by_model(scripts)) as (url, _seen):
        for m in model_modes:
            agents[m] = {"id": m, "kind": "model", "model": m, "base_url": url, "api_key_env": KEY_ENV,
                         "screen": [640, 400], "retries": 1, **MODEL_MODES[m][0]}
        (work / "server.yaml").write_text(yaml.safe_dump({"agents": agents}))
        proc = subprocess.run(
            [GH_RUNNER, "local", str(work / "cases.yaml"), "--agents", ",".join([*modes, *model_modes]),
             "--server-config", str(work / "server.yaml"), "--config", str(work / "runner.yaml"), "--slots", "1",
             "--report", str(out), "--images-dir", str(images_dir)],
            capture_output=True, text=True, timeout=timeout, env={**os.environ, KEY_ENV: "sk-escape"})
    if not out.exists():
        raise RuntimeError(f"gh-runner local wrote no report (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(out.read_text())
    m = re.search(r"runner (local-\d+) with", proc.stdout)
    name = m.group(1) if m else None
    return Campaign(report, proc.stdout, domains(f"gh-{name}-") if name else [])
