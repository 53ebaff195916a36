"""Runners and runs put straight into a gh-server's database, and its rows read back (the tests and
bench/scale_out.py use the same helpers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, select

from gh_server.auth import hash_secret, new_runner_token
from gh_server.db import make_sessionmaker
from gh_server.models import Attempt, RunCase, Runner, TestRun, new_id, utcnow
from gh_server.settings import Settings


class Rows:
    """Runners and runs put straight into a gh-server's database, and its rows read back."""

    def session(self) -> Any:
        raise NotImplementedError

    def wake(self) -> None:
        """Nudge the scheduler (a server in another process finds new rows at its next poll)."""

    def add_runner(self, name: str = "sim") -> tuple[str, str]:
        token = new_runner_token()
        rid = new_id("rn_")
        with self.session() as s:
            s.add(Runner(id=rid, name=name, token_hash=hash_secret(token)))
            s.commit()
        return rid, token

    def add_run(self, cases: list[dict[str, Any]], agents: list[str] | None = None, tries: int = 1,
                start_state: dict[str, Any] | None = None, pin: str | None = None) -> tuple[str, list[str]]:
        """A run as POST /v1/test_runs makes it: the run, frozen cases, queued attempts; then wakes the scheduler."""
        agents = agents or ["noop"]
        run_id = new_id("tr_")
        ids = []
        with self.session() as s:
            s.add(TestRun(id=run_id, agents=agents, status="queued"))
            s.flush()
            for pos, case in enumerate(cases):
                full = {"object": "test_case", "test_case_id": case.get("test_case_id") or new_id("tc_"),
                        "key": None, "name": "case", "prompt": "fix it", "start_state": "linux-tiny",
                        "setup_script": "true", "success": {"check_script": "echo True", "rubric": None},
                        "customer": None, "operator": {"approvals": "approve"}, "limits": {"minutes": 5, "steps": None},
                        "runs_on": "vm", "category": None, "tags": [], "metadata": {}, **case}
                ss = start_state or {"kind": "image", "image": full["start_state"]}
                rc = RunCase(test_run_id=run_id, test_case_id=full["test_case_id"], position=pos, tries=tries,
                             case=full, start_state=ss, runner_id=pin)
                s.add(rc)
                s.flush()
                for agent in agents:
                    for t in range(1, tries + 1):
                        aid = new_id("at_")
                        ids.append(aid)
                        s.add(Attempt(id=aid, test_run_id=run_id, run_case_id=rc.id, test_case_id=full["test_case_id"],
                                      agent_id=agent, try_number=t, status="queued", runs_on=full["runs_on"],
                                      required_runner_id=pin, created_at=utcnow()))
            s.commit()
        self.wake()
        return run_id, ids

    def attempt(self, attempt_id: str) -> Attempt:
        with self.session() as s:
            a = s.get(Attempt, attempt_id)
            assert a is not None
            s.expunge(a)
            return a

    def run(self, run_id: str) -> TestRun:
        with self.session() as s:
            r = s.get(TestRun, run_id)
            assert r is not None
            s.expunge(r)
            return r

    def attempts_of(self, run_id: str) -> list[Attempt]:

        with self.session() as s:
            rows = list(s.scalars(select(Attempt).where(Attempt.test_run_id == run_id).order_by(Attempt.created_at)))
            for r in rows:
                s.expunge(r)
            return rows

    def runner_row(self, runner_id: str) -> Runner:
        with self.session() as s:
            r = s.get(Runner, runner_id)
            assert r is not None
            s.expunge(r)
            return r



class DbRows(Rows):
    def __init__(self, url: str) -> None:


        self.engine = create_engine(Settings(data_dir=Path("/nonexistent"), database_url=url).sqlalchemy_url)
        self._db = make_sessionmaker(self.engine)

    def session(self) -> Any:
        return self._db()
