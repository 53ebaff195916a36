"""GET /v1/test_runs/{id}/export through the real API (SQLite and PostgreSQL): the tar.gz holds each
attempt's ATIF trajectory with its screenshots from the replay store, or OSWorld's layout; what the replay
redacts stays redacted (a secret fact the agent echoed); an assisted try is said to be one; a member's key
opens it, no key does not, an unknown format is refused. And a built-in model agent's run against a scripted
model server (tests/gateway/modelserver.py), the runner simulated: each ATIF step says the tokens of the
model call it stands for, as the server's replies said them."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from export import recorded
from export.atif_check import atif_errors
from gateway.conftest import GwServer, server_factory  # noqa: F401 (a fixture: the gateway's server)
from gateway.modelserver import Reply, chat, claude, member, model_server, sequence, text
from gateway.simrunner import SimRunner, now
from gateway.test_agents import Machine, connect, start_task

from gh_local.report import build_report, write_report
from gh_runner.replay import exec_event, redact_event, with_note
from gh_server import replays
from gh_server.models import Attempt, ReplayFrame
from gh_server.settings import ModelAgentConfig
from gh_wire import protocol

from .conftest import Server
from .test_test_runs import _attempts, _case, _finish

SECRET = "hunter2-Secret"
T0 = datetime(2026, 12, 5, 10, 0, 0, tzinfo=UTC)


def _run(server: Server, key: str = "EX-1") -> tuple[str, str]:
    _case(server, key, customer={"facts": {"password": {"secret": SECRET}}}, category="os")
    rid = server.admin.test_runs.create(test_case_ids=[key], agents=["noop"], repeat=1)["test_run_id"]
    (a,) = _attempts(server, rid)
    _finish(server, a.id, "passed")
    frames = recorded.replay()["frames"]
    # The agent's words echo the secret: the replay shows •••, and so must the export.
    frames[2]["event"]["note"]["text"] = f"Typing {SECRET} now."
    with server.state.db.begin() as s:
        row = s.get(Attempt, a.id)
        assert row is not None
        row.started_at, row.finished_at = T0, T0 + timedelta(seconds=20)
        row.answer, row.score = f"done; the password was {SECRET}", 1.0
        row.assisted, row.takeovers = True, recorded.replay()["takeovers"]
        row.metrics = {**(row.metrics or {}), "model": recorded.replay()["metrics"]["model"]}
        for f in frames:
            s.add(ReplayFrame(attempt_id=a.id, seq=f["seq"], at=T0 + timedelta(seconds=f["t"]), label=f["label"],
                              event=f["event"], png=recorded.png(f["seq"])))
    return rid, a.id


def _get(server: Server, rid: str, fmt: str, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{server.base_url}/v1/test_runs/{rid}/export", params={"format": fmt}, headers=headers,
                     timeout=30)


def _untar(body: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def test_export_streams_atif_and_osworld_redacted(server: Server) -> None:
    rid, aid = _run(server)
    r = _get(server, rid, "atif", server.member_key)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/gzip"
    files = _untar(r.content)
    root = f"{rid}-atif/{aid}/"
    t = json.loads(files[root + "trajectory.json"])
    assert atif_errors(t, {k.removeprefix(root): v for k, v in files.items() if k.startswith(root)}) == []
    assert len([k for k in files if k.endswith(".png")]) == 6
    assert files[root + "screenshots/00002.png"] == recorded.png(2)
    assert t["extra"]["gh"]["assisted"] is True and "assisted" in t["notes"]
    assert t["final_metrics"]["total_prompt_tokens"] == 1200
    assert t["steps"][3]["message"] == "Typing ••• now."
    assert SECRET.encode() not in r.content and SECRET.encode() not in b"".join(files.values())

    r = _get(server, rid, "osworld", server.admin_key)
    assert r.status_code == 200, r.text
    files = _untar(r.content)
    task = f"{rid}-osworld/gh_machine_api/screenshot/noop/os/EX-1/"
    assert {k.removeprefix(task) for k in files if k.endswith((".jsonl", ".json", ".txt"))} == {
        "traj.jsonl", "gh_attempt.json"}  # assisted: no result.txt, so show_result.py does not count it
    assert json.loads(files[task + "gh_attempt.json"])["assisted"] is True
    assert len(files[task + "traj.jsonl"].decode().splitlines()) == 3
    assert SECRET.encode() not in b"".join(files.values())


def test_export_refuses_no_key_an_unknown_format_and_an_unknown_run(server: Server) -> None:
    rid, _ = _run(server, "EX-2")
    assert _get(server, rid, "atif", None).status_code == 401
    bad = _get(server, rid, "parquet", server.admin_key)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request"
    missing = _get(server, "tr_nope", "atif", server.admin_key)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"


def _gh_runner(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).with_name("gh-runner")), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_cli_exports_a_local_report_and_a_server_run_alike(server: Server, tmp_path: Path) -> None:
    """`gh-runner export` over a report as `gh-runner local` writes it (its replay pages, exported by the
    same gh_server/replays.py `export_replay`, and report.json by gh_local/report.py), and with --run ID
    from this server: the same files either way."""
    rid, aid = _run(server, "EX-3")
    report_dir = tmp_path / "report"
    with server.state.db() as s:
        page = replays.export_replay(s, aid, report_dir / "replays", report_dir / "report.html")
    assert page is not None
    entry = {"attempt_id": aid, "key": "EX-3", "agent_id": "noop", "try": 1, "outcome": "passed", "score": 1.0,
             "assisted": True, "replay_path": str(page)}
    write_report(report_dir / "report.json", build_report({"test_run_id": rid, "agents": ["noop"]}, None, [entry]))

    from_report, from_server = tmp_path / "a", tmp_path / "b"
    done = _gh_runner("export", str(report_dir), "--format", "osworld", "--out", str(from_report))
    assert done.returncode == 0, done.stderr
    done = _gh_runner("export", "--run", rid, "--server", server.base_url, "--format", "osworld",
                      "--out", str(from_server), env={"EAGER_API_KEY": server.member_key})
    assert done.returncode == 0, done.stderr

    def tree(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    a, b = tree(from_report), tree(from_server)
    assert sorted(a) == sorted(b) and len([k for k in a if k.endswith(".png")]) == 3
    assert a == b
    assert SECRET.encode() not in b"".join(a.values())

    done = _gh_runner("export", str(report_dir), "--format", "atif", "--out", str(tmp_path / "c"))
    assert done.returncode == 0, done.stderr
    t = json.loads((tmp_path / "c" / aid / "trajectory.json").read_text())
    shots = {str(p.relative_to(tmp_path / "c" / aid)): p.read_bytes() for p in (tmp_path / "c" / aid).rglob("*.png")}
    assert atif_errors(t, shots) == [] and len(shots) == 6
    # Each model call's tokens reach its step through the report's replay page too, summing to the totals.
    assert [s["metrics"]["prompt_tokens"] for s in t["steps"] if "metrics" in s] == [
        c["tokens_in"] for c in recorded.CALLS]
    assert t["final_metrics"]["total_prompt_tokens"] == sum(c["tokens_in"] for c in recorded.CALLS) == 1200

    bad = _gh_runner("export", str(tmp_path / "nothing"), "--format", "atif", "--out", str(tmp_path / "d"))
    assert bad.returncode == 2 and "no report.json" in bad.stderr
    nokey = _gh_runner("export", "--run", rid, "--server", server.base_url, "--format", "atif",
                       "--out", str(tmp_path / "e"), env={"EAGER_API_KEY": "gh_live_wrong"})
    assert nokey.returncode == 1 and "401" in nokey.stderr


class Filmed(Machine):
    """The simulated runner's machine, answering each request and sending the replay frame the runner makes
    of it (gh_runner/machine_requests.py: a screen, each input event, an exec; the note on a request's
    first frame), with the runner's own functions (gh_runner/replay.py). `seq_of`: each request's first
    frame."""

    def __init__(self, r: SimRunner, attempt_id: list[str]) -> None:
        super().__init__(r, exec_stdout="ok\n")
        self.attempt_id = attempt_id  # filled once the lease is taken
        self.seq = 0
        self.seq_of: list[tuple[int, dict[str, Any] | None]] = []  # (first frame's seq, the request's note)

    async def handle(self, msg: Any) -> bool:
        if not await super().handle(msg):
            return False
        q: protocol.MachineRequest = msg
        if q.op == "screen":
            shown = [with_note({"type": "screen"}, q.note, q.redact)]
        elif q.op == "input":
            shown = [with_note(redact_event(e, q.redact), q.note, q.redact) if i == 0 else redact_event(e, q.redact)
                     for i, e in enumerate(q.events)]
        elif q.op == "exec":
            shown = [with_note(exec_event(q.script or "", 0, self.exec_stdout, "", False, q.redact), q.note,
                               q.redact)]
        else:
            return True
        self.seq_of.append((self.seq, q.note))
        for event in shown:
            await self.r.send(protocol.ReplayFrame(attempt_id=self.attempt_id[0], seq=self.seq, at=now(),
                                                   label=q.op, png_b64=self.screen, event=event))
            self.seq += 1
        return True


def _said(reply: Reply) -> dict[str, Any]:
    """ATIF's step metrics of a scripted reply, read from its usage in its API's own fields: prompt_tokens
    are all input tokens, cached ones included (Chat Completions counts them in prompt_tokens; the Messages
    API apart, in cache_read/cache_creation_input_tokens); the cost at the agent's price below ($3/M in,
    $15/M out; cached input at the input price)."""
    u = reply.body["usage"]
    if "prompt_tokens" in u:
        prompt, out, cached = u["prompt_tokens"], u["completion_tokens"], u["prompt_tokens_details"]["cached_tokens"]
    else:
        cached = u.get("cache_read_input_tokens") or 0
        prompt, out = u["input_tokens"] + cached + (u.get("cache_creation_input_tokens") or 0), u["output_tokens"]
    return {"prompt_tokens": prompt, "completion_tokens": out, "cached_tokens": cached,
            "cost_usd": round((prompt * 3.0 + out * 15.0) / 1_000_000, 8)}


MODEL_KEY_ENV = "GH_TEST_EXPORT_MODEL_KEY"
SCRIPTS: dict[str, tuple[Reply, ...]] = {
    "anthropic": (
        claude(text("Opening a terminal."), member("left_click", coordinate=[200, 150]), member("type", text="ls\n"),
               tokens=(1000, 50)),
        claude(text("Looking again."), member("screenshot"), tokens=(300, 40), cached=1500),
        claude(text("All fixed."), tokens=(200, 12), cached=2300)),
    "openai-chat": (
        chat("Scrolling.", ("computer", {"action": "scroll", "x": 100, "y": 100, "dy": 3}), tokens=(1200, 33)),
        chat("Clicking.", ("computer", {"action": "click", "x": 10, "y": 10}), tokens=(2100, 21), cached=1024),
        chat("It works now.", tokens=(2600, 7), cached=2048)),
}


@pytest.mark.parametrize("api", list(SCRIPTS))
async def test_atif_steps_carry_each_model_calls_tokens(server_factory: Any, api: str,  # noqa: F811
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MODEL_KEY_ENV, "sk-test-export")
    replies = SCRIPTS[api]
    with model_server(sequence(*replies)) as (url, seen):
        cfg = ModelAgentConfig.model_validate({
            "id": "m", "kind": "model", "api": api, "model": "test-model", "base_url": url,
            "api_key_env": MODEL_KEY_ENV, "screen": (400, 300), "retries": 1, "timeout": 20,
            "price": {"input": 3.0, "output": 15.0},
            **({"output": "tool_calls"} if api == "openai-chat" else {})})
        server: GwServer = server_factory(agents={"m": cfg}, dead_after=300.0)
        r = await connect(server)
        attempt: list[str] = []
        machine = Filmed(r, attempt)
        try:
            rid, aid = await start_task(server, r, {}, "m")
            attempt.append(aid)
            end = await r.expect("task_end", timeout=120)
            assert end.error is None and end.answer and len(seen.requests) == len(replies)
            res = protocol.AttemptResult(
                attempt_id=aid, outcome="passed", answer=end.answer,
                check_before=protocol.CheckOutput(exit_code=0, stdout_tail="False", verdict="False"),
                check_after=protocol.CheckOutput(exit_code=0, stdout_tail="True", verdict="True"),
                metrics=protocol.AttemptMetrics(steps=end.steps, agent_usage=end.usage),
                started_at=now(), finished_at=now())
            await r.send(protocol.AttemptFinished(result=res))
            await r.expect("result_ack", where=lambda m: m.attempt_id == aid)
        finally:
            await r.close()
    async with httpx.AsyncClient(timeout=30) as client:
        got = await client.get(f"{server.base_url}/v1/test_runs/{rid}/export", params={"format": "atif"},
                               headers={"Authorization": f"Bearer {server.admin_key}"})
    assert got.status_code == 200, got.text
    files = _untar(got.content)
    root = f"{rid}-atif/{aid}/"
    t = json.loads(files[root + "trajectory.json"])
    assert atif_errors(t, {k.removeprefix(root): v for k, v in files.items() if k.startswith(root)}) == []
    steps = t["steps"]
    # Each call's tokens, as its reply said them, on the step of the first frame its reply made (the n-th
    # call's requests are noted step n); the last reply answered and acted on nothing: the answer's step.
    first_frame = {}
    for seq, note in machine.seq_of:
        first_frame.setdefault((note or {}).get("step"), seq)
    by_seq = {s["extra"]["seq"]: s for s in steps if "seq" in (s.get("extra") or {})}
    said = [_said(reply) for reply in replies]
    assert by_seq[first_frame[1]]["metrics"] == said[0] and by_seq[first_frame[2]]["metrics"] == said[1]
    assert steps[-1]["message"] == end.answer and steps[-1]["metrics"] == said[2]
    assert [s["extra"]["model_calls"] for s in steps if "metrics" in s] == [[1], [2], [3]]
    assert [s["llm_call_count"] for s in steps if "metrics" in s] == [1, 1, 1]
    # The agent's other steps (its first look, a reply's later actions, the look after) made no call.
    assert {s.get("llm_call_count") for s in steps if s["source"] == "agent" and "metrics" not in s} == {0}
    # The totals are the steps' sums, and the agent's own account's.
    fm = t["final_metrics"]
    assert (fm["total_prompt_tokens"], fm["total_completion_tokens"], fm["total_cached_tokens"]) == (
        sum(x["prompt_tokens"] for x in said), sum(x["completion_tokens"] for x in said),
        sum(x["cached_tokens"] for x in said))
    assert fm["total_cost_usd"] == round(sum(x["cost_usd"] for x in said), 8)
    u = end.usage or {}
    assert (u["tokens_in"], u["tokens_out"], u["tokens_cached"]) == (
        fm["total_prompt_tokens"], fm["total_completion_tokens"], fm["total_cached_tokens"])
    assert abs(u["cost_cents_exact"] / 100 - fm["total_cost_usd"]) < 1e-8
