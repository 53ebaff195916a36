"""Model agents on a real guest, as an operator runs them: `gh-runner local CASES --agents a,b,...
--server-config FILE` against a scripted model server (tests/gateway/modelserver.py). Used by the
linux-tiny test (tests/e2e/test_model_agent.py) and the desktop one (tests/desktop/test_model_agent.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from gateway.modelserver import Reply, Seen, agents_config, by_model, model_server

from .libvirt import domains

GH_RUNNER = str(Path(sys.executable).parent / "gh-runner")
KEY_ENV = "GH_E2E_MODEL_KEY"  # the agents' key reaches gh-server by this variable, never argv
# An open model behind an OpenAI-compatible chat API, one agent per `output` it may answer in.
OPEN_MODELS: dict[str, dict[str, Any]] = {
    "qwen-tools": {"api": "openai-chat", "output": "tool_calls"},
    "opencua-pyautogui": {"api": "openai-chat", "output": "pyautogui"},
    "uitars": {"api": "openai-chat", "output": "ui-tars"},
}


def one_case(case_file: Path, key: str, *, wait_after: str) -> dict[str, Any]:
    """The case file with only case `key`. Keys typed into the guest run after the model has moved on: under
    TCG on a busy host the check after could look first. So in the check after only, wait (bounded, 10 s)
    while the shell condition `wait_after` holds; the check before still sees the fault at once."""
    data: dict[str, Any] = yaml.safe_load(case_file.read_text())
    data["cases"] = [c for c in data["cases"] if c["key"] == key]
    case = data["cases"][0]
    case["success"]["check_script"] = (
        'if [ "$GH_CHECK_PHASE" = after ]; then\n'
        f'  i=0; while {wait_after} && [ $i -lt 50 ]; do sleep 0.2; i=$((i+1)); done\n'
        'fi\n' + case["success"]["check_script"])
    return data


@dataclass
class LocalRun:
    """A finished `gh-runner local` run: its process, its JSON report, and what the model server saw."""

    proc: subprocess.CompletedProcess[str]
    report: dict[str, Any]
    seen: Seen

    @property
    def by_agent(self) -> dict[str, dict[str, Any]]:
        """Each attempt of the report by its agent's id."""
        return {a["agent_id"]: a for a in self.report["attempts"]}


def run_local(work: Path, cases: dict[str, Any], scripts: dict[str, list[Reply]], agents: dict[str, dict[str, Any]],
              key: str, *args: str, timeout: float, cwd: Path | None = None) -> LocalRun:
    """`gh-runner local` on `cases` (written to `work`) with every agent of `agents` once, each answered by
    its script (by the model name it sends), the key in the environment; `args` go on its command line.
    Asserts the run exits 0 and never prints the key."""
    cases_file = work / "cases.yaml"
    cases_file.write_text(yaml.safe_dump(cases))
    report = work / "out" / "report.json"
    with model_server(by_model(scripts)) as (url, seen):
        config = work / "server.yaml"
        config.write_text(yaml.safe_dump(agents_config(url, agents, KEY_ENV)))
        proc = subprocess.run(
            [GH_RUNNER, "local", str(cases_file), "--agents", ",".join(agents), "--repeat", "1",
             "--server-config", str(config), "--report", str(report), *args],
            capture_output=True, text=True, timeout=timeout, env={**os.environ, KEY_ENV: key}, cwd=cwd)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert key not in proc.stdout + proc.stderr
    return LocalRun(proc, json.loads(report.read_text()), seen)


def seen_by_model(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The replay's screens that a model looked at."""
    return [f for f in frames if f["label"] == "screen" and (f["event"] or {}).get("note", {}).get("seen_by_model")]


def acted(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The replay's inputs and execs that a model's step made (they carry its note)."""
    return [f for f in frames if f["label"] in ("input", "exec") and (f["event"] or {}).get("note")]


def check_every_agent(run: LocalRun, agents: dict[str, dict[str, Any]], key: str) -> None:
    """What every run shows, whatever the guest: an attempt per agent, each costing 1 cent on the results
    rows; every model request carried the key; the runner left no machine behind."""
    assert set(run.by_agent) == set(agents)
    assert {r["agent_id"]: r["cost_cents"] for r in run.report["results"]["data"]} == dict.fromkeys(agents, 1)
    assert all(key in (h.get("x-api-key"), h.get("authorization", "").removeprefix("Bearer "))
               for _, _, h, _ in run.seen.requests)
    runner = re.search(r"runner (local-\d+) with", run.proc.stdout)
    assert runner, run.proc.stdout
    assert domains(f"gh-{runner.group(1)}-") == []
