"""Long tries (issue 51): `limits.minutes` up to a server's max_task_minutes (60 by default, the Evals
API's bound; up to a day where a lab raises it), refused when a case is stored over it and again when
a run would freeze it after the setting was lowered: nothing is queued."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pydantic
import pytest
from guidinghand import InvalidRequestError

from gh_wire import protocol

from .conftest import RunningServer, Server, make_settings

CHECK = {"check_script": "echo True"}


@pytest.fixture(scope="module")
def long_server(db_url: str | None, server: Server) -> Iterator[Server]:
    """A second server with max_task_minutes 240: on PostgreSQL it shares the first's database (and
    so its admin key), on SQLite it has a database, and a key file, of its own."""
    settings, data_dir = make_settings(db_url, max_task_minutes=240)
    running = RunningServer(settings)
    running.start()
    key_file = data_dir / "admin-api-key"
    try:
        yield Server(base_url=f"http://127.0.0.1:{settings.port}",
                     admin_key=key_file.read_text().strip() if key_file.exists() else server.admin_key,
                     member_key=server.member_key,
                     state=running.app.state.gh, data_dir=data_dir)
    finally:
        running.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_the_default_bound_is_the_documented_hour(server: Server) -> None:
    made = server.admin.test_cases.create("n", "p", "linux-tiny", CHECK, limits={"minutes": 60})
    assert made["limits"]["minutes"] == 60
    with pytest.raises(InvalidRequestError) as e:
        server.admin.test_cases.create("n", "p", "linux-tiny", CHECK, limits={"minutes": 61})
    assert e.value.extra.get("param") == "limits.minutes" and e.value.extra.get("max_task_minutes") == 60
    assert "61 minutes is over this server's limit of 60 (its max_task_minutes setting)" in e.value.message


def test_a_lab_server_takes_hours_and_refuses_a_run_over_a_lowered_bound(long_server: Server) -> None:
    c = long_server.admin
    tc = c.test_cases.create("long", "p", "linux-tiny", CHECK, key="LONG-TRY", limits={"minutes": 200, "steps": 500})
    assert tc["limits"] == {"minutes": 200, "steps": 500}
    with pytest.raises(InvalidRequestError) as e:
        c.test_cases.update("LONG-TRY", limits={"minutes": 241})
    assert e.value.extra.get("param") == "limits.minutes"
    with pytest.raises(InvalidRequestError) as e:  # batch upsert: the same rule, naming the case
        c.test_cases.batch([{"key": "LONG-TRY", "name": "long", "prompt": "p", "start_state": "linux-tiny",
                             "success": CHECK, "limits": {"minutes": 300}}])
    assert e.value.extra.get("param") == "cases[0].limits.minutes"
    assert c.test_cases.retrieve("LONG-TRY")["limits"]["minutes"] == 200  # nothing lost

    run = c.test_runs.create(test_case_ids=["LONG-TRY"])
    assert run["test_run_id"].startswith("tr_")
    before = len(c.test_runs.list()["data"])
    long_server.state.settings.max_task_minutes = 120  # the operator lowered it since the case was stored
    try:
        with pytest.raises(InvalidRequestError) as e:
            c.test_runs.create(test_case_ids=["LONG-TRY"])
        assert e.value.extra.get("param") == "test_case_ids[0]" and e.value.extra.get("max_task_minutes") == 120
        assert "200 minutes is over this server's limit of 120" in e.value.message
        assert len(c.test_runs.list()["data"]) == before  # refused before anything was queued
    finally:
        long_server.state.settings.max_task_minutes = 240


def test_the_wire_carries_a_day_and_no_more() -> None:
    assert protocol.Limits(minutes=protocol.MAX_TASK_MINUTES).minutes == 1440
    with pytest.raises(pydantic.ValidationError):
        protocol.Limits(minutes=protocol.MAX_TASK_MINUTES + 1)
