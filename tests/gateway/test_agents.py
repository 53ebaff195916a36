"""Agents drive a simulated runner from the task phase to task_end: built-ins, a command agent, an
HTTP agent, the machine API's auth, and the judge/customer model endpoints."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from agentfiles import agent_command
from PIL import Image

from gh_server.settings import AgentConfig, ModelEndpoint
from gh_wire import protocol

from .conftest import GwServer, await_for, stop_server
from .fakehttp import chat_reply, serve
from .simrunner import SimRunner, now

AGENT_CMD = Path(__file__).with_name("agent_cmd.py")


@contextlib.contextmanager
def agent_dir() -> Iterator[str]:
    """A temp dir a command agent may write to: it runs with a uid of its own (gh_server.agents.sandbox)."""
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o777)
        yield d


def tiny_png() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (4, 3), (200, 10, 10)).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


class Machine:
    """Answers machine requests like a runner would, and remembers them: `screen` (a PNG, base64) for a
    screenshot, `exec_stdout` for an exec; an input fails with `input_error` (and `input_refusal`) unless
    `input_ok`."""

    def __init__(self, r: SimRunner, exec_ok: bool = True, input_ok: bool = True, *, screen: str | None = None,
                 exec_stdout: str = "host-1\n", input_error: str = "the machine is gone",
                 input_refusal: protocol.MachineRefusal | None = None) -> None:
        self.r = r
        self.exec_ok = exec_ok
        self.input_ok = input_ok
        self.screen = screen or tiny_png()
        self.exec_stdout = exec_stdout
        self.input_error = input_error
        self.input_refusal = input_refusal
        self.requests: list[protocol.MachineRequest] = []
        self.a11y: str | None = None  # the accessibility tree's XML (None: refused, no desktop)
        r.on_message = self.handle

    async def handle(self, msg: Any) -> bool:
        if not isinstance(msg, protocol.MachineRequest):
            return False
        self.requests.append(msg)
        if msg.op == "screen":
            resp = protocol.MachineResponse(request_id=msg.request_id, ok=True, png_b64=self.screen)
        elif msg.op == "input":
            ok = self.input_ok
            resp = protocol.MachineResponse(request_id=msg.request_id, ok=ok,
                                            refusal=None if ok else self.input_refusal,
                                            error=None if ok else self.input_error)
        elif msg.op == "accessibility":
            resp = (protocol.MachineResponse(request_id=msg.request_id, ok=True, xml=self.a11y) if self.a11y else
                    protocol.MachineResponse(request_id=msg.request_id, ok=False, error="linux-tiny has no desktop",
                                             refusal=protocol.MachineRefusal.NO_ACCESSIBILITY))
        elif self.exec_ok:
            resp = protocol.MachineResponse(request_id=msg.request_id, ok=True, exit_code=0, stdout=self.exec_stdout,
                                            stderr="")
        else:
            resp = protocol.MachineResponse(request_id=msg.request_id, ok=False, error="guest agent is not answering")
        await self.r.send(resp)
        return True


async def start_task(server: GwServer, r: SimRunner, case: dict[str, Any], agent: str) -> tuple[str, str]:
    run_id, (aid,) = server.add_run([case], agents=[agent])
    lease = await r.expect("lease")
    assert lease.attempt_id == aid and lease.agent_id == agent
    await r.send(protocol.LeaseAccept(attempt_id=aid))
    await r.status(aid, "preparing")
    await r.status(aid, "running", "task")
    return run_id, aid


async def connect(server: GwServer, slots: int = 1) -> SimRunner:
    _, token = server.add_runner()
    return await SimRunner(server.ws_url, token, slots=slots, images=["linux-tiny"]).connect()


async def test_noop_ends_at_once_and_run_completes(server: GwServer) -> None:
    r = await connect(server)
    try:
        run_id, aid = await start_task(server, r, {}, "noop")
        end = await r.expect("task_end")
        assert end.attempt_id == aid and end.answer == "" and end.error is None
        await r.status(aid, "checking")
        await r.finish(aid, "failed", check_after="False")
        await await_for(lambda: server.run(run_id).status == "completed", what="run completed")
        assert server.attempt(aid).outcome == "failed"
    finally:
        await r.close()


async def test_default_is_noop(server: GwServer) -> None:
    r = await connect(server)
    try:
        _, aid = await start_task(server, r, {}, "default")
        end = await r.expect("task_end")
        assert end.attempt_id == aid and end.answer == "" and end.error is None
    finally:
        await r.close()


async def test_reference_runs_the_fix_and_answers(server: GwServer) -> None:
    r = await connect(server)
    m = Machine(r)
    try:
        case = {"metadata": {"reference_fix": "rm -f /etc/broken", "reference_answer": "HomeNet"},
                "limits": {"minutes": 2, "steps": None}}
        run_id, aid = await start_task(server, r, case, "reference")
        end = await r.expect("task_end")
        assert end.attempt_id == aid and end.answer == "HomeNet" and end.error is None
        assert [(q.op, q.script, q.attempt_id) for q in m.requests] == [("exec", "rm -f /etc/broken", aid)]
        assert m.requests[0].timeout == 120
        # A repeated `running` (e.g. after a reconnect) does not start a second agent.
        await r.status(aid, "running", "task")
        await r.finish(aid, "passed")
        assert len(m.requests) == 1
        await await_for(lambda: server.run(run_id).status == "completed", what="run completed")
    finally:
        await r.close()


async def test_reference_machine_failure_ends_task_with_error(server: GwServer) -> None:
    r = await connect(server)
    Machine(r, exec_ok=False)
    try:
        _, _aid = await start_task(server, r, {"metadata": {"reference_fix": "fix"}}, "reference")
        end = await r.expect("task_end")
        assert end.error is not None and "guest agent is not answering" in end.error
    finally:
        await r.close()


async def test_unknown_agent_ends_task_with_error(server: GwServer) -> None:
    r = await connect(server)
    try:
        await start_task(server, r, {}, "nobody")
        end = await r.expect("task_end")
        assert end.error is not None and "unknown agent 'nobody'" in end.error
    finally:
        await r.close()


def cmd_agent(mode: str, out: Path) -> dict[str, AgentConfig]:
    return {"cmd": AgentConfig(id="cmd", kind="command", command=agent_command(AGENT_CMD, str(out), mode),
                               timeout=120)}


async def test_command_agent_uses_machine_api(server_factory: Any) -> None:
    with agent_dir() as d:
        out = Path(d) / "doc.json"
        server: GwServer = server_factory(agents=cmd_agent("work", out))
        r = await connect(server)
        m = Machine(r)
        try:
            case = {"prompt": "My hostname looks wrong", "metadata": {"reference_fix": "SECRET-FIX"},
                    "customer": {"facts": {"Wi-Fi password": {"secret": "blue-kite-42"}}}}
            _, aid = await start_task(server, r, case, "cmd")
            end = await r.expect("task_end", timeout=60)
            assert end.error is None, end.error
            assert end.answer == "fixed: host-1 (exit 0)"
            assert end.steps == 2  # input + exec through the machine API
            assert [q.op for q in m.requests] == ["screen", "input", "exec"]
            assert m.requests[2].script == "cat /etc/hostname" and m.requests[2].timeout == 30
            assert m.requests[1].redact == ["blue-kite-42"]  # secrets never echo into a replay
            doc = json.loads(out.read_text())
            assert doc["prompt"] == "My hostname looks wrong" and doc["attempt_id"] == aid
            assert doc["machine"]["url"] == server.base_url + "/v1/agent/machine"
            text = json.dumps(doc)
            assert "SECRET-FIX" not in text and "blue-kite-42" not in text and "check_script" not in text
            # The token is dead once the task is over.
            async with httpx.AsyncClient(timeout=30) as c:
                resp = await c.get(doc["machine"]["url"] + "/screen",
                                   headers={"Authorization": f"Bearer {doc['machine']['token']}"})
            assert resp.status_code == 401
        finally:
            await r.close()


async def test_command_agent_exit_nonzero_is_its_failure_not_an_error(server_factory: Any) -> None:
    # The agent's own failure ends the task (the check after scores it), noted with a reason.
    with agent_dir() as d:
        server: GwServer = server_factory(agents=cmd_agent("fail", Path(d) / "doc.json"))
        r = await connect(server)
        try:
            await start_task(server, r, {}, "cmd")
            end = await r.expect("task_end", timeout=60)
            assert end.error is None
            assert end.reason == protocol.TaskEndReason.AGENT_FAILED
            assert end.note == "agent cmd exited with code 3: boom: could not think"
        finally:
            await r.close()


async def test_agent_stopped_when_runner_moves_to_checking(server_factory: Any) -> None:
    with agent_dir() as d:
        out = Path(d) / "doc.json"
        server: GwServer = server_factory(agents=cmd_agent("hang", out))
        r = await connect(server)
        try:
            _, aid = await start_task(server, r, {}, "cmd")
            doc = await await_for(lambda: out.exists() and out.stat().st_size and json.loads(out.read_text()),
                                  what="agent started")
            pid = doc["pid"]
            await r.status(aid, "checking")  # the runner hit limits.minutes, say
            await await_for(lambda: not _alive(pid), what="agent process killed")
            try:
                m = await r.expect("task_end", timeout=1.0)
            except AssertionError:
                m = None
            assert m is None  # a stopped agent sends nothing: the runner has moved on
        finally:
            await r.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie until reaped by the server's asyncio child watcher counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


async def test_http_agent(server_factory: Any) -> None:
    def reply(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, {"answer": f"I looked at: {body['prompt']}", "steps": 7}

    with serve(reply) as (url, seen):
        server: GwServer = server_factory(agents={"web": AgentConfig(id="web", kind="http", url=url + "/act")})
        r = await connect(server)
        try:
            _, aid = await start_task(server, r, {"prompt": "printer offline"}, "web")
            end = await r.expect("task_end", timeout=60)
            assert end.error is None and end.answer == "I looked at: printer offline" and end.steps == 7
            path, body = seen[0]
            assert path == "/act" and body["attempt_id"] == aid and body["machine"]["token"]
        finally:
            await r.close()


async def test_customer_question_without_model_is_an_error(server_factory: Any) -> None:
    with agent_dir() as d:
        server: GwServer = server_factory(agents=cmd_agent("ask", Path(d) / "doc.json"))
        r = await connect(server)
        try:
            await start_task(server, r, {}, "cmd")
            end = await r.expect("task_end", timeout=60)
            assert end.error is not None and "no customer model is configured" in end.error
        finally:
            await r.close()


async def test_customer_question_with_model(server_factory: Any) -> None:
    with serve(chat_reply("It's HomeNet, dear.")) as (url, seen), agent_dir() as d:
        server: GwServer = server_factory(agents=cmd_agent("ask", Path(d) / "doc.json"),
                                          customer_model=ModelEndpoint(base_url=url + "/v1", model="cust"))
        r = await connect(server)
        Machine(r)
        try:
            case = {"customer": {"persona": "Retired teacher", "facts": {"Wi-Fi network": "HomeNet",
                                                                         "Wi-Fi password": {"secret": "blue-kite-42"}}}}
            _, aid = await start_task(server, r, case, "cmd")
            end = await r.expect("task_end", timeout=60)
            assert end.error is None and end.answer == "ask 200 It's HomeNet, dear." and end.questions == 1
            (turn,) = server.attempt(aid).customer_turns or []
            assert turn.pop("usage")["calls"] == 1  # the customer model's own time and tokens
            assert turn == {"question": "What is your Wi-Fi called?", "answer": "It's HomeNet, dear.", "actions": []}
            sent = json.dumps(seen[0][1])
            assert "Retired teacher" in sent and "Wi-Fi password (secret)" in sent and "blue-kite-42" not in sent
        finally:
            await r.close()


WIFI_CASE = {"customer": {"persona": "Retired teacher", "facts": {"Wi-Fi network": "HomeNet",
                                                                  "Wi-Fi password": {"secret": "blue-kite-42"}}}}


async def _customer_turn(server_factory: Any, reply: dict[str, Any], case: dict[str, Any],
                         ) -> tuple[protocol.TaskEnd, dict[str, Any], Machine, list[tuple[str, dict[str, Any]]]]:
    with serve(chat_reply(json.dumps(reply))) as (url, seen), agent_dir() as d:
        server: GwServer = server_factory(agents=cmd_agent("ask", Path(d) / "doc.json"),
                                          customer_model=ModelEndpoint(base_url=url + "/v1", model="cust"))
        r = await connect(server)
        m = Machine(r)
        try:
            _, aid = await start_task(server, r, case, "cmd")
            end = await r.expect("task_end", timeout=60)
            (turn,) = server.attempt(aid).customer_turns or []
            turn.pop("usage", None)  # the customer model's overhead, asserted in test_customer_question_with_model
            return end, turn, m, seen
        finally:
            await r.close()


async def test_customer_types_a_secret_fact_it_never_saw(server_factory: Any) -> None:
    end, turn, m, seen = await _customer_turn(
        server_factory, {"answer": "I'll type it for you.", "type_fact": "Wi-Fi password", "click_yes": True},
        WIFI_CASE)
    assert end.error is None and end.answer == "ask 200 I'll type it for you."
    assert turn == {"question": "What is your Wi-Fi called?", "answer": "I'll type it for you.",
                    "actions": [{"type": "type_fact", "fact": "Wi-Fi password"}]}  # no admin prompts for this one
    (typed,) = [q for q in m.requests if q.op == "input"]
    assert [e.model_dump() for e in typed.events] == [{"type": "type", "text": "blue-kite-42"}]
    assert "blue-kite-42" in typed.redact  # the runner keeps it out of the replay
    sent = json.dumps(seen[0][1])
    assert "blue-kite-42" not in sent and "data:image/png;base64," in sent  # the model saw the screen, not the value
    assert "never accept administrator prompts" in sent


async def test_after_a_secret_is_typed_the_customer_model_sees_the_screen_masked(server_factory: Any) -> None:
    reply = {"answer": "Typing it.", "type_fact": "Wi-Fi password"}
    with serve(chat_reply(json.dumps(reply))) as (url, seen), agent_dir() as d:
        server: GwServer = server_factory(agents=cmd_agent("ask-twice", Path(d) / "doc.json"),
                                          customer_model=ModelEndpoint(base_url=url + "/v1", model="cust"))
        r = await connect(server)
        Machine(r)
        try:
            await start_task(server, r, WIFI_CASE, "cmd")
            end = await r.expect("task_end", timeout=60)
            assert end.error is None and end.questions == 2
        finally:
            await r.close()
    shown = [part["image_url"]["url"] for _, body in seen for part in body["messages"][1]["content"]
             if part["type"] == "image_url"]
    raw = "data:image/png;base64," + tiny_png()
    assert len(shown) == 2 and shown[0] == raw and shown[1] != raw  # the guest may echo what was typed


async def test_customer_clicks_yes_only_when_the_case_lets_it(server_factory: Any) -> None:
    case = {"customer": {**WIFI_CASE["customer"], "clicks_admin_prompts": True, "does_steps": False}}
    end, turn, m, seen = await _customer_turn(
        server_factory, {"answer": "Done, I clicked Yes.", "type_fact": "No such fact", "click_yes": True}, case)
    assert end.error is None
    assert turn["actions"] == [{"type": "click_yes"}]  # the unknown fact is not typed
    (sent_input,) = [q for q in m.requests if q.op == "input"]
    assert [e.model_dump() for e in sent_input.events] == [{"type": "key", "keys": ["ALT", "Y"]}]
    prompt = json.dumps(seen[0][1])
    assert "you click Yes" in prompt and "Could you do that for me?" in prompt


async def test_customer_that_cannot_type_makes_the_attempt_an_error(server_factory: Any) -> None:
    with serve(chat_reply(json.dumps({"answer": "Typing it.", "type_fact": "Wi-Fi password"}))) as (url, _), \
            agent_dir() as d:
        server: GwServer = server_factory(agents=cmd_agent("ask", Path(d) / "doc.json"),
                                          customer_model=ModelEndpoint(base_url=url + "/v1", model="cust"))
        r = await connect(server)
        Machine(r, exec_ok=False, input_ok=False)
        try:
            await start_task(server, r, WIFI_CASE, "cmd")
            end = await r.expect("task_end", timeout=60)
            assert end.error is not None and "simulated customer could not act on the machine" in end.error
            assert "blue-kite-42" not in end.error
        finally:
            await r.close()


async def test_approvals_are_decided_by_the_cases_operator(server_factory: Any) -> None:
    with agent_dir() as d:
        server: GwServer = server_factory(agents=cmd_agent("approve", Path(d) / "doc.json"))
        r = await connect(server, slots=2)
        try:
            for decision in ("deny", "approve"):
                await start_task(server, r, {"operator": {"approvals": decision}}, "cmd")
                end = await r.expect("task_end", timeout=60)
                assert end.error is None and end.answer == f"approval 200 {decision} empty 400"
                assert end.approvals == 1
        finally:
            await r.close()


async def test_rubric_without_judge_is_error_not_leased(server: GwServer) -> None:
    r = await connect(server)
    try:
        run_id, (aid,) = server.add_run([{"success": {"check_script": None, "rubric": "The printer prints."}}])
        a = await await_for(lambda: server.attempt(aid).status == "done" and server.attempt(aid), what="errored")
        assert a.outcome == "error" and "no judge model is configured" in (a.error or "")
        assert len(server.attempts_of(run_id)) == 1  # retrying cannot help: not retried
        await await_for(lambda: server.run(run_id).status == "completed", what="run completed")
        try:
            m = await r.expect("lease", timeout=1.0)
        except AssertionError:
            m = None
        assert m is None
    finally:
        await r.close()


async def test_rubric_judged_by_model(server_factory: Any) -> None:
    verdicts = iter(['{"passed": true, "reason": "The printer works."}',
                     'Sure! {"passed": false, "reason": "Still offline."}'])

    def reply(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, {"choices": [{"message": {"content": next(verdicts)}}]}

    with serve(reply) as (url, seen):
        server: GwServer = server_factory(judge=ModelEndpoint(base_url=url + "/v1", model="judge"))
        r = await connect(server, slots=2)
        try:
            rubric_only = {"success": {"check_script": None, "rubric": "The printer prints."}}
            run_id, ids = server.add_run([rubric_only, {"success": {"check_script": "x", "rubric": "Polite."}}])
            leases = {(await r.expect("lease")).attempt_id for _ in range(2)}
            assert leases == set(ids)
            # The runner's frames are what the judge sees.
            await r.send(protocol.ReplayFrame(attempt_id=ids[0], seq=0, at=now(), label="first", png_b64=tiny_png()))
            res = protocol.AttemptResult(attempt_id=ids[0], outcome="passed", check_absent=True, answer="done")
            await r.send(protocol.AttemptFinished(result=res))
            await r.expect("result_ack", where=lambda m: m.attempt_id == ids[0])
            await r.finish(ids[1], "passed")
            a0, a1 = server.attempt(ids[0]), server.attempt(ids[1])
            j0, j1 = dict(a0.judge or {}), dict(a1.judge or {})
            assert j0.pop("judge_id") == "judge" and j0.pop("usage")["calls"] == 1  # for calibration, overhead
            j1.pop("usage")
            assert a0.outcome == "passed" and j0 == {"passed": True, "reason": "The printer works."}
            assert a1.outcome == "failed" and j1 == {"passed": False, "reason": "Still offline.", "judge_id": "judge"}
            first = seen[0][1]
            assert first["model"] == "judge" and first["messages"][1]["content"][1]["type"] == "image_url"
            assert "The printer prints." in first["messages"][1]["content"][0]["text"]
            await await_for(lambda: server.run(run_id).status == "completed", what="run completed")
        finally:
            await r.close()


async def test_judge_failure_is_error(server_factory: Any) -> None:
    with serve(lambda p, b: (500, {"error": "overloaded"})) as (url, _):
        server: GwServer = server_factory(judge=ModelEndpoint(base_url=url + "/v1", model="judge"))
        r = await connect(server)
        try:
            _, (aid,) = server.add_run([{"success": {"check_script": "x", "rubric": "Polite."}}])
            await r.expect("lease")
            await r.finish(aid, "passed")
            a = server.attempt(aid)
            assert a.outcome == "error" and "rubric judge" in (a.error or "") and "HTTP 500" in (a.error or "")
        finally:
            await r.close()


async def test_task_whose_agent_was_lost_in_a_server_restart_ends_with_error(server_factory: Any) -> None:
    with agent_dir() as d:
        first: GwServer = server_factory(agents=cmd_agent("hang", Path(d) / "doc.json"))
        _, token = first.add_runner()
        r = await SimRunner(first.ws_url, token, slots=1, images=["linux-tiny"]).connect()
        _, aid = await start_task(first, r, {}, "cmd")
        out = Path(d) / "doc.json"
        doc = await await_for(lambda: out.exists() and out.stat().st_size and json.loads(out.read_text()),
                              what="agent started")
        await asyncio.to_thread(stop_server, first)  # the agent (a task of that process) dies with it
        await await_for(lambda: not _alive(doc["pid"]), what="agent process killed at shutdown")
        await r.close()
        second: GwServer = server_factory(data_dir=first.state.settings.data_dir,
                                          admin_api_key=first.state.settings.admin_api_key)
        r2 = await SimRunner(second.ws_url, token, slots=1, images=["linux-tiny"], in_flight=[aid]).connect()
        try:
            assert r2.welcome is not None and r2.welcome.resume == [aid]
            end = await r2.expect("task_end", timeout=30)
            assert end.attempt_id == aid and "control plane restarted" in (end.error or "")
        finally:
            await r2.close()
