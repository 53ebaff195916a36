"""A small agent of the tests' own, written to OSWorld's interface (reset, predict(instruction, obs)).

`make()` builds it from GH_TEST_OSWORLD_PLAN (JSON: {"actions": [[...], ...], "reset": "logger"|"none",
"record": PATH}): each predict() returns the next list of actions (the last one again when the plan runs
out) and the words "step N". With `record`, each observation is appended to that file as JSON (the PNG's
size and first bytes, the tree, terminal, instruction). Standard library only: it runs in the sandbox.
"""

from __future__ import annotations

import json
import os
from typing import Any


class _Agent:
    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.step = 0
        self.resets: list[str] = []

    def predict(self, instruction: str, obs: dict[str, Any]) -> tuple[str, list[Any]]:
        print("this goes to stderr, not into the answer")
        if self.plan.get("record"):
            shot = obs["screenshot"]
            with open(self.plan["record"], "a") as f:
                f.write(json.dumps({
                    "png": isinstance(shot, bytes) and shot[:8] == b"\x89PNG\r\n\x1a\n", "png_bytes": len(shot),
                    "accessibility_tree": obs["accessibility_tree"], "terminal": obs["terminal"],
                    "instruction": obs["instruction"], "arg": instruction, "resets": self.resets}) + "\n")
        actions = self.plan["actions"]
        got = actions[min(self.step, len(actions) - 1)]
        self.step += 1
        return f"step {self.step}", got


class _LoggerReset(_Agent):
    def reset(self, _logger: Any = None) -> None:  # PromptAgent's signature
        self.resets.append(type(_logger).__name__)


class _BareReset(_Agent):
    def reset(self) -> None:
        self.resets.append("bare")


def make() -> _Agent:
    plan = json.loads(os.environ["GH_TEST_OSWORLD_PLAN"])
    return (_BareReset if plan.get("reset") == "none" else _LoggerReset)(plan)
