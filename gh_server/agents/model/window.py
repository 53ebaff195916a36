"""Which turns of a long try the model still sees whole: the last `keep_turns`, the older ones as one
line each of what the model said and did.

A try of OSWorld 2.0 runs up to 500 steps. Screenshots are already bounded (`keep_screens`), but
every turn also leaves its words, its calls and their results in the context: at step 500 that was
549 KiB of request for a click and a key a step, and 1.3 MiB with 2 KB of shell output a step, past
a model's context (bench/agent_request_size.py; 214 and 303 KiB with this window). So once a
conversation holds `keep_turns + CONDENSE_EVERY` turns, its oldest turns are cut down to
`keep_turns`: whole turns (a call and the results that answer it, so every tool call keeps its
result), each leaving one line in a note of earlier turns, the newest NOTE_LINES of them, that sits
in the first user message after the prompt.

Cutting in steps of CONDENSE_EVERY turns, not one turn a step, keeps the request's prefix the same
for CONDENSE_EVERY - 1 calls in a row, which is what a provider's prompt cache needs.

Each API module (anthropic_api.py, chat_api.py, responses_api.py) owns its shapes: it marks where each
turn starts in its history (`begin_turn`), asks `cut` for the span to drop, and writes `note()` where
its first user message keeps text.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gh_server.agents.model import actions as A

CONDENSE_EVERY = 25  # turns beyond keep_turns before the oldest are condensed
NOTE_LINES = 200  # condensed turns the note keeps (the newest): at most ~40 KB of text
LINE_CHARS = 200  # one condensed turn: what the model said, then its calls
NOTE_HEAD = "Earlier turns of this task, condensed ({n} of them; each: step. what you said | what you did):"


def describe_call(call: Any) -> str:
    """One call of a turn in a few words: the tool (or action) and its arguments, whatever the API."""
    if type(call).__module__ == A.__name__:  # our own action (the chat API's text formats)
        return json.dumps(call.model_dump(exclude_none=True), separators=(",", ":"))
    if isinstance(call, dict):
        return json.dumps(call, separators=(",", ":"))
    name = getattr(call, "name", None)
    if name is not None and hasattr(call, "input"):  # Anthropic's tool_use
        return f"{name}{json.dumps(call.input, separators=(',', ':'))}"
    function = getattr(call, "function", None)
    if function is not None:  # Chat Completions' tool call
        return f"{function.name}{function.arguments}"
    actions = getattr(call, "actions", None)
    if actions is not None:  # Responses' computer_call: its batch of actions
        return "computer[" + ",".join(getattr(a, "type", "?") for a in actions) + "]"
    action = getattr(call, "action", None)
    if action is not None:  # Responses' computer_call of the preview tool: one action
        return f"computer[{getattr(action, 'type', '?')}]"
    if name is not None:  # Responses' function_call
        return f"{name}{getattr(call, 'arguments', '')}"
    return type(call).__name__


def turn_line(step: int, text: str, calls: list[Any]) -> str:
    said = " ".join(text.split())
    did = "; ".join(describe_call(c) for c in calls) or "nothing"
    line = f"{step}. {said or '(no words)'} | {did}"
    return line if len(line) <= LINE_CHARS else line[:LINE_CHARS - 1] + "…"


@dataclass
class TurnWindow:
    keep: int  # turns kept whole (ModelAgentConfig.keep_turns)
    starts: list[int] = field(default_factory=list)  # where each kept turn starts in the history
    lines: list[str] = field(default_factory=list)  # each kept turn's line, for when it is condensed
    notes: deque[str] = field(default_factory=lambda: deque(maxlen=NOTE_LINES))
    condensed: int = 0  # turns condensed so far
    steps: int = 0

    def begin_turn(self, at: int, text: str, calls: list[Any]) -> None:
        """A turn starts at index `at` of the history (the model's reply is appended there)."""
        self.steps += 1
        self.starts.append(at)
        self.lines.append(turn_line(self.steps, text, calls))

    def cut(self) -> tuple[int, int] | None:
        """The history's span [lo, hi) to drop now, or None. The caller deletes it; the turns after it
        are renumbered here."""
        if len(self.starts) <= self.keep + CONDENSE_EVERY:
            return None
        drop = len(self.starts) - self.keep
        lo, hi = self.starts[0], self.starts[drop]
        self.notes.extend(self.lines[:drop])
        self.condensed += drop
        self.starts = [s - (hi - lo) for s in self.starts[drop:]]
        self.lines = self.lines[drop:]
        return lo, hi

    def note(self) -> str:
        return "\n".join([NOTE_HEAD.format(n=self.condensed), *self.notes])
