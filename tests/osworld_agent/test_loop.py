"""OSWorld's loop (gh_server/agents/osworld/loop.py), started exactly as gh-server starts it (agent.py's
boot program under /usr/bin/python3), against a machine API of the test's own: a small HTTP server
answering /screen, /exec, /input and /accessibility as docs/agents.md says gh-server does. The boundary is
the machine API; the loop, the user's agent and the translation of its actions are real."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gh_server.agents.osworld.agent import boot_source
from gh_server.agents.osworld.loop import PYAUTOGUI_PREFIX
from gh_server.settings import AgentConfig

HERE = Path(__file__).parent
# A 2x1 PNG: the screen the test's machine shows.
PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000002000000010802000000"
                    "7b40e85d0000000c4944415478da63f8cfc0f01f0005fe02fe8e5a67e10000000049454e44ae426082")
# What the accessibility route serves: OSWorld's form (a desktop-frame of nodes with states and geometry).
TREE = ('<desktop-frame xmlns:st="https://accessibility.ubuntu.example.org/ns/state">'
        '<application name="xfce4-panel"><push-button name="Applications" st:enabled="true" '
        'cp:screencoord="(0, 0)" cp:size="(32, 32)" xmlns:cp="c"/></application></desktop-frame>')


class Machine:
    def __init__(self, *, accessibility: bool = True, stop_after: int | None = None) -> None:
        self.accessibility = accessibility
        self.stop_after = stop_after  # acting requests answered before the step limit's 409
        self.calls: list[tuple[str, str, Any]] = []


@pytest.fixture
def machine() -> Iterator[tuple[str, Machine]]:
    m = Machine()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            assert self.headers["Authorization"] == "Bearer tok-1"
            m.calls.append(("GET", self.path, None))
            if self.path == "/m/screen":
                self._send(200, PNG, "image/png")
            elif self.path == "/m/accessibility" and m.accessibility:
                self._send(200, TREE.encode(), "application/xml")
            else:
                self._send(409, b'{"error": {"type": "conflict", "code": "no_desktop"}}', "application/json")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            m.calls.append(("POST", self.path, body))
            acted = sum(1 for c in m.calls if c[0] == "POST")
            if m.stop_after is not None and acted > m.stop_after:
                self._send(409, b'{"error": {"type": "conflict", "message": "step limit"}}', "application/json")
            elif self.path == "/m/exec":
                self._send(200, json.dumps({"exit_code": 0, "stdout": "", "stderr": ""}).encode(), "application/json")
            else:
                self._send(200, b'{"ok": true}', "application/json")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/m", m
    finally:
        server.shutdown()
        server.server_close()


def run_loop(url: str, tmp: Path, plan: dict[str, Any], steps: int | None = None,
             **cfg: Any) -> subprocess.CompletedProcess[str]:
    config = AgentConfig.model_validate({"id": "ow", "kind": "osworld", "agent": "scripted_agent:make",
                                         "python_path": [str(HERE)], **cfg})
    doc = {"prompt": "Open the menu", "limits": {"minutes": 5, "steps": steps},
           "machine": {"url": url, "token": "tok-1"}}
    env = {"PATH": "/usr/bin:/bin", "GH_TEST_OSWORLD_PLAN": json.dumps({**plan, "record": str(tmp / "obs.jsonl")}),
           "GH_OSWORLD_CONFIG": json.dumps({k: getattr(config, k) for k in (
               "agent", "python_path", "observation", "action_space", "max_steps", "sleep_after_execution")})}
    return subprocess.run([config.python, "-c", boot_source()], input=json.dumps(doc), capture_output=True,
                          text=True, env=env, timeout=60)


def seen(tmp: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp / "obs.jsonl").read_text().splitlines()]


def test_pyautogui_code_runs_in_the_guest_behind_osworlds_prefix_then_done_ends_it(
        machine: tuple[str, Machine], tmp_path: Path) -> None:
    url, m = machine
    code = "pyautogui.click(10, 20)\npyautogui.write('hi')"
    proc = run_loop(url, tmp_path, {"actions": [[code, "WAIT"], ["DONE"]]})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""  # DONE answers nothing; the agent's own print went to stderr
    assert "this goes to stderr" in proc.stderr
    execs = [c[2] for c in m.calls if c[1] == "/m/exec"]
    assert len(execs) == 1
    assert execs[0]["env"] == {"GH_OSWORLD_CODE": PYAUTOGUI_PREFIX + code}
    assert execs[0]["script"] == 'exec python3 -c "$GH_OSWORLD_CODE"'
    assert execs[0]["note"] == {"step": 1, "text": "step 1", "action": code}
    obs = seen(tmp_path)
    assert len(obs) == 2  # the first look, and the look after step 1's actions
    assert obs[0] == {"png": True, "png_bytes": len(PNG), "accessibility_tree": None, "terminal": None,
                      "instruction": "Open the menu", "arg": "Open the menu", "resets": ["Logger"]}
    assert [c[1] for c in m.calls if c[0] == "GET"] == ["/m/screen", "/m/screen"]  # no tree asked for


def test_fail_is_the_infeasible_answer(machine: tuple[str, Machine], tmp_path: Path) -> None:
    url, m = machine
    proc = run_loop(url, tmp_path, {"actions": [["FAIL"]], "reset": "none"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "infeasible"
    assert seen(tmp_path)[0]["resets"] == ["bare"]  # reset() without arguments, for an agent that takes none
    assert not [c for c in m.calls if c[0] == "POST"]


def test_the_accessibility_tree_is_read_from_the_machine_for_a11y_observations(
        machine: tuple[str, Machine], tmp_path: Path) -> None:
    url, m = machine
    proc = run_loop(url, tmp_path, {"actions": [["DONE"]]}, observation="screenshot_a11y_tree")
    assert proc.returncode == 0, proc.stderr
    obs = seen(tmp_path)[0]
    assert obs["accessibility_tree"] == TREE and obs["png"]
    m.accessibility = False  # an image without a desktop refuses: the agent sees None, and stderr says why
    (tmp_path / "obs.jsonl").unlink()
    proc = run_loop(url, tmp_path, {"actions": [["DONE"]]}, observation="a11y_tree")
    assert proc.returncode == 0, proc.stderr
    assert seen(tmp_path)[0]["accessibility_tree"] is None
    assert "no accessibility tree" in proc.stderr


def test_computer_13_actions_become_input_events(machine: tuple[str, Machine], tmp_path: Path) -> None:
    url, m = machine
    actions = [{"action_type": "MOVE_TO", "parameters": {"x": 5, "y": 6}},
               {"action_type": "CLICK", "parameters": {"button": "right"}},
               {"action_type": "CLICK", "parameters": {"x": 1, "y": 1, "num_clicks": 2}},
               {"action_type": "SCROLL", "parameters": {"dx": 0, "dy": 3}},
               {"action_type": "KEY_DOWN", "parameters": {"key": "ctrl"}},
               {"action_type": "PRESS", "parameters": {"key": "c"}},
               {"action_type": "KEY_UP", "parameters": {"key": "ctrl"}},
               {"action_type": "TYPING", "parameters": {"text": "hello"}},
               {"action_type": "HOTKEY", "parameters": {"keys": ["alt", "tab"]}},
               {"action_type": "DRAG_TO", "parameters": {"x": 9, "y": 9}},
               {"action_type": "WAIT"}, {"action_type": "DONE"}]
    proc = run_loop(url, tmp_path, {"actions": [actions]}, action_space="computer_13")
    assert proc.returncode == 0, proc.stderr
    sent = [e for c in m.calls if c[1] == "/m/input" for e in c[2]["events"]]
    assert sent == [
        {"type": "move", "x": 5, "y": 6},
        {"type": "click", "x": 5, "y": 6, "button": "right"},  # where the pointer is, as pyautogui clicks
        {"type": "double_click", "x": 1, "y": 1, "button": "left"},
        {"type": "scroll", "x": 1, "y": 1, "dy": -3, "dx": 0},  # pyautogui's up is our negative dy
        {"type": "key", "keys": ["ctrl", "c"]},
        {"type": "type", "text": "hello"},
        {"type": "key", "keys": ["alt", "tab"]},
        {"type": "mouse_down", "x": 1, "y": 1, "button": "left"}, {"type": "move", "x": 9, "y": 9},
        {"type": "mouse_up", "x": 9, "y": 9, "button": "left"},
    ]
    assert not [c for c in m.calls if c[1] == "/m/exec"]


def test_max_steps_counts_predictions_and_the_cases_step_limit_lowers_it(
        machine: tuple[str, Machine], tmp_path: Path) -> None:
    url, m = machine
    proc = run_loop(url, tmp_path, {"actions": [["pyautogui.press('a')"]]}, steps=3, max_steps=5)
    assert proc.returncode == 0, proc.stderr
    assert len([c for c in m.calls if c[1] == "/m/exec"]) == 3
    assert len(seen(tmp_path)) == 3
    (tmp_path / "obs.jsonl").unlink()
    m.calls.clear()
    proc = run_loop(url, tmp_path, {"actions": [["pyautogui.press('a')"]]}, max_steps=2)
    assert len([c for c in m.calls if c[1] == "/m/exec"]) == 2 and proc.stdout == ""


def test_a_task_ended_by_the_machine_api_ends_the_loop_quietly(machine: tuple[str, Machine], tmp_path: Path) -> None:
    url, m = machine
    m.stop_after = 1
    proc = run_loop(url, tmp_path, {"actions": [["pyautogui.press('a')"]]}, max_steps=10)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and "the task ended" in proc.stderr
    assert len([c for c in m.calls if c[1] == "/m/exec"]) == 2  # the second was refused: no more asked
