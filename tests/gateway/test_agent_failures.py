"""The audit of the external agents' paths (docs/agents.md, "What ends a task"), one row each: which ends are the
agent's (the task ends with a reason, the check decides) and which are ours (AgentError: the attempt is an error).
The agents run for real: a child process for the command agent, a real local HTTP server (or a port nobody listens
on) for the HTTP agent."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from agentfiles import AGENT_PYTHON
from kit.net import free_port

from gh_server.agents.base import AgentContext, AgentError, AgentFailed, Machine
from gh_server.agents.builtin import ReferenceAgent
from gh_server.agents.external import CommandAgent, HttpAgent
from gh_server.agents.sandbox import Sandbox
from gh_server.settings import Settings
from gh_wire.protocol import TaskEndReason
from gh_wire.vocab import AgentFault

from .fakehttp import serve


def _ctx(minutes: int = 1, case: dict[str, Any] | None = None) -> AgentContext:
    async def relay(*_a: Any) -> Any:
        raise AssertionError("no machine request expected")

    return AgentContext(attempt_id="at_x", runner_id="rn_x", agent_id="a", test_run_id="tr_x",
                        case={"limits": {"minutes": minutes}, **(case or {})},
                        machine=Machine(relay, "rn_x", "at_x"), machine_api_url="http://127.0.0.1:9/x",
                        machine_api_token="t")


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    """The sandbox gh-server runs every command agent in (its own uid), from default settings."""
    return Sandbox.for_settings(Settings(data_dir=tmp_path / "data"))


async def test_command_agent_out_of_time_is_its_time_limit(sandbox: Sandbox) -> None:
    agent = CommandAgent("slow", [AGENT_PYTHON, "-c", "import time; time.sleep(60)"], timeout=0.5, sandbox=sandbox)
    out = await agent.run(_ctx())
    assert out.reason == TaskEndReason.TIME_LIMIT and out.answer == ""


async def test_command_agent_exit_nonzero_is_its_failure(sandbox: Sandbox) -> None:
    agent = CommandAgent("bad", [AGENT_PYTHON, "-c", "import sys; print('no', file=sys.stderr); sys.exit(2)"],
                         timeout=30, sandbox=sandbox)
    with pytest.raises(AgentFailed, match="exited with code 2: no"):
        await agent.run(_ctx())


async def test_command_agent_that_cannot_start_is_ours(sandbox: Sandbox) -> None:
    agent = CommandAgent("missing", ["/nonexistent/agent-binary"], timeout=30, sandbox=sandbox)
    with pytest.raises(AgentError, match="could not start"):
        await agent.run(_ctx())


async def test_http_agent_out_of_time_is_its_time_limit() -> None:
    def reply(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        import time

        time.sleep(2)
        return 200, {"answer": "late"}

    with serve(reply) as (url, _seen):
        out = await HttpAgent("slow", url, timeout=0.3).run(_ctx())
    assert out.reason == TaskEndReason.TIME_LIMIT


async def test_http_agent_garbage_is_its_failure() -> None:
    import http.server
    import threading

    class Garbage(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", "5")
            self.end_headers()
            self.wfile.write(b"{nope")

        def log_message(self, *a: Any) -> None:
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Garbage)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        with pytest.raises(AgentFailed, match="invalid JSON"):
            await HttpAgent("g", f"http://127.0.0.1:{srv.server_address[1]}/", timeout=30).run(_ctx())
    finally:
        srv.shutdown()
        srv.server_close()


async def test_http_agent_nobody_listening_is_ours() -> None:
    port = free_port()  # nothing listens there: connection refused
    with pytest.raises(AgentError, match="could not be reached"):
        await HttpAgent("gone", f"http://127.0.0.1:{port}/", timeout=30).run(_ctx())


async def test_reference_without_a_fix_is_a_broken_case_ours() -> None:
    with pytest.raises(AgentError, match=r"needs metadata\.reference_fix"):
        await ReferenceAgent().run(_ctx())
    with pytest.raises(AgentError, match="must be a script"):
        await ReferenceAgent().run(_ctx(case={"metadata": {"reference_fix": 3}}))


@pytest.mark.parametrize(("body", "charset", "fault"), [
    (b"fixed \xff\xfe it", "latin-1", AgentFault.ANSWER_NOT_UTF8),  # whatever its charset says: UTF-8 or its error
    (b"y" * (2 * 1024 * 1024), "utf-8", AgentFault.ANSWER_TOO_LONG),  # read no further than 1 MiB
])
async def test_http_agent_reply_breaking_the_answers_contract_is_its_failure(body: bytes, charset: str,
                                                                            fault: AgentFault) -> None:
    import http.server
    import threading

    class Raw(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(200)
            self.send_header("content-type", f"text/plain; charset={charset}")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

        def log_message(self, *a: Any) -> None:
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Raw)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        with pytest.raises(AgentFailed) as got:
            await HttpAgent("raw", f"http://127.0.0.1:{srv.server_address[1]}/", timeout=30).run(_ctx())
        assert got.value.fault == fault
    finally:
        srv.shutdown()
        srv.server_close()
