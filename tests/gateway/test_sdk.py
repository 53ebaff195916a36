"""The gateway as eval authors see it through the official SDK: runners' status, runner delete,
and a run against noop and reference played by a simulated runner."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from guidinghand import Eager

from gh_server.models import RunnerJob, new_id
from gh_wire import protocol

from .conftest import GwServer, await_for
from .fakehttp import serve
from .simrunner import SimRunner, now


@pytest.fixture
def server(any_db_server: GwServer) -> GwServer:
    return any_db_server


def sdk(server: GwServer) -> Eager:
    return Eager(api_key=server.admin_key, base_url=server.base_url, max_retries=0, timeout=30)  # type: ignore[arg-type]


async def call(fn: Any, *args: Any, **kw: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kw)


async def test_runners_list_shows_hello(server: GwServer) -> None:
    client = sdk(server)
    created = await call(client.runners.create, "lab-1")
    assert created["token"].startswith("gh_rn_")
    listed = (await call(client.runners.list))["data"]
    assert [r["status"] for r in listed if r["runner_id"] == created["runner_id"]] == ["offline"]
    r = await SimRunner(server.ws_url, created["token"], name="lab-1", slots=3, labels=["lab"],
                        images=["linux-tiny"]).connect()
    try:
        row = next(x for x in (await call(client.runners.list))["data"] if x["runner_id"] == created["runner_id"])
        assert row["status"] == "online" and row["slots"] == 3 and row["labels"] == ["lab"]
        assert row["images"] == ["linux-tiny"] and row["version"] == "sim-1" and row["last_seen_at"]
        # Busy follows the runner's heartbeats.
        await r.send(protocol.Heartbeat(at=now(), busy=2))
        await await_for(lambda: next(x for x in client.runners.list()["data"]
                                     if x["runner_id"] == created["runner_id"])["busy"] == 2, what="busy 2")
    finally:
        await r.close()
    await await_for(lambda: next(x for x in client.runners.list()["data"]
                                 if x["runner_id"] == created["runner_id"])["status"] == "offline", what="offline")


async def test_runner_delete_closes_socket_at_once(server_factory: Any) -> None:
    # Heartbeats every 30 s here: the close must come from the delete itself, not the liveness check.
    server: GwServer = server_factory(heartbeat_interval=30.0, dead_after=120.0)
    client = sdk(server)
    created = await call(client.runners.create, "doomed")
    r = await SimRunner(server.ws_url, created["token"], name="doomed").connect()
    try:
        t0 = asyncio.get_running_loop().time()
        await call(client.runners.delete, created["runner_id"])
        assert await r.wait_closed(timeout=10) == protocol.CLOSE_TOKEN_REVOKED
        assert asyncio.get_running_loop().time() - t0 < 5
    finally:
        await r.close()
    again = SimRunner(server.ws_url, created["token"])
    await again.connect(send_hello=False)
    assert await again.wait_closed() == protocol.CLOSE_TOKEN_REVOKED
    await again.close()


async def test_run_against_noop_and_reference(server: GwServer) -> None:
    client = sdk(server)
    created = await call(client.runners.create, "sim")
    cases = []
    for i in range(3):
        cases.append(await call(
            client.test_cases.create, f"case {i}", "Please fix my machine", "linux-tiny",
            {"check_script": "test -f /fixed && echo True || echo False"}, key=f"CASE-{i}",
            setup_script="rm -f /fixed", metadata={"reference_fix": "touch /fixed", "reference_answer": f"ok {i}"},
        ))
    r = SimRunner(server.ws_url, created["token"], slots=4, images=["linux-tiny"])

    fixed: set[str] = set()
    answers: dict[str, str] = {}
    tasks: set[asyncio.Task[None]] = set()  # held so they are not collected mid-flight

    async def play(msg: Any) -> bool:
        """A runner whose machines are honest: the check passes only where the fix ran."""
        if isinstance(msg, protocol.Lease):
            async def go() -> None:
                await r.send(protocol.LeaseAccept(attempt_id=msg.attempt_id))
                await r.status(msg.attempt_id, "preparing")
                await r.status(msg.attempt_id, "running", "task")
            tasks.add(asyncio.create_task(go()))
            return True
        if isinstance(msg, protocol.MachineRequest):
            assert msg.op == "exec" and msg.script == "touch /fixed"
            fixed.add(str(msg.attempt_id))
            await r.send(protocol.MachineResponse(request_id=msg.request_id, ok=True, exit_code=0, stdout=""))
            return True
        if isinstance(msg, protocol.TaskEnd):
            answers[msg.attempt_id] = msg.answer
            verdict = "True" if msg.attempt_id in fixed else "False"

            async def finish() -> None:
                await r.status(msg.attempt_id, "checking")
                await r.finish(msg.attempt_id, "passed" if verdict == "True" else "failed", answer=msg.answer,
                               check_after=verdict)
            tasks.add(asyncio.create_task(finish()))
            return True
        return False

    r.on_message = play
    await r.connect()
    try:
        run = await call(client.test_runs.create, test_case_ids=[c["test_case_id"] for c in cases],
                         agents=["noop", "reference"], repeat=2)
        assert run["progress"]["total"] == 12
        done = await call(client.test_runs.wait, run["test_run_id"], poll_interval=0.2, timeout=120)
        assert done["status"] == "completed"
        assert done["pass_rate"] == {"noop": 0.0, "reference": 1.0}
        assert done["progress"] == {"total": 12, "queued": 0, "running": 0, "passed": 6, "failed": 6, "error": 0,
                                    "assisted": 0}
        attempts = list(await call(lambda: list(client.test_runs.list_all_attempts(run["test_run_id"]))))
        ref = [a for a in attempts if a["agent_id"] == "reference"]
        assert sorted(answers[a["attempt_id"]] for a in ref) == ["ok 0", "ok 0", "ok 1", "ok 1", "ok 2", "ok 2"]
        assert all(a["check"]["after"] == "True" and a["outcome"] == "passed" for a in ref)
    finally:
        await r.close()


async def test_queued_jobs_delivered_on_connect(server: GwServer) -> None:
    rid, token = server.add_runner()
    job_id = new_id("jb_")
    payload = protocol.Job(job_id=job_id, op="delete", start_state_id="ss_x", version=1).model_dump(mode="json")
    with server.session() as s:
        s.add(RunnerJob(id=job_id, runner_id=rid, start_state_id="ss_x", op="delete", payload=payload))
        s.commit()
    r = await SimRunner(server.ws_url, token).connect()
    try:
        job = await r.expect("job")
        assert job.job_id == job_id and job.op == "delete"
        await await_for(lambda: _job_status(server, job_id) == "sent", what="job sent")
        await r.send(protocol.JobResult(job_id=job_id, ok=True, start_state_id="ss_x"))
        await await_for(lambda: _job_status(server, job_id) not in ("queued", "sent"), what="job closed")
    finally:
        await r.close()


def _job_status(server: GwServer, job_id: str) -> str:
    with server.session() as s:
        row = s.get(RunnerJob, job_id)
        assert row is not None
        return row.status


async def test_completed_run_sends_signed_webhook(server: GwServer) -> None:
    from guidinghand import verify_webhook

    client = sdk(server)
    raw: list[tuple[bytes, dict[str, str]]] = []
    with serve(lambda p, b: (200, {}), raw) as (url, _):
        hook = await call(client._request, "PUT", "/v1/webhook", body={"url": url + "/hook",
                                                                       "events": ["test_run.completed"]})
        created = await call(client.runners.create, "sim")
        case = await call(client.test_cases.create, "c", "p", "linux-tiny", {"check_script": "echo True"})
        r = await SimRunner(server.ws_url, created["token"], slots=1, images=["linux-tiny"]).connect()
        try:
            run = await call(client.test_runs.create, test_case_ids=[case["test_case_id"]], agents=["noop"])
            lease = await r.expect("lease")
            await r.finish(lease.attempt_id, "failed", check_after="False")
            await await_for(lambda: len(raw) >= 1, timeout=60, what="webhook delivered")
        finally:
            await r.close()
    body, headers = raw[0]
    sig = next(v for k, v in headers.items() if k.lower() == "eager-signature")
    event = verify_webhook(body, sig, hook["secret"])
    assert event["type"] == "test_run.completed"
    obj = event["data"]["test_run"]
    assert obj["test_run_id"] == run["test_run_id"] and obj["status"] == "completed"
    assert obj["progress"]["failed"] == 1 and obj["pass_rate"] == {"noop": 0.0}


async def test_deleting_a_busy_runner_errors_and_retries_its_attempts(server: GwServer) -> None:
    client = sdk(server)
    created = await call(client.runners.create, "doomed")
    r = await SimRunner(server.ws_url, created["token"], name="doomed", slots=1, images=["linux-tiny"]).connect()
    try:
        run_id, (aid,) = server.add_run([{}])
        await r.expect("lease")
        await r.status(aid, "running")
        await call(client.runners.delete, created["runner_id"])
        assert await r.wait_closed(timeout=10) == protocol.CLOSE_TOKEN_REVOKED
        a = await await_for(lambda: server.attempt(aid).status == "done" and server.attempt(aid), what="errored")
        assert a.outcome == "error" and a.error == "runner doomed was deleted while the attempt ran"
        retry = [x for x in server.attempts_of(run_id) if x.retry_of == aid]
        assert len(retry) == 1 and retry[0].status == "queued"
    finally:
        await r.close()
