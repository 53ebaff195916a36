# mypy: disable-error-code="arg-type,list-item,typeddict-item,misc,index"
"""Runners and start states through the SDK. The gateway is a recording fake at the GatewayPort boundary
(the real one is tested in tests/gateway): kick on delete, jobs sent, screen/input relayed."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pydantic
import pytest
from guidinghand import ConflictError, InvalidRequestError, NotFoundError, PermissionDeniedError
from sqlalchemy import select

from gh_server.auth import hash_secret
from gh_server.models import Runner, RunnerJob, StartState, StartStateVersion, utcnow
from gh_wire import protocol

from .conftest import Server

PNG = b"\x89PNG\r\n\x1a\nfake"


class FakeGateway:
    def __init__(self, connected: set[str]) -> None:
        self._connected = connected
        self.kicked: list[tuple[str, int, str]] = []
        self.sent: list[tuple[str, pydantic.BaseModel]] = []
        self.requests: list[tuple[str, protocol.MachineRequest]] = []

    async def kick(self, runner_id: str, code: int, reason: str) -> None:
        self.kicked.append((runner_id, code, reason))

    async def machine_request(
        self, runner_id: str, req: protocol.MachineRequest, timeout: float
    ) -> protocol.MachineResponse:
        self.requests.append((runner_id, req))
        if req.op == "screen":
            return protocol.MachineResponse(request_id=req.request_id, ok=True, png_b64=base64.b64encode(PNG).decode())
        return protocol.MachineResponse(request_id=req.request_id, ok=True)

    async def send(self, runner_id: str, msg: pydantic.BaseModel) -> bool:
        self.sent.append((runner_id, msg))
        return runner_id in self._connected

    def connected(self, runner_id: str) -> bool:
        return runner_id in self._connected

    @property
    def agents(self) -> Any:
        raise AssertionError("these API tests run no agents")


@pytest.fixture
def gateway(server: Server) -> Iterator[FakeGateway]:
    gw = FakeGateway(set())
    server.state.gateway = gw
    yield gw
    server.state.gateway = None


def _hello(server: Server, runner_id: str, images: list[str], labels: list[str], online: bool = True) -> None:
    """What the gateway writes on hello (the row is the contract between it and the API)."""
    with server.state.db.begin() as s:
        r = s.get(Runner, runner_id)
        assert r is not None
        r.images = [{"name": n, "os": "linux", "version": "1", "checksum": "sha256:x"} for n in images]
        r.labels, r.slots, r.busy, r.version = labels, 4, 1, "0.1.0"
        r.session_id = "sess-1" if online else None
        r.last_seen_at = r.connected_at = utcnow()


def test_runner_create_list_delete(server: Server, gateway: FakeGateway) -> None:
    c = server.admin
    made = c.runners.create("lab-1")
    assert made["object"] == "runner" and made["runner_id"].startswith("rn_")
    assert made["token"].startswith("gh_rn_") and made["status"] == "offline" and made["scope"] == "org"
    with server.state.db() as s:
        row = s.get(Runner, made["runner_id"])
        assert row is not None and row.token_hash == hash_secret(made["token"]) and made["token"] not in row.token_hash
    listed = {r["runner_id"]: r for r in server.member.runners.list(include="total_count")["data"]}
    assert "token" not in listed[made["runner_id"]]
    _hello(server, made["runner_id"], ["linux-tiny"], ["lab", "x86"])
    got = next(r for r in c.runners.list(q="lab-1")["data"])
    assert (got["status"], got["busy"], got["slots"], got["images"], got["labels"], got["version"]) == (
        "online",
        1,
        4,
        ["linux-tiny"],
        ["lab", "x86"],
        "0.1.0",
    )
    assert got["last_seen_at"].endswith("Z")
    with pytest.raises(PermissionDeniedError):
        server.member.runners.create("nope")
    with pytest.raises(PermissionDeniedError):
        server.member.runners.delete(made["runner_id"])
    with pytest.raises(InvalidRequestError) as e:
        c.runners.create("")
    assert e.value.extra["param"] == "name"
    gone = c.runners.delete(made["runner_id"])
    assert gone == {"object": "runner", "runner_id": made["runner_id"], "deleted": True}
    assert gateway.kicked == [(made["runner_id"], 4001, "runner deleted: its token was revoked")]
    with server.state.db() as s:
        row = s.get(Runner, made["runner_id"])
        assert row is not None and row.revoked_at is not None and row.token_hash != hash_secret(made["token"])
    assert made["runner_id"] not in [r["runner_id"] for r in c.runners.list_all()]
    with pytest.raises(NotFoundError):
        c.runners.delete(made["runner_id"])


def test_start_states_flow(server: Server, gateway: FakeGateway) -> None:
    c = server.admin
    rn = c.runners.create("ss-runner")
    rid = rn["runner_id"]
    _hello(server, rid, ["img-a", "img-b"], ["lab"])
    gateway._connected.add(rid)
    listed = c.start_states.list(kind="image")["data"]
    names = [x["name"] for x in listed]
    assert "img-a" in names and all(x["kind"] == "image" for x in listed)
    img = next(x for x in listed if x["name"] == "img-a")
    assert img["status"] == "ready" and img["labels"] == ["lab"] and img["from"] is None
    with pytest.raises(InvalidRequestError) as e:
        c.start_states.create("bad", "no-such-image", script="true")
    assert e.value.extra["param"] == "from"
    with pytest.raises(PermissionDeniedError):
        server.member.start_states.create("m", "img-a", script="true")
    built = c.start_states.create(
        "with app", "img-a", script="apt install app", description="has the app", metadata={"k": "v"}
    )
    assert built["status"] == "building" and built["method"] == "script" and built["kind"] == "state"
    assert built["runner_id"] == rid and built["from"] == "img-a" and built["version"] == 0
    assert built["description"] == "has the app" and built["labels"] == ["lab"]
    assert c.start_states.retrieve(built["start_state_id"])["os"] == "linux"
    job = gateway.sent[-1][1]
    assert isinstance(job, protocol.Job) and job.op == "build" and job.script == "apt install app"
    assert job.source is not None and job.source.image == "img-a" and job.start_state_id == built["start_state_id"]
    with server.state.db() as s:
        jr = s.get(RunnerJob, job.job_id)
        assert jr is not None and jr.status == "sent" and jr.runner_id == rid
    ssid = built["start_state_id"]
    # list: images first on the first page, then states; q and kind filters
    page = c.start_states.list()
    kinds = [x["kind"] for x in page["data"]]
    assert kinds == sorted(kinds)  # "image" < "state": every image before every state
    assert ssid in [x["start_state_id"] for x in c.start_states.list(kind="state", q="with app")["data"]]
    with pytest.raises(ConflictError):
        c.start_states.open(ssid)  # still building
    # the runner's job_result (the start-state engineer's code) makes version 1 ready: emulate its write
    with server.state.db.begin() as s:
        ss = s.get(StartState, ssid)
        assert ss is not None
        ss.status, ss.version = "ready", 1
        s.add(StartStateVersion(start_state_id=ssid, version=1, runner_id=rid))
    up = c.start_states.update(ssid, name="renamed", description="d2")
    assert up["name"] == "renamed" and up["description"] == "d2" and up["metadata"] == {"k": "v"}
    opened = c.start_states.open(ssid)
    assert opened["status"] == "open" and opened["view"] is not None
    assert gateway.sent[-1][1].op == "open" and gateway.sent[-1][1].source.version == 1
    assert c.start_states.screen(ssid) == PNG
    out = c.start_states.input(ssid, [{"type": "click", "x": 10, "y": 20}, {"type": "type", "text": "hi"}])
    assert out["ok"] is True
    req = gateway.requests[-1][1]
    assert req.op == "input" and len(req.events) == 2 and req.job_id is not None
    with pytest.raises(InvalidRequestError):
        c.start_states.input(ssid, [{"type": "teleport"}])
    saving = c.start_states.save(ssid)
    assert saving["status"] == "saving" and gateway.sent[-1][1].op == "save" and gateway.sent[-1][1].version == 2
    with pytest.raises(ConflictError):
        c.start_states.close(ssid)  # not open any more
    # a case that uses it blocks deletion with in_use and the case ids
    tc = c.test_cases.create("uses ss", "p", ssid, {"rubric": "r"})
    with pytest.raises(ConflictError) as e:
        c.start_states.delete(ssid)
    assert e.value.extra["code"] == "in_use" and e.value.extra["test_case_ids"] == [tc["test_case_id"]]
    # a run freezes the state's version and pins its holder
    run = c.test_runs.create(test_case_ids=[tc["test_case_id"]], agents=["noop"])
    detail = c.test_runs.attempts(run["test_run_id"])["data"][0]
    assert detail["test_case_id"] == tc["test_case_id"]
    from gh_server.models import Attempt, RunCase

    with server.state.db() as s:
        rc = s.scalar(select(RunCase).where(RunCase.test_run_id == run["test_run_id"]))
        assert rc is not None and rc.runner_id == rid
        assert rc.start_state == {"kind": "state", "image": "img-a", "start_state_id": ssid, "version": 1}
        at = s.scalar(select(Attempt).where(Attempt.test_run_id == run["test_run_id"]))
        assert at is not None and at.required_runner_id == rid
    c.test_runs.delete(run["test_run_id"])
    c.test_cases.delete(tc["test_case_id"])
    assert c.start_states.delete(ssid) == {"object": "start_state", "start_state_id": ssid, "deleted": True}
    assert gateway.sent[-1][1].op == "delete"
    with pytest.raises(NotFoundError):
        c.start_states.retrieve(ssid)


def test_hand_made_state_closed_unsaved_is_deleted(server: Server, gateway: FakeGateway) -> None:
    c = server.admin
    rn = c.runners.create("hand-runner")
    _hello(server, rn["runner_id"], ["img-h"], [])
    hand = c.start_states.create("by hand", "img-h")
    assert hand["method"] == "hand" and hand["status"] == "open"
    with pytest.raises(ConflictError) as e:  # its runner is not connected to this server
        c.start_states.screen(hand["start_state_id"])
    assert e.value.extra["code"] == "not_connected"
    uses = c.test_cases.create("uses unsaved", "p", hand["start_state_id"], {"rubric": "r"})
    with pytest.raises(InvalidRequestError) as e:  # no saved version to freeze yet
        c.test_runs.create(test_case_ids=[uses["test_case_id"]], agents=["noop"])
    assert e.value.extra["param"] == "test_case_ids[0]" and "no saved version" in e.value.message
    c.test_cases.delete(uses["test_case_id"])
    closed = c.start_states.close(hand["start_state_id"])
    assert closed["start_state_id"] == hand["start_state_id"]
    with pytest.raises(NotFoundError):
        c.start_states.retrieve(hand["start_state_id"])
    with server.state.db() as s:
        ops = [j.op for j in s.scalars(select(RunnerJob).where(RunnerJob.start_state_id == hand["start_state_id"]))]
        jobs_queued = [j.status for j in s.scalars(select(RunnerJob).where(RunnerJob.runner_id == rn["runner_id"]))]
    assert sorted(ops) == ["close", "open"] and set(jobs_queued) == {"queued"}  # not connected: left for the gateway


def test_job_results_move_the_state_and_send_webhooks(server: Server, gateway: FakeGateway) -> None:
    from gh_server.models import WebhookDelivery
    from gh_server.start_states import apply_job_result

    c = server.admin
    rn = c.runners.create("job-runner")
    rid = rn["runner_id"]
    _hello(server, rid, ["img-j"], [])
    c.webhook.update(url="http://127.0.0.1:9/never")  # nothing listens: deliveries stay queued for this check
    built = c.start_states.create("jobbed", "img-j", script="true")
    failed = c.start_states.create("jobbed-bad", "img-j", script="false")
    with server.state.db() as s:
        jobs = {j.start_state_id: j.id for j in s.scalars(select(RunnerJob).where(RunnerJob.runner_id == rid))}
    ok = protocol.JobResult(
        job_id=jobs[built["start_state_id"]], ok=True, start_state_id=built["start_state_id"], version=1, size_bytes=123
    )
    bad = protocol.JobResult(job_id=jobs[failed["start_state_id"]], ok=False, error="script exited 1")
    with server.state.db.begin() as s:
        assert apply_job_result(s, "rn_someoneelse", ok) is False
        assert apply_job_result(s, rid, ok) is True
        assert apply_job_result(s, rid, ok) is True  # again: no second version, no second event
        assert apply_job_result(s, rid, bad) is True
    got = c.start_states.wait(built["start_state_id"], timeout=5, poll_interval=0.1)
    assert got["status"] == "ready" and got["version"] == 1 and got["runner_id"] == rid
    bad_state = c.start_states.retrieve(failed["start_state_id"])
    assert bad_state["status"] == "failed" and bad_state["error"] == "script exited 1"
    with server.state.db() as s:
        events = [
            (d.event_type, d.payload["data"]["start_state"]["start_state_id"])
            for d in s.scalars(select(WebhookDelivery).where(WebhookDelivery.event_type.like("start_state.%")))
        ]
        runner = s.get(Runner, rid)
        assert runner is not None and {"start_state_id": built["start_state_id"], "version": 1} in runner.held_versions
    assert ("start_state.ready", built["start_state_id"]) in events
    assert ("start_state.failed", failed["start_state_id"]) in events
    assert len([e for e in events if e[1] == built["start_state_id"]]) == 1
    c.webhook.delete()


def test_deletes_reach_every_runner_that_holds_a_version(server: Server, gateway: FakeGateway) -> None:
    """A version collected, and then the whole state deleted: the `delete` job goes to the runner that
    saved it, to a runner whose hello listed it (pulled from the registry), and to a runner an attempt
    on it ran on (it pulled it since its last hello); not to a runner without it, nor a revoked one."""
    from gh_server.models import Attempt, RunCase, TestRun
    from gh_server.start_state_jobs import collect_versions

    c = server.admin
    saver, puller, ran, other, gone = (c.runners.create(f"holder-{n}")["runner_id"]
                                       for n in ("saver", "puller", "ran", "other", "gone"))
    _hello(server, saver, ["img-del"], [])
    gateway._connected.add(saver)
    ssid = c.start_states.create("shared", "img-del", script="true")["start_state_id"]
    for rid in (puller, ran, other, gone):
        _hello(server, rid, ["img-del"], [])
        gateway._connected.add(rid)
    c.runners.delete(gone)
    with server.state.db.begin() as s:  # what the save jobs' results and the hellos wrote
        ss = s.get(StartState, ssid)
        assert ss is not None and ss.runner_id == saver
        ss.status, ss.version = "ready", 3
        for v in (1, 2, 3):
            s.add(StartStateVersion(start_state_id=ssid, version=v, runner_id=saver, size_bytes=1000))
        for rid, held in ((puller, [(ssid, 1), (ssid, 3)]), (other, [("ss_elsewhere", 1)]), (gone, [(ssid, 1)])):
            row = s.get(Runner, rid)
            assert row is not None
            row.held_versions = [{"start_state_id": a, "version": v} for a, v in held]
        # `ran` ran an attempt on v1 (pulled it then), in a run long finished.
        run_id = "tr_pulled" + ssid[-6:]
        s.add(TestRun(id=run_id, status="completed", agents=["noop"]))
        s.flush()
        rc = RunCase(test_run_id=run_id, test_case_id="tc_pulled", case={},
                     start_state={"kind": "state", "image": "img-del", "start_state_id": ssid, "version": 1})
        s.add(rc)
        s.flush()
        s.add(Attempt(id="at_pulled" + ssid[-6:], test_run_id=run_id, run_case_id=rc.id, test_case_id="tc_pulled",
                      agent_id="noop", try_number=1, status="done", runner_id=ran))
    with server.state.db.begin() as s:
        collect_versions(s)  # (or the server's own housekeeping got there first: either way once)

    def deletes() -> dict[int | None, list[str]]:
        with server.state.db() as s:
            out: dict[int | None, list[str]] = {}
            for j in s.scalars(select(RunnerJob).where(RunnerJob.start_state_id == ssid, RunnerJob.op == "delete")):
                out.setdefault(j.payload.get("version"), []).append(str(j.runner_id))
            return {v: sorted(rids) for v, rids in out.items()}

    assert deletes() == {1: sorted([saver, puller, ran]), 2: [saver]}
    with server.state.db() as s:
        row = s.get(Runner, puller)
        # No lease counts on v1 there any more.
        assert row is not None and row.held_versions == [{"start_state_id": ssid, "version": 3}]

    assert c.start_states.delete(ssid)["deleted"] is True
    assert deletes()[None] == sorted([saver, puller, ran])
    sent = {rid for rid, msg in gateway.sent if isinstance(msg, protocol.Job) and msg.op == "delete"
            and msg.start_state_id == ssid and msg.version is None}
    assert sent == {saver, puller, ran}
