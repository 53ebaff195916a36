"""The converters (gh_server/trajectories.py) over a recorded replay: ATIF as Harbor's schema reads it, and
OSWorld's result layout as its show_result.py reads it (its documented behaviour, written out below)."""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from gh_server import trajectories as traj

from . import recorded
from .atif_check import atif_errors


def _files(fmt: traj.ExportFormat, *replays: dict[str, Any]) -> dict[str, bytes]:
    return dict(traj.export_files(fmt, [(r, recorded.png) for r in replays]))


def _colour(png: bytes) -> tuple[int, ...]:
    with Image.open(io.BytesIO(png)) as im:
        return tuple(im.convert("RGB").getpixel((0, 0)))


def test_atif_trajectory_is_valid_by_harbors_schema_and_carries_the_replay() -> None:
    files = _files(traj.ExportFormat.ATIF, recorded.replay())
    t = json.loads(files["at_rec1/trajectory.json"])
    shots = {k.removeprefix("at_rec1/"): v for k, v in files.items() if k.endswith(".png")}
    assert atif_errors(t, shots) == []
    assert t["schema_version"] == "ATIF-v1.7"
    assert t["agent"] == {"name": "claude-cu", "version": "gh-runner", "model_name": "claude-x",
                          "extra": {"api": "anthropic", "coordinates": "pixels"}}
    steps = t["steps"]
    assert steps[0] == {"step_id": 1, "timestamp": recorded.T0, "source": "user", "message": "Please fix my /tmp."}
    # Every frame is a step, its screenshot the file of that frame.
    assert [s["source"] for s in steps] == ["user", "system", "agent", "agent", "agent", "agent", "system", "agent"]
    for s in steps[1:7]:
        path = s["observation"]["results"][-1]["content"][-1]["source"]["path"]
        assert _colour(shots[path]) == recorded.COLOURS[s["extra"]["seq"]]
    click = steps[3]
    assert click["message"] == "Clicking the terminal."
    assert click["tool_calls"] == [{"tool_call_id": "call_2", "function_name": "click",
                                    "arguments": {"x": 10, "y": 12, "button": "left",
                                                  "action": {"type": "click", "x": 10, "y": 12, "button": "left"}}}]
    assert click["observation"]["results"][0]["source_call_id"] == "call_2"
    assert steps[2]["message"] == "I see the desktop." and "tool_calls" not in steps[2]
    # What the replay redacted stays redacted: the typed secret is the replay's •••, and nothing else shows.
    assert steps[4]["tool_calls"][0]["arguments"]["text"] == recorded.SECRET_SHOWN
    exec_out = json.loads(steps[5]["observation"]["results"][0]["content"][0]["text"])
    assert exec_out == {"exit_code": 0, "timed_out": False, "stdout_tail": "a\nb\n", "stderr_tail": ""}
    assert steps[-1] == {"step_id": 8, "timestamp": "2026-12-05T10:00:13Z", "source": "agent",
                         "message": "Fixed it.", "extra": {"final_answer": True}}
    # Each model call's tokens on the step of its first frame (the note's step n: the n-th call); a later
    # action of the same reply made no call; the totals are the steps' sums, equal to the account's.
    assert [(s.get("llm_call_count"), s.get("metrics")) for s in steps[2:6]] == [
        (1, {"prompt_tokens": 300, "completion_tokens": 30, "cached_tokens": 0, "cost_usd": 0.008}),
        (0, None),
        (1, {"prompt_tokens": 400, "completion_tokens": 20, "cached_tokens": 100, "cost_usd": 0.007}),
        (1, {"prompt_tokens": 500, "completion_tokens": 30, "cached_tokens": 300, "cost_usd": 0.01})]
    assert [s["extra"].get("model_calls") for s in steps[2:6]] == [[1], None, [2], [3]]
    assert all("metrics" not in s and "llm_call_count" not in s for s in steps if s["source"] != "agent")
    assert t["final_metrics"] == {"total_prompt_tokens": 1200, "total_completion_tokens": 80,
                                  "total_cached_tokens": 400, "total_cost_usd": 0.025, "total_steps": 8,
                                  "extra": {"model_turns": 3, "invalid_turns": 0, "cost_cents": 3}}
    gh = t["extra"]["gh"]
    assert (gh["outcome"], gh["score"], gh["assisted"], gh["takeovers"][0]["by"]) == ("passed", 1.0, True, "alice")
    assert "assisted" in t["notes"]


def test_a_takeover_is_the_systems_step_never_the_agents() -> None:
    frames = [{"seq": 0, "at": "2026-12-05T10:00:08Z", "t": 8.0, "label": "takeover", "event": {"human": "takeover"}},
              {"seq": 1, "at": "2026-12-05T10:00:10Z", "t": 10.0, "label": "handback", "event": {"human": "handback"}}]
    t = traj.atif_trajectory(recorded.replay(frames=frames, answer=None, metrics=None))
    assert atif_errors(t) == []
    assert [(s["source"], s["message"], s["extra"]["human"]) for s in t["steps"][1:]] == [
        ("system", "a person took the machine over", "takeover"),
        ("system", "the person handed the machine back", "handback")]


def _final_sums(t: dict[str, Any]) -> dict[str, Any]:
    """The trajectory's token and cost totals, summed from its steps."""
    ms = [s["metrics"] for s in t["steps"] if "metrics" in s]
    return {"total_prompt_tokens": sum(m["prompt_tokens"] for m in ms),
            "total_completion_tokens": sum(m["completion_tokens"] for m in ms),
            "total_cached_tokens": sum(m["cached_tokens"] for m in ms),
            "total_cost_usd": round(sum(m["cost_usd"] for m in ms), 8)}


def test_a_model_call_without_a_frame_of_its_own_is_counted_on_the_last_step() -> None:
    """The reply that answers acts on nothing, so no frame is its: it goes on the answer's step; without an
    answer, on an agent step of its own. Every call once: the totals stay the sum of the steps."""
    calls = [*recorded.CALLS, {"tokens_in": 900, "tokens_out": 9, "tokens_cached": 800, "cost_cents_exact": 0.2}]
    metrics = {"model": {**recorded.MODEL_TOTALS, "calls": calls}}
    t = traj.atif_trajectory(recorded.replay(metrics=metrics))
    assert atif_errors(t) == []
    answer = t["steps"][-1]
    assert (answer["message"], answer["llm_call_count"], answer["extra"]["model_calls"]) == ("Fixed it.", 1, [4])
    assert answer["metrics"] == {"prompt_tokens": 900, "completion_tokens": 9, "cached_tokens": 800, "cost_usd": 0.002}
    assert {k: t["final_metrics"][k] for k in _final_sums(t)} == _final_sums(t) == {
        "total_prompt_tokens": 2100, "total_completion_tokens": 89, "total_cached_tokens": 1200,
        "total_cost_usd": 0.027}

    t = traj.atif_trajectory(recorded.replay(metrics=metrics, answer=None, frames=recorded.replay()["frames"][:3]))
    assert atif_errors(t) == []
    added = t["steps"][-1]
    assert (added["source"], added["message"], added["llm_call_count"]) == ("agent", "", 3)
    assert added["extra"] == {"calls_without_frame": True, "model_calls": [2, 3, 4]}
    assert added["metrics"]["prompt_tokens"] == 1800 and t["final_metrics"]["total_prompt_tokens"] == 2100


def test_an_attempt_without_each_calls_usage_exports_no_step_metrics() -> None:
    """A replay recorded before calls were kept (or another kind of agent's) has its totals only: no step says
    what it spent, and none is made up; a call whose reply gave no usage is not a 0 either."""
    t = traj.atif_trajectory(recorded.replay(metrics={"cost_cents": 3, "model": recorded.MODEL_TOTALS}))
    assert atif_errors(t) == []
    assert not any("metrics" in s or "llm_call_count" in s for s in t["steps"])
    assert t["final_metrics"]["total_prompt_tokens"] == 1200 and t["final_metrics"]["total_cost_usd"] == 0.025

    t = traj.atif_trajectory(recorded.replay(metrics={"model": {**recorded.MODEL_TOTALS, "calls": [None] * 3}}))
    assert atif_errors(t) == []
    assert [s.get("llm_call_count") for s in t["steps"][2:6]] == [1, 0, 1, 1]
    assert not any("metrics" in s for s in t["steps"])
    assert "total_prompt_tokens" not in t["final_metrics"] and "total_cost_usd" not in t["final_metrics"]

    unpriced = [{**c, "cost_cents_exact": None} for c in recorded.CALLS[:2]]
    t = traj.atif_trajectory(recorded.replay(metrics={"model": {**recorded.MODEL_TOTALS, "calls": [*unpriced, None]}}))
    assert atif_errors(t) == []
    assert t["steps"][2]["metrics"] == {"prompt_tokens": 300, "completion_tokens": 30, "cached_tokens": 0}
    assert "metrics" not in t["steps"][5] and t["steps"][5]["llm_call_count"] == 1
    assert t["final_metrics"]["total_prompt_tokens"] == 700 and "total_cost_usd" not in t["final_metrics"]


def test_atif_check_catches_what_harbor_refuses() -> None:
    """The check is not a formality: each rule it holds fails a trajectory that breaks it."""
    good = json.loads(_files(traj.ExportFormat.ATIF, recorded.replay())["at_rec1/trajectory.json"])
    bad = json.loads(json.dumps(good))
    bad["steps"][2]["step_id"] = 9
    bad["steps"][1]["tool_calls"] = []
    bad["steps"][3]["observation"]["results"][0]["source_call_id"] = "call_nope"
    bad["steps"][0]["surprise"] = 1
    bad["steps"][3]["metrics"] = {"prompt_tokens": 1}  # the click after the look: llm_call_count 0
    del bad["agent"]["version"]
    errors = atif_errors(bad, {})
    for needle in ("step_id is 9", "tool_calls on a system step", "call_nope", "surprise", "version",
                   "which is not a file", "metrics on a step with llm_call_count 0"):
        assert any(needle in e for e in errors), (needle, errors)


def _show_result(results: Path, action_space: str, model: str, observation: str) -> dict[str, dict[str, float]]:
    """OSWorld's show_result.py `get_result`, as it is documented to read a layout: every
    `{action_space}/{observation_type}/{model}/{domain}/{example_id}/` that holds a `result.txt` is one run
    example, its score `float` of that file; the others are not counted."""
    target = results / action_space / observation / model
    out: dict[str, dict[str, float]] = {}
    for domain in sorted(os.listdir(target)):
        for example in sorted(os.listdir(target / domain)):
            if "result.txt" in os.listdir(target / domain / example):
                out.setdefault(domain, {})[example] = float((target / domain / example / "result.txt").read_text())
    return out


def test_osworld_layout_reads_as_show_result_reads_it(tmp_path: Path) -> None:
    base = {"assisted": False, "takeovers": None}
    runs = [
        recorded.replay(**base, score=0.75, outcome="failed"),
        recorded.replay(**base, attempt_id="at_rec2", key="other", category="chrome", score=1.0),
        # A second try is a run of its own; a retried attempt is not exported, the retry is.
        recorded.replay(**base, attempt_id="at_rec3", **{"try": 2}, score=None, outcome="failed", is_last=False),
        recorded.replay(**base, attempt_id="at_rec4", **{"try": 2}, score=None, outcome="failed"),
        # Ours (an error) and a person's (assisted) are never the agent's score: no result.txt.
        recorded.replay(**base, attempt_id="at_rec5", key="broke", outcome="error", score=None),
        recorded.replay(attempt_id="at_rec6", key="helped", score=1.0),
    ]
    traj.write_files(traj.export_files(traj.ExportFormat.OSWORLD, [(r, recorded.png) for r in runs]), tmp_path)
    assert _show_result(tmp_path, "gh_machine_api", "claude-cu", "screenshot") == {
        "chrome": {"other": 1.0}, "os": {"fix-tmp": 0.75}}
    assert _show_result(tmp_path, "gh_machine_api", "claude-cu-try2", "screenshot") == {"os": {"fix-tmp": 0.0}}
    task = tmp_path / "gh_machine_api/screenshot/claude-cu/os/fix-tmp"
    lines = [json.loads(x) for x in (task / "traj.jsonl").read_text().splitlines()]
    # One line per action (click, type, exec), with OSWorld's keys, its screenshot beside it.
    assert [list(x) for x in lines] == [["step_num", "action_timestamp", "action", "response", "reward", "done",
                                         "info", "screenshot_file"]] * 3
    assert [x["step_num"] for x in lines] == [1, 2, 3]
    assert [x["action_timestamp"] for x in lines] == ["20261205@100005", "20261205@100007", "20261205@100009"]
    assert [x["action"]["action_type"] for x in lines] == ["click", "type", "exec"]
    assert [x["done"] for x in lines] == [False, False, True]
    assert lines[0]["response"] == "Clicking the terminal." and lines[1]["action"]["text"] == recorded.SECRET_SHOWN
    for line, seq in zip(lines, (2, 3, 4), strict=True):
        assert line["screenshot_file"] == f"step_{line['step_num']}_{line['action_timestamp']}.png"
        assert _colour((task / line["screenshot_file"]).read_bytes()) == recorded.COLOURS[seq]
    helped = tmp_path / "gh_machine_api/screenshot/claude-cu/os/helped"
    assert not (helped / "result.txt").exists()
    said = json.loads((helped / "gh_attempt.json").read_text())
    assert (said["assisted"], said["score"], said["takeovers"][0]["by"]) == (True, 1.0, "alice")
    assert not (tmp_path / "gh_machine_api/screenshot/claude-cu/os/broke/result.txt").exists()
    assert json.loads((tmp_path / "gh_machine_api/screenshot/claude-cu-try2/os/fix-tmp/gh_attempt.json")
                      .read_text())["attempt_id"] == "at_rec4"


def test_the_tar_stream_leaves_a_file_at_a_time_and_unpacks_whole() -> None:
    files = [(f"d/{i}.bin", os.urandom(200_000)) for i in range(4)]  # incompressible: each file shows in the stream
    pulled: list[str] = []

    def lazily() -> Iterator[tuple[str, bytes]]:
        for name, data in files:
            pulled.append(name)
            yield name, data

    stream = traj.targz_chunks(lazily(), "root")
    chunks = [next(stream)]
    assert pulled == ["d/0.bin"]  # the first bytes leave before the second file is even read
    chunks += list(stream)
    assert len(chunks) >= len(files)
    assert max(len(c) for c in chunks) < 2 * 200_000
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r:gz") as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
    assert got == {f"root/{n}": d for n, d in files}


def test_a_name_that_would_leave_the_output_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="outside"):
        traj.write_files([("../escape.txt", b"x")], tmp_path / "out")
    assert not (tmp_path / "escape.txt").exists()


def test_an_osworld_agents_pyautogui_code_is_its_steps_action() -> None:
    """An OSWorld agent's exec runs its code from the environment (gh_server/agents/osworld/loop.py): the code
    itself, the note's `action`, is what the step says the agent did, in ATIF and in OSWorld's traj.jsonl."""
    code = "pyautogui.press('enter')"
    frames = [{"seq": 0, "at": "2026-12-05T10:00:08Z", "t": 8.0, "label": "exec",
               "event": {"type": "exec", "script": 'exec python3 -c "$GH_OSWORLD_CODE"', "exit_code": 0,
                         "note": {"step": 1, "text": "pressing enter", "action": code}}}]
    replay = recorded.replay(frames=frames, answer=None, metrics=None)
    t = traj.atif_trajectory(replay)
    assert atif_errors(t) == []
    [call] = t["steps"][1]["tool_calls"]
    assert call["function_name"] == "exec" and call["arguments"]["action"] == code, call
    [traj_jsonl] = [v for k, v in _files(traj.ExportFormat.OSWORLD, replay).items() if k.endswith("traj.jsonl")]
    assert json.loads(traj_jsonl.decode().splitlines()[0])["action"]["action"] == code
