"""A recorded replay, as gh_server/replays.py `replay_data` hands it out, of a model agent's assisted try:
a phase's screen, a look with the model's words, a click, a secret typed (redacted by the runner, every later
frame masked), an exec, the last screen; tokens and cost on `metrics.model`, each model call's too; a takeover.
Its frames are small PNGs made here with pillow, each a different colour so a test can tell which file is which
frame."""

from __future__ import annotations

import io
from typing import Any

from PIL import Image

SECRET_SHOWN = "•••"
COLOURS = {0: (200, 0, 0), 1: (0, 200, 0), 2: (0, 0, 200), 3: (200, 200, 0), 4: (0, 200, 200), 5: (90, 90, 90)}
T0 = "2026-12-05T10:00:00Z"


def png(seq: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (32, 20), COLOURS[seq]).save(buf, "PNG")
    return buf.getvalue()


def _at(s: int) -> str:
    return f"2026-12-05T10:00:{s:02d}Z"


# The model agent's account (gh_server/agents/model/usage.py): its totals, and each of its three calls'
# own (the n-th call made the frames whose note says step n), summing to the totals.
MODEL_TOTALS = {"api": "anthropic", "model": "claude-x", "coordinates": "pixels", "steps": 3, "invalid": 0,
                "tokens_in": 1200, "tokens_out": 80, "tokens_cached": 400, "cost_cents": 3, "cost_cents_exact": 2.5}
CALLS = [{"tokens_in": 300, "tokens_out": 30, "tokens_cached": 0, "cost_cents_exact": 0.8},
         {"tokens_in": 400, "tokens_out": 20, "tokens_cached": 100, "cost_cents_exact": 0.7},
         {"tokens_in": 500, "tokens_out": 30, "tokens_cached": 300, "cost_cents_exact": 1.0}]


def replay(**over: Any) -> dict[str, Any]:
    model_note = {"agent": "model", "step": 1}
    frames = [
        {"seq": 0, "at": _at(1), "t": 1.0, "label": "first_screen", "event": None},
        {"seq": 1, "at": _at(3), "t": 3.0, "label": "screen",
         "event": {"type": "screen", "note": {**model_note, "seen_by_model": True, "text": "I see the desktop."}}},
        {"seq": 2, "at": _at(5), "t": 5.0, "label": "input",
         "event": {"type": "click", "x": 10, "y": 12, "button": "left",
                   "note": {**model_note, "action": {"type": "click", "x": 10, "y": 12, "button": "left"},
                            "text": "Clicking the terminal."}}},
        {"seq": 3, "at": _at(7), "t": 7.0, "label": "input",
         "event": {"type": "type", "text": SECRET_SHOWN, "masked": True,
                   "note": {"agent": "model", "step": 2, "action": {"type": "type", "text": SECRET_SHOWN}}}},
        {"seq": 4, "at": _at(9), "t": 9.0, "label": "exec",
         "event": {"type": "exec", "script": "ls /tmp", "exit_code": 0, "timed_out": False,
                   "stdout_tail": "a\nb\n", "stderr_tail": "",
                   "note": {"agent": "model", "step": 3, "action": {"type": "exec", "script": "ls /tmp"}}}},
        {"seq": 5, "at": _at(12), "t": 12.0, "label": "last_screen", "event": None},
    ]
    data: dict[str, Any] = {
        "attempt_id": "at_rec1", "test_run_id": "tr_rec", "run_url": None, "key": "fix-tmp",
        "name": "Fix /tmp", "prompt": "Please fix my /tmp.", "agent_id": "claude-cu", "try": 1,
        "retry_of": None, "is_last": True, "category": "os", "tags": ["osworld", "os"],
        "status": "done", "outcome": "passed", "score": 1.0, "checkpoints": None,
        "error": None, "check": {"before": "False", "after": "True", "passed": True},
        "answer": "Fixed it.",
        "metrics": {"cost_cents": 3, "model": {**MODEL_TOTALS, "calls": CALLS}},
        "phases": [], "machine": None, "assisted": True,
        "takeovers": [{"by": "alice", "started_at": _at(8), "ended_at": _at(10), "ended_by": "handed_back",
                       "counts": {"keys": 1, "clicks": 0, "typed": 0}, "events": [], "events_dropped": 0}],
        "started_at": T0, "finished_at": _at(13), "frames": frames,
    }
    data.update(over)
    return data
