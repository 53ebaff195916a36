"""OSWorld's loop, played in the agent's own process against the machine API (docs/agents.md, "osworld").

Started by gh_server/agents/osworld/agent.py as a command agent (its sandbox, its uid): the request
document on stdin, GH_OSWORLD_CONFIG (JSON: agent, python_path, observation, action_space, max_steps,
sleep_after_execution) in the environment. It imports `module:factory` with `python_path` first on
sys.path, calls the factory with no arguments, and then, as OSWorld's lib_run_single.py does:
`agent.reset(logger)` (or `agent.reset()` when it takes nothing), then `response, actions =
agent.predict(instruction, obs)` until an action ends the task or `max_steps` predictions were made
(`limits.steps` when lower). Each action, as OSWorld's DesktopEnv.step reads it:
- `WAIT` (or `{"action_type": "WAIT"}`): nothing, then the pause;
- `DONE`: the task ends, answer empty; `FAIL`: the task ends, answer `infeasible` (the infeasible answer
  gh_local/osworld/check.py scores);
- a string: pyautogui code, run by the guest's python3 as the signed-in user behind OSWorld's prefix;
- a dict (action_space computer_13): input events through the hypervisor (computer13.py).
After each action it pauses `sleep_after_execution` seconds (OSWorld's `pause`). `obs` is `screenshot`
(PNG bytes), `accessibility_tree` (XML text; None unless the observation asks for it or when the machine
refuses it), `terminal` (always None: our machines have no OSWorld terminal server) and `instruction`.

Its stdout is the answer alone: the agent's own prints go to stderr. Standard library only.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

if __name__ == "__main__":  # started by agent.py: `computer13` is given as a module of that name
    import computer13  # type: ignore[import-not-found,no-redef]
else:
    from gh_server.agents.osworld import computer13

PYAUTOGUI_PREFIX = "import pyautogui; import time; pyautogui.FAILSAFE = False; "  # OSWorld's, before each code
INFEASIBLE = "infeasible"
SCREEN_TIMEOUT_S = 60.0
ACCESSIBILITY_TIMEOUT_S = 150.0  # the runner's own bound on a read (120 s) and the way there
EXEC_TIMEOUT_S = 90.0
INPUT_TIMEOUT_S = 90.0
TEXT_NOTE_MAX = 8000
ACTION_NOTE_MAX = 2000


class Stopped(Exception):
    """The machine API said the task is over (its time or step limit, or the token ended): stop quietly."""


class MachineApi:
    """The attempt's machine over HTTP (docs/agents.md, "Machine API")."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self.token = token

    def _call(self, method: str, path: str, body: Any, timeout: float) -> tuple[bytes, str]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {self.token}",
                                              **({"Content-Type": "application/json"} if data else {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.read(), resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            detail = e.read()[:500].decode(errors="replace")
            if e.code in (401, 409):
                raise Stopped(f"{method} {path}: {e.code} {detail}") from None
            raise RuntimeError(f"{method} {path}: HTTP {e.code} {detail}") from None

    def screenshot(self) -> bytes:
        return self._call("GET", "/screen", None, SCREEN_TIMEOUT_S)[0]

    def accessibility_tree(self) -> str | None:
        """The desktop's accessibility tree as XML: the one place it is read. None when the machine
        refuses it (an image without a desktop), told on stderr; the agent sees what OSWorld gives then. A
        task that ended is seen by the next screen or action, which stop the loop."""
        try:
            body, ctype = self._call("GET", "/accessibility", None, ACCESSIBILITY_TIMEOUT_S)
        except (RuntimeError, Stopped) as e:
            print(f"osworld: no accessibility tree: {e}", file=sys.stderr)
            return None
        if "xml" not in ctype:
            print(f"osworld: no accessibility tree: the machine sent {ctype or 'no type'}", file=sys.stderr)
            return None
        return body.decode("utf-8", errors="replace")

    def exec(self, script: str, env: dict[str, str], note: dict[str, Any]) -> dict[str, Any]:
        body = {"script": script, "env": env, "timeout": EXEC_TIMEOUT_S - 30.0, "note": note}
        out: dict[str, Any] = json.loads(self._call("POST", "/exec", body, EXEC_TIMEOUT_S)[0])
        return out

    def input(self, events: list[dict[str, Any]], note: dict[str, Any]) -> None:
        self._call("POST", "/input", {"events": events, "note": note}, INPUT_TIMEOUT_S)


def load_agent(spec: str, python_path: list[str]) -> Any:
    for p in reversed(python_path):
        sys.path.insert(0, p)
    module, _, factory = spec.partition(":")
    return getattr(importlib.import_module(module), factory)()


def reset(agent: Any, logger: logging.Logger) -> None:
    """OSWorld passes its runtime logger (`agent.reset(runtime_logger)`); older agents take nothing."""
    try:
        params = [p for p in inspect.signature(agent.reset).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    except (TypeError, ValueError):
        params = []
    if params:
        agent.reset(logger)
    else:
        agent.reset()


def pyautogui_script(code: str) -> tuple[str, dict[str, str]]:
    """The guest script for one pyautogui action: OSWorld's prefix and the code, as `python3 -c`. The code
    goes in through the environment, so no quoting of it can break the shell line."""
    return 'exec python3 -c "$GH_OSWORLD_CODE"', {"GH_OSWORLD_CODE": PYAUTOGUI_PREFIX + code}


def png_size(png: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR (the first chunk, at a fixed offset)."""
    if len(png) < 24 or png[:8] != b"\x89PNG\r\n\x1a\n":
        return 0, 0
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def _end_of(action: Any) -> str | None:
    if isinstance(action, str) and action.strip() in computer13.ENDS:
        return action.strip()
    if isinstance(action, dict) and action.get("action_type") in computer13.ENDS:
        return str(action["action_type"])
    return None


def play(agent: Any, api: MachineApi, instruction: str, config: dict[str, Any], steps_limit: int | None,
         logger: logging.Logger) -> str:
    """OSWorld's loop; returns the answer ("" unless the agent said FAIL)."""
    observation = config.get("observation", "screenshot")
    space = config.get("action_space", "pyautogui")
    pause = float(config.get("sleep_after_execution", 0.0))
    max_steps = int(config.get("max_steps", 15))
    if steps_limit:
        max_steps = min(max_steps, steps_limit)
    pointer: computer13.Pointer | None = None

    def observe() -> dict[str, Any]:
        return {
            "screenshot": api.screenshot(),
            "accessibility_tree": api.accessibility_tree() if observation != "screenshot" else None,
            "terminal": None,
            "instruction": instruction,
        }

    reset(agent, logger)
    obs = observe()
    for step in range(1, max_steps + 1):
        response, actions = agent.predict(instruction, obs)
        for action in actions or []:
            note = {"step": step, "text": str(response or "")[:TEXT_NOTE_MAX],
                    "action": (action if isinstance(action, str) else json.dumps(action))[:ACTION_NOTE_MAX]}
            end = _end_of(action)
            if end == "FAIL":
                return INFEASIBLE
            if end == "DONE":
                return ""
            if end is None and isinstance(action, str) and space == "pyautogui":
                script, env = pyautogui_script(action)
                res = api.exec(script, env, note)
                if res.get("exit_code") != 0:  # OSWorld logs it and goes on; so do we
                    print(f"osworld: step {step}: the pyautogui code exited {res.get('exit_code')}: "
                          f"{str(res.get('stderr', ''))[-500:]}", file=sys.stderr)
            elif end is None and isinstance(action, dict) and space == "computer_13":
                if pointer is None:
                    w, h = png_size(obs["screenshot"])
                    pointer = computer13.Pointer(w // 2, h // 2)
                try:
                    events = computer13.events(action, pointer)
                except computer13.BadAction as e:
                    print(f"osworld: step {step}: {e}", file=sys.stderr)
                    events = []
                if events:
                    api.input(events, note)
            elif end is None:
                print(f"osworld: step {step}: {type(action).__name__} is not an action of {space}",
                      file=sys.stderr)
            time.sleep(pause)  # OSWorld's pause after every action, WAIT's included
        obs = observe()
    return ""


def main() -> int:
    doc = json.loads(sys.stdin.read())
    config = json.loads(os.environ["GH_OSWORLD_CONFIG"])
    answer_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # what the agent prints is not its answer
    sys.stdout = sys.stderr
    logging.basicConfig(stream=sys.stderr, level=logging.INFO)
    logger = logging.getLogger("desktopenv.experiment")
    api = MachineApi(doc["machine"]["url"], doc["machine"]["token"])
    agent = load_agent(config["agent"], list(config.get("python_path") or []))
    try:
        answer = play(agent, api, str(doc.get("prompt", "")), config, (doc.get("limits") or {}).get("steps"), logger)
    except Stopped as e:
        print(f"osworld: the task ended: {e}", file=sys.stderr)
        answer = ""
    answer_out.write(answer)
    answer_out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
