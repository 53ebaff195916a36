"""Trajectories out: an attempt's replay in the field's formats, Harbor's ATIF and OSWorld's result layout.

The source is the replay as its page shows it (`gh_server.replays.replay_data`): already redacted (typed
secrets by the runner, gh_runner/replay.py; every string once more by the frozen case's secret facts) and
its frames already masked from the moment a secret was typed (gh_wire/masking.py, applied by the runner
before a frame leaves). Nothing here reads anything the replay does not hold, so nothing is un-redacted.

Each converter turns one attempt into files `(relative path, bytes)`, pulling one frame's PNG at a time
through `FramePng`, so an export streams (`targz_chunks`) with one screenshot in memory, whatever the run's
size. docs/agents.md ("Trajectories out") says what each field means; docs/server-api.md the endpoint.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

# Harbor's ATIF version we write: v1.6 is the first with images in a message or an observation
# (`ContentPart` with an `ImageSource` path), which our screenshots need; v1.7 the first with a step's
# `llm_call_count`, which says which steps are a model call and which the later actions of one reply.
ATIF_VERSION = "ATIF-v1.7"
AGENT_SYSTEM = "gh-runner"
# OSWorld's layout for our agents: our machine API's actions (input events, exec), seen as screenshots.
OSWORLD_ACTION_SPACE = "gh_machine_api"
OSWORLD_OBSERVATION = "screenshot"
OSWORLD_DEFAULT_DOMAIN = "default"
TIMESTAMP_FORMAT = "%Y%m%d@%H%M%S"  # OSWorld's action_timestamp (lib_run_single.py)

# The runner's frames at either end of a takeover (gh_runner/attempt.py `_mark_hold`): a person's, not the agent's.
HUMAN_SAID = {"takeover": "a person took the machine over", "handback": "the person handed the machine back"}

FramePng = Callable[[int], bytes]  # a frame's PNG by its seq


class ExportFormat(StrEnum):
    ATIF = "atif"
    OSWORLD = "osworld"


def _agent_event(frame: dict[str, Any]) -> tuple[str | None, dict[str, Any], str | None]:
    """(the action's name or None for a look, its arguments, the model's words) of a frame's event."""
    event = frame.get("event") if isinstance(frame.get("event"), dict) else {}
    assert isinstance(event, dict)
    note = event.get("note") if isinstance(event.get("note"), dict) else {}
    assert isinstance(note, dict)
    words = note.get("text") if isinstance(note.get("text"), str) and note.get("text") else None
    kind = event.get("type")
    args = {k: v for k, v in event.items() if k not in ("type", "note", "masked")}
    # The agent's own action as it chose it: a model's tool call (a dict), an OSWorld agent's pyautogui code (a
    # string: the exec's script only runs it) or computer_13 action.
    if isinstance(note.get("action"), dict | str):
        args = {**args, "action": note["action"]}
    if not isinstance(kind, str) or kind == "screen":
        return None, args, words
    return kind, args, words


def _iso_z(at: Any) -> str | None:
    return at if isinstance(at, str) and at else None


def _png_name(seq: int) -> str:
    return f"{seq:05d}.png"


def _outcome_extra(replay: dict[str, Any]) -> dict[str, Any]:
    """What the attempt came to, as our API says it (docs/server-api.md, `attempt`)."""
    keys = ("attempt_id", "test_run_id", "key", "name", "agent_id", "try", "retry_of", "is_last", "category",
            "tags", "status", "outcome", "score", "checkpoints", "check", "answer", "error", "assisted",
            "takeovers", "started_at", "finished_at")
    return {k: replay.get(k) for k in keys}


def _model(replay: dict[str, Any]) -> dict[str, Any]:
    m = (replay.get("metrics") or {}).get("model")
    return m if isinstance(m, dict) else {}


def _model_calls(model: dict[str, Any]) -> list[dict[str, Any] | None] | None:
    """Each model call's tokens and cost, in order (gh_server/agents/model/usage.py `calls`); None for an
    attempt whose account has none (another kind of agent, or one recorded before calls were kept)."""
    calls = model.get("calls")
    if not isinstance(calls, list):
        return None
    return [c if isinstance(c, dict) else None for c in calls]


def _model_call_of(frame: dict[str, Any]) -> int | None:
    """The model call whose reply made this frame's request: the built-in model agent's note `step`
    (gh_server/agents/model/loop.py), n for the n-th call; 0 is its first look, before any call. Only the
    model agent's own notes say `agent: model` (an external agent's are `external`, machine_api.py)."""
    event = frame.get("event")
    note = event.get("note") if isinstance(event, dict) else None
    if not isinstance(note, dict) or note.get("agent") != "model":
        return None
    n = note.get("step")
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def _sum(entries: list[dict[str, Any]], key: str) -> int:
    return sum(int(e.get(key) or 0) for e in entries)


def _step_metrics(entries: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """ATIF's per-step `metrics` of the model calls a step stands for: None when none of them said its usage;
    `cost_usd` only when each that did has a cost (the agent has a price)."""
    known = [e for e in entries if e is not None]
    if not known:
        return None
    metrics: dict[str, Any] = {"prompt_tokens": _sum(known, "tokens_in"),
                               "completion_tokens": _sum(known, "tokens_out"),
                               "cached_tokens": _sum(known, "tokens_cached")}
    costs = [e.get("cost_cents_exact") for e in known]
    if all(isinstance(c, int | float) for c in costs):
        metrics["cost_usd"] = round(sum(float(c or 0) for c in costs) / 100, 8)
    if len(known) < len(entries):
        metrics["extra"] = {"calls_without_usage": len(entries) - len(known)}
    return metrics


def _place_calls(steps: list[dict[str, Any]], claimed: dict[int, int], calls: list[dict[str, Any] | None],
                 at: Any) -> None:
    """Put each model call's metrics on its step: the agent step of the call's first frame (`claimed`, call
    number to step index). A call with no frame of its own (the reply that answered, or said done, with no
    action; or one whose frames the replay did not keep) goes on the last step when it is the agent's final
    answer, else on an agent step added for them: every call is counted once, so the trajectory's totals are
    the sum of its steps. The agent's other steps from a model note carry `llm_call_count: 0` (a later action
    of the same reply, or the first look)."""
    held: dict[int, list[int]] = {}
    for n, index in claimed.items():
        held.setdefault(index, []).append(n)
    unframed = [n for n in range(1, len(calls) + 1) if n not in claimed]
    if unframed:
        last = steps[-1]
        if last["source"] == "agent" and (last.get("extra") or {}).get("final_answer"):
            held.setdefault(len(steps) - 1, []).extend(unframed)
        else:
            steps.append({"step_id": len(steps) + 1, "timestamp": _iso_z(at), "source": "agent", "message": "",
                          "extra": {"calls_without_frame": True}})
            held[len(steps) - 1] = unframed
    for index, ns in held.items():
        step = steps[index]
        step["llm_call_count"] = len(ns)
        step["metrics"] = _step_metrics([calls[n - 1] for n in sorted(ns)])
        step["extra"] = {**(step.get("extra") or {}), "model_calls": sorted(ns)}


def _final_tokens(steps: list[dict[str, Any]], calls: list[dict[str, Any] | None] | None,
                  model: dict[str, Any]) -> dict[str, Any]:
    """The trajectory's totals: the sum of its steps' metrics when each call was recorded; else (an older
    attempt, another kind of agent) the account's totals as they were kept, with no step's."""
    if calls is None:
        cost = model.get("cost_cents_exact", model.get("cost_cents"))
        return {"total_prompt_tokens": model.get("tokens_in"), "total_completion_tokens": model.get("tokens_out"),
                "total_cached_tokens": model.get("tokens_cached"),
                "total_cost_usd": None if cost is None else round(float(cost) / 100, 8)}
    metrics = [s["metrics"] for s in steps if s.get("metrics")]
    if calls and not metrics:  # calls were made and none said its usage: unknown, not 0
        return {}
    costs = [m["cost_usd"] for m in metrics if "cost_usd" in m]
    return {"total_prompt_tokens": sum(m["prompt_tokens"] for m in metrics),
            "total_completion_tokens": sum(m["completion_tokens"] for m in metrics),
            "total_cached_tokens": sum(m["cached_tokens"] for m in metrics),
            "total_cost_usd": round(sum(costs), 8) if costs else None}


def atif_trajectory(replay: dict[str, Any], image_dir: str = "screenshots") -> dict[str, Any]:
    """One attempt as an ATIF trajectory; its screenshots are referenced as `{image_dir}/{seq:05d}.png`."""
    model = _model(replay)
    calls = _model_calls(model)
    claimed: dict[int, int] = {}  # a model call's number -> the index of its first frame's step
    steps: list[dict[str, Any]] = [{"step_id": 1, "timestamp": _iso_z(replay.get("started_at")), "source": "user",
                                    "message": str(replay.get("prompt") or "")}]
    for frame in replay.get("frames") or []:
        seq = int(frame["seq"])
        kind, args, words = _agent_event(frame)
        image = {"type": "image", "source": {"media_type": "image/png", "path": f"{image_dir}/{_png_name(seq)}"}}
        extra = {"seq": seq, "label": frame.get("label"), "t": frame.get("t")}
        step: dict[str, Any] = {"step_id": len(steps) + 1, "timestamp": _iso_z(frame.get("at")), "extra": extra}
        if kind is not None:  # an action: a tool call, the screen after it its observation
            call_id = f"call_{seq}"
            result: list[dict[str, Any]] = [image]
            if kind == "exec":
                out = {k: args.get(k) for k in ("exit_code", "timed_out", "stdout_tail", "stderr_tail")}
                result = [{"type": "text", "text": json.dumps(out)}, image]
            step.update(source="agent", message=words or "",
                        tool_calls=[{"tool_call_id": call_id, "function_name": kind, "arguments": args}],
                        observation={"results": [{"source_call_id": call_id, "content": result}]})
        elif words is not None or (frame.get("event") or {}).get("note"):  # a look the model asked for
            step.update(source="agent", message=words or "",
                        observation={"results": [{"content": [image]}]})
        else:  # a screen the runner kept (a phase's, a change, either end of a person's hold)
            human = (frame.get("event") or {}).get("human")
            if human:
                extra["human"] = human
            step.update(source="system", message=HUMAN_SAID.get(str(human), f"screen: {frame.get('label') or 'frame'}"),
                        observation={"results": [{"content": [image]}]})
        if model.get("model") and step["source"] == "agent":
            step["model_name"] = str(model["model"])
        n = _model_call_of(frame)
        if calls is not None and n is not None and step["source"] == "agent":
            if 1 <= n <= len(calls) and n not in claimed:
                claimed[n] = len(steps)
            else:
                step["llm_call_count"] = 0
        steps.append(step)
    if replay.get("answer"):
        steps.append({"step_id": len(steps) + 1, "timestamp": _iso_z(replay.get("finished_at")), "source": "agent",
                      "message": str(replay["answer"]), "extra": {"final_answer": True}})
    if calls is not None:
        _place_calls(steps, claimed, calls, replay.get("finished_at"))
    final = {
        **_final_tokens(steps, calls, model),
        "total_steps": len(steps),
        "extra": {"model_turns": model.get("steps"), "invalid_turns": model.get("invalid"),
                  "cost_cents": (replay.get("metrics") or {}).get("cost_cents")},
    }
    trajectory: dict[str, Any] = {
        "schema_version": ATIF_VERSION,
        "session_id": str(replay.get("test_run_id") or replay.get("attempt_id")),
        "trajectory_id": str(replay.get("attempt_id")),
        "agent": {"name": str(replay.get("agent_id")), "version": AGENT_SYSTEM,
                  **({"model_name": str(model["model"])} if model.get("model") else {}),
                  "extra": {"api": model.get("api"), "coordinates": model.get("coordinates")}},
        "steps": [{k: v for k, v in s.items() if v is not None} for s in steps],
        "final_metrics": {k: v for k, v in final.items() if v is not None},
        "extra": {"gh": _outcome_extra(replay)},
    }
    if replay.get("assisted"):
        trajectory["notes"] = ("assisted: a person took the machine over during this attempt (extra.gh.takeovers); "
                               "its score is the check's, never the agent's")
    return trajectory


def atif_files(replay: dict[str, Any], png: FramePng) -> Iterator[tuple[str, bytes]]:
    """`{attempt_id}/trajectory.json` and its screenshots beside it, one frame at a time."""
    base = str(replay["attempt_id"])
    yield f"{base}/trajectory.json", json.dumps(atif_trajectory(replay), indent=2).encode()
    for frame in replay.get("frames") or []:
        yield f"{base}/screenshots/{_png_name(int(frame['seq']))}", png(int(frame["seq"]))


def osworld_dir(replay: dict[str, Any]) -> str:
    """`{action_space}/{observation_type}/{model}/{domain}/{task_id}` of an attempt: the model is the agent
    (a further try is a run of its own, `{agent}-try{n}`, as OSWorld's repeated runs are), the domain the
    case's category (an imported OSWorld task's is its domain), the task the case's key."""
    agent = str(replay.get("agent_id") or "agent")
    n = int(replay.get("try") or 1)
    model = agent if n == 1 else f"{agent}-try{n}"
    domain = str(replay.get("category") or OSWORLD_DEFAULT_DOMAIN)
    task = str(replay.get("key") or replay.get("attempt_id"))
    parts = [OSWORLD_ACTION_SPACE, OSWORLD_OBSERVATION, model, domain, task]
    return "/".join(p.replace("/", "_") for p in parts)


def _timestamp(at: Any) -> str:
    try:
        return datetime.fromisoformat(str(at).replace("Z", "+00:00")).strftime(TIMESTAMP_FORMAT)
    except ValueError:
        return time.strftime(TIMESTAMP_FORMAT, time.gmtime(0))


def counts_as_score(replay: dict[str, Any]) -> bool:
    """A try's score that OSWorld's show_result.py may average: the last attempt of its try, scored, and
    not assisted (an error is ours and an assisted try a person's: neither is the agent's)."""
    return (bool(replay.get("is_last", True)) and replay.get("outcome") in ("passed", "failed")
            and not replay.get("assisted"))


def osworld_files(replay: dict[str, Any], png: FramePng) -> Iterator[tuple[str, bytes]]:
    """The attempt in OSWorld's result layout: a `step_{n}_{timestamp}.png` and a `traj.jsonl` line per
    action, `result.txt` (the score) when it counts, and `gh_attempt.json` (what we know that OSWorld has
    no field for: outcome, assisted, takeovers, error)."""
    base = osworld_dir(replay)
    lines: list[str] = []
    actions = [f for f in replay.get("frames") or [] if _agent_event(f)[0] is not None]
    for n, frame in enumerate(actions, start=1):
        kind, args, words = _agent_event(frame)
        stamp = _timestamp(frame.get("at"))
        shot = f"step_{n}_{stamp}.png"
        yield f"{base}/{shot}", png(int(frame["seq"]))
        lines.append(json.dumps({
            "step_num": n, "action_timestamp": stamp, "action": {"action_type": kind, **args},
            "response": words or "", "reward": 0, "done": n == len(actions), "info": {},
            "screenshot_file": shot,
        }))
    yield f"{base}/traj.jsonl", "".join(line + "\n" for line in lines).encode()
    if counts_as_score(replay):
        score = replay.get("score")
        if score is None:
            score = 1.0 if replay.get("outcome") == "passed" else 0.0
        yield f"{base}/result.txt", f"{float(score)}\n".encode()
    yield f"{base}/gh_attempt.json", json.dumps(_outcome_extra(replay), indent=2).encode()


def export_files(fmt: ExportFormat, replays: Iterable[tuple[dict[str, Any], FramePng]]) -> Iterator[tuple[str, bytes]]:
    """Every attempt's files in `fmt`. OSWorld's layout holds one attempt per try (the one that counts);
    ATIF one trajectory per attempt, retried ones included (`extra.gh.is_last` tells them apart)."""
    for replay, png in replays:
        if fmt == ExportFormat.ATIF:
            yield from atif_files(replay, png)
        elif bool(replay.get("is_last", True)):
            yield from osworld_files(replay, png)


class _Chunks(io.RawIOBase):
    """A write-only file that hands back what was written since the last look (a tar stream's sink)."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.buf += b
        return len(b)

    def take(self) -> bytes:
        out = bytes(self.buf)
        self.buf.clear()
        return out


def targz_chunks(files: Iterable[tuple[str, bytes]], root: str) -> Iterator[bytes]:
    """`files` as a tar.gz under `root/`, yielded as it is made: one file's bytes in memory at a time."""
    sink = _Chunks()
    now = time.time()
    with tarfile.open(fileobj=sink, mode="w|gz") as tar:
        for name, data in files:
            info = tarfile.TarInfo(f"{root}/{name}")
            info.size, info.mtime, info.mode = len(data), now, 0o644
            tar.addfile(info, io.BytesIO(data))
            if sink.buf:
                yield sink.take()
    if sink.buf:
        yield sink.take()


def write_files(files: Iterable[tuple[str, bytes]], out_dir: Path) -> int:
    """Write `files` under `out_dir`; how many. A name that would leave `out_dir` is refused."""
    out = out_dir.resolve()
    count = 0
    for name, data in files:
        target = (out / name).resolve()
        if not target.is_relative_to(out):
            raise ValueError(f"refusing to write {name!r} outside {out}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        count += 1
    return count
