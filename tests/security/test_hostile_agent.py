"""A hostile command agent, two attempts at once: every try at what grades it fails, and the attempt's
answer (what the agent saw) proves it. Runs the default sandbox of a root gh-server: group gh-agent
and a uid of its own per attempt (gh_server.agents.sandbox)."""

from __future__ import annotations

import glob
import json
import os
import secrets
from pathlib import Path
from typing import Any

import pytest
from agentfiles import agent_command
from gateway.conftest import GwServer
from gateway.simrunner import SimRunner

from gh_server.settings import AgentConfig
from gh_wire import protocol

HOSTILE = Path(__file__).with_name("hostile_agent.py")


@pytest.mark.skipif(os.geteuid() != 0, reason="the user sandbox needs a root gh-server (CI runs as root)")
async def test_hostile_agent_reaches_nothing(server_factory: Any, monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    canary = "canary-" + secrets.token_hex(8)
    monkeypatch.setenv("GH_SECURITY_CANARY", canary)  # in gh-server's environment: must not reach the agent
    nonce = secrets.token_hex(6)
    data_dir = tmp_path / "server-data"
    data_dir.mkdir()
    # This server's admin key comes from settings; a generated one would be in this file, so one is.
    key_file = data_dir / "admin-api-key"
    key_file.write_text(canary + "\n")
    key_file.chmod(0o600)
    cmd = agent_command(HOSTILE, str(data_dir), str(os.getpid()), nonce)
    srv: GwServer = server_factory(data_dir=data_dir, agents={
        "hostile": AgentConfig(id="hostile", kind="command", command=cmd, timeout=120)})
    _, token = srv.add_runner()
    r = await SimRunner(srv.ws_url, token, slots=2, images=["linux-tiny"]).connect()
    try:
        _, ids = srv.add_run([{}], agents=["hostile"], tries=2)
        for _ in ids:
            lease = await r.expect("lease")
            await r.send(protocol.LeaseAccept(attempt_id=lease.attempt_id))
            await r.status(lease.attempt_id, "preparing")
            await r.status(lease.attempt_id, "running", "task")
        ends = [await r.expect("task_end", timeout=90) for _ in ids]
    finally:
        await r.close()
        for f in glob.glob(f"/tmp/gh-hostile-{nonce}-*"):
            os.unlink(f)
    for end in ends:
        assert end.error is None, end.error
        seen = json.loads(end.answer)
        assert canary not in end.answer
        assert "peer" not in seen, seen  # the two ran at once, so each tried the other
        leaked = {k: v for k, v in seen.items() if not v.startswith("denied")}
        assert not leaked, leaked
        assert set(seen) >= {"environment", "data_dir", "admin_key", "database", "server_environ", "server_fds",
                             "evals_api", "peer_environ", "peer_stdin", "peer_home", "view_ticket",
                             "attempt_view_ticket", "runner_view_socket", "live_view_socket", "libvirt_domain_dirs",
                             "vnc_tcp"}
        assert seen["runner_view_socket"] == "denied: closed 4001 unknown or revoked runner token", seen
        assert seen["live_view_socket"] == "denied: closed 4010 ticket_invalid", seen
        assert seen["attempt_view_ticket"] == "denied: HTTP 401", seen  # the endpoint is there: the token is no key
