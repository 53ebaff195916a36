"""A locked database answers 503 with Retry-After after the (short) busy timeout, not a bare 500 after
30 s, and /healthz says degraded until the lock is gone."""

from __future__ import annotations

import sqlite3
from typing import Any

import httpx
from gateway.conftest import GwServer

CASE = {"name": "n", "prompt": "p", "start_state": "linux-tiny", "success": {"check_script": "echo False"}}


def test_locked_database_is_503_with_retry_after_and_healthz_degraded(server_factory: Any) -> None:
    srv: GwServer = server_factory(db_busy_timeout=0.3, gateway=False)
    path = srv.state.settings.data_dir / "gh-server.db"
    with httpx.Client(base_url=srv.base_url, timeout=30, headers={"Authorization": f"Bearer {srv.admin_key}"}) as c:
        assert c.get("/healthz").json() == {"ok": True}
        other = sqlite3.connect(path, isolation_level=None)  # another process's writer, as far as SQLite knows
        try:
            other.execute("BEGIN EXCLUSIVE")
            resp = c.post("/v1/test_cases", json=CASE)
            assert resp.status_code == 503, resp.text
            assert resp.headers["retry-after"] == "5"
            assert resp.json()["error"] == {"type": "server_error",
                                            "message": "The database is busy; retry in a few seconds."}
            assert c.get("/v1/test_cases").status_code == 200  # reads go on (WAL)
            health = c.get("/healthz")
            assert health.status_code == 503 and health.headers["retry-after"] == "5"
            assert health.json() == {"ok": False, "status": "degraded", "database": "locked"}
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert c.get("/healthz").json() == {"ok": True}
        assert c.post("/v1/test_cases", json=CASE).status_code == 200
