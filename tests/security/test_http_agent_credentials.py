"""An HTTP agent gets the request document and its configured headers, nothing of gh-server's own: not
the admin key, not credentials gh-server's environment would lend a plain HTTP client (a netrc entry
for the agent's host), not the case's fix, check or secret facts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gateway.conftest import GwServer
from gateway.fakehttp import serve
from gateway.simrunner import SimRunner

from gh_server.settings import AgentConfig
from gh_wire import protocol

CASE = {"prompt": "printer offline", "metadata": {"reference_fix": "FIX-SECRET-1"},
        "success": {"check_script": "echo CHECK-SECRET-2", "rubric": None},
        "customer": {"facts": {"Wi-Fi password": {"secret": "FACT-SECRET-3"}}}}


async def test_http_agent_gets_no_server_credentials(server_factory: Any, monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login gh-server password NETRC-SECRET-4\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))  # what gh-server's environment might hold for this host
    raw: list[tuple[bytes, dict[str, str]]] = []
    with serve(lambda _p, _b: (200, {"answer": "done"}), raw) as (url, _seen):
        srv: GwServer = server_factory(agents={"web": AgentConfig(id="web", kind="http", url=url + "/act",
                                                                  headers={"X-Agent-Key": "configured"})})
        monkeypatch.setenv("GH_SERVER_API_KEY", srv.admin_key)
        _, token = srv.add_runner()
        r = await SimRunner(srv.ws_url, token, slots=1, images=["linux-tiny"]).connect()
        try:
            _, (aid,) = srv.add_run([CASE], agents=["web"])
            await r.expect("lease")
            await r.send(protocol.LeaseAccept(attempt_id=aid))
            await r.status(aid, "running", "task")
            end = await r.expect("task_end", timeout=60)
            assert end.error is None and end.answer == "done"
        finally:
            await r.close()
    (body, headers), = raw
    assert headers.get("X-Agent-Key") == "configured"  # what the agent's config names, and only that
    assert "Authorization" not in headers and "Cookie" not in headers, headers
    everything = body.decode() + repr(headers)
    for secret in (srv.admin_key, "NETRC-SECRET-4", "FIX-SECRET-1", "CHECK-SECRET-2", "FACT-SECRET-3"):
        assert secret not in everything
