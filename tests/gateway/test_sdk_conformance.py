# mypy: disable-error-code="arg-type,list-item,typeddict-item,typeddict-unknown-key,misc,index,call-overload"
"""Every evals method of the official guidinghand SDK (0.25.0) against a real gh-server.

The server is the real app on uvicorn with its gateway; the machines are a simulated runner speaking
the real protocol (tests/gateway/simrunner.py), so runs finish and start states build without a guest.
What each call must return is the SDK's own contract: its docstrings and `_types.py` (read in
.venv/.../guidinghand/_client.py), and the product documentation it was written against. The last test
checks that every public method of the SDK's evals resources was called here, so a method added to the
SDK (or one left out of this file) fails CI rather than going untried. SQLite only: the storage rules
are covered on both databases in tests/server; this suite is about the HTTP contract.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pydantic
import pytest
from guidinghand import (
    AsyncEager,
    ConflictError,
    Eager,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
)

from gh_server.auth import create_key
from gh_server.settings import AgentConfig
from gh_wire import protocol

from .conftest import GwServer, await_for
from .simrunner import SimRunner

PNG = b"\x89PNG\r\n\x1a\n" + b"sim-screen"
CHECK = {"check_script": "test -f /fixed && echo True || echo False"}

# -- which SDK methods this file drives --------------------------------------------------------

# The SDK's evals resources, as `Eager` exposes them (the `# evals` section of _client.py, plus the
# webhook endpoint that evals events go to).
EVALS_RESOURCES = ("test_cases", "test_sets", "test_runs", "attempts", "start_states", "runners", "webhook")
CALLED: set[str] = set()
_depth = threading.local()


def evals_methods() -> dict[str, type]:
    client = Eager(api_key="gh_live_enumerate", base_url="http://127.0.0.1:9")
    try:
        return {name: type(getattr(client, name)) for name in EVALS_RESOURCES}
    finally:
        client.close()


def public_methods(cls: type) -> list[str]:
    return sorted(n for n, v in vars(cls).items() if callable(v) and not n.startswith("_"))


def _recording(resource: str, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    # Only the outermost call counts: list_all calls list and wait calls retrieve, which must not count
    # as having driven list or retrieve themselves.
    @functools.wraps(fn)
    def wrapper(*args: Any, **kw: Any) -> Any:
        depth = getattr(_depth, "n", 0)
        if depth == 0:
            CALLED.add(f"{resource}.{name}")
        _depth.n = depth + 1
        try:
            result = fn(*args, **kw)
            if hasattr(result, "__next__"):  # a list_all generator: consume it under the same depth
                result = list(result)
            return result
        finally:
            _depth.n = depth

    return wrapper


@pytest.fixture(scope="module", autouse=True)
def _record_sdk_calls() -> Any:
    with pytest.MonkeyPatch.context() as mp:
        for resource, cls in evals_methods().items():
            for name in public_methods(cls):
                mp.setattr(cls, name, _recording(resource, name, getattr(cls, name)))
        yield


# -- the lab: a real server, its keys, and a simulated runner that plays what it is sent ------


def clients(server: GwServer) -> tuple[Eager, Eager]:
    with server.state.db.begin() as s:
        _row, member_key = create_key(s, "member for the SDK suite", "member")
    admin = Eager(api_key=server.admin_key, base_url=server.base_url, max_retries=0, timeout=30)
    member = Eager(api_key=member_key, base_url=server.base_url, max_retries=0, timeout=30)
    return admin, member


async def call(fn: Any, *args: Any, **kw: Any) -> Any:
    """The sync SDK off the event loop, which the simulated runner needs to answer meanwhile."""
    return await asyncio.to_thread(fn, *args, **kw)


class Lab:
    """A simulated runner that answers as a working host would: a lease is accepted and finished
    (`reference` passes, every other agent fails, as `noop` must), a job succeeds with the version it
    was asked for, a screen is a PNG and input is taken. `hold` keeps leases unanswered."""

    def __init__(self, server: GwServer, token: str, images: list[str]) -> None:
        self.runner = SimRunner(server.ws_url, token, slots=4, labels=["lab"], images=images)
        self.runner.on_message = self._on_message
        self.hold = False
        self.held: list[protocol.Lease] = []
        self.jobs: list[protocol.Job] = []
        self.requests: list[protocol.MachineRequest] = []
        self._tasks: set[asyncio.Task[None]] = set()  # held so they are not collected mid-flight

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _on_message(self, msg: Any) -> bool:
        r = self.runner
        if isinstance(msg, protocol.Lease):
            if self.hold:
                self.held.append(msg)
            else:
                self._spawn(self._play(msg))
            return True
        if isinstance(msg, protocol.Job):
            self.jobs.append(msg)
            version = msg.version if msg.op in ("build", "save") else None
            await r.send(protocol.JobResult(job_id=msg.job_id, ok=True, start_state_id=msg.start_state_id,
                                            version=version, size_bytes=1024 if version else None))
            return True
        if isinstance(msg, protocol.MachineRequest):
            self.requests.append(msg)
            png = base64.b64encode(PNG).decode() if msg.op == "screen" else None
            await r.send(protocol.MachineResponse(request_id=msg.request_id, ok=True, png_b64=png, exit_code=0,
                                                  stdout=""))
            return True
        return False

    async def _play(self, lease: protocol.Lease) -> None:
        r = self.runner
        await r.send(protocol.LeaseAccept(attempt_id=lease.attempt_id))
        await r.status(lease.attempt_id, "running", "task")
        verdict = "True" if lease.agent_id == "reference" else "False"
        await r.finish(lease.attempt_id, "passed" if verdict == "True" else "failed", check_after=verdict)


@contextlib.asynccontextmanager
async def lab(server: GwServer, admin: Eager, images: list[str] | None = None) -> AsyncIterator[Lab]:
    made = await call(admin.runners.create, "sim-lab")
    the_lab = Lab(server, made["token"], images or ["linux-tiny"])
    await the_lab.runner.connect()
    try:
        yield the_lab
    finally:
        await the_lab.runner.close()


def new_case(c: Eager, key: str, success: dict[str, Any] | None = None, **kw: Any) -> Any:
    args: dict[str, Any] = {"key": key, "setup_script": "rm -f /fixed"}
    args.update(kw)
    return c.test_cases.create(f"case {key}", "Please fix my machine", "linux-tiny", success or CHECK, **args)


# -- the five mismatches the SDK found ---------------------------------------------------------


async def test_dot_only_keys_are_refused_and_the_set_survives(server: GwServer) -> None:
    admin, _member = clients(server)
    ts = await call(admin.test_sets.create, "keep me")
    keep = await call(new_case, admin, "KEEP-1")
    await call(admin.test_sets.add_cases, ts["test_set_id"], ["KEEP-1"])
    # httpx drops dot segments: remove_case(set, "..") would go out as DELETE /v1/test_sets/{set}.
    for key in (".", "..", "..."):
        with pytest.raises(InvalidRequestError) as e:
            await call(new_case, admin, key)
        assert e.value.extra["param"] == "key" and "only dots" in e.value.message
        with pytest.raises(InvalidRequestError) as e:
            await call(admin.test_cases.update, keep["test_case_id"], key=key)
        assert e.value.extra["param"] == "key"
        with pytest.raises(InvalidRequestError) as e:
            await call(admin.test_cases.batch, [{"key": key, "name": "n", "prompt": "p", "start_state": "linux-tiny",
                                                 "success": CHECK}], test_set_id=ts["test_set_id"])
        assert e.value.extra["param"] == "cases[0].key"
    # Dots inside a key are still fine: they are not a dot segment.
    dotted = await call(new_case, admin, "v1.2..3")
    assert (await call(admin.test_cases.retrieve, "v1.2..3"))["test_case_id"] == dotted["test_case_id"]
    kept = await call(admin.test_sets.retrieve, ts["test_set_id"])
    assert [m["key"] for m in kept["cases"]] == ["KEEP-1"]
    assert [c["key"] for c in (await call(admin.test_cases.list, q="KEEP"))["data"]] == ["KEEP-1"]


async def test_patch_and_batch_merge_nested_objects_field_by_field(server: GwServer) -> None:
    admin, _member = clients(server)
    made = await call(
        new_case, admin, "MERGE-1", limits={"minutes": 30}, operator={"approvals": "deny"},
        success={"check_script": "echo False", "rubric": "the app is dark"},
        customer={"persona": "Sam, in a hurry", "facts": {"Wi-Fi": "HomeNet"}, "clicks_admin_prompts": True},
    )
    cid = made["test_case_id"]
    up = await call(admin.test_cases.update, cid, limits={"steps": 5})
    assert up["limits"] == {"minutes": 30, "steps": 5}
    up = await call(admin.test_cases.update, cid, success={"rubric": "dark mode on"})
    assert up["success"] == {"check_script": "echo False", "rubric": "dark mode on", "checkpoints": None}
    up = await call(admin.test_cases.update, cid, customer={"does_steps": True})
    assert up["customer"] == {"persona": "Sam, in a hurry", "facts": {"Wi-Fi": "HomeNet"},
                              "clicks_admin_prompts": True, "does_steps": True}
    assert up["operator"] == {"approvals": "deny"}
    # null clears one field: back to its default where it has one, gone where it has none.
    up = await call(admin.test_cases.update, cid, limits={"minutes": None}, customer={"persona": None},
                    operator={"approvals": None})
    assert up["limits"] == {"minutes": 10, "steps": 5} and up["operator"] == {"approvals": "approve"}
    assert up["customer"] == {"facts": {"Wi-Fi": "HomeNet"}, "clicks_admin_prompts": True, "does_steps": True}
    up = await call(admin.test_cases.update, cid, success={"check_script": None})
    assert up["success"] == {"check_script": None, "rubric": "dark mode on", "checkpoints": None}
    with pytest.raises(InvalidRequestError) as e:  # neither a script nor a rubric left
        await call(admin.test_cases.update, cid, success={"rubric": None})
    assert e.value.extra["param"] == "success"
    assert (await call(admin.test_cases.retrieve, cid))["success"]["rubric"] == "dark mode on"  # nothing lost
    # A batch update (matched by key) merges the same way.
    out = await call(admin.test_cases.batch, [{"key": "MERGE-1", "name": "renamed", "prompt": "p",
                                               "start_state": "linux-tiny", "success": {"check_script": "echo False"},
                                               "limits": {"steps": 7}, "customer": {"persona": "Alex"}}])
    assert out["updated"] == 1 and out["created"] == 0
    got = out["data"][0]
    assert got["limits"] == {"minutes": 10, "steps": 7} and got["name"] == "renamed"
    assert got["success"] == {"check_script": "echo False", "rubric": "dark mode on", "checkpoints": None}
    assert got["customer"]["persona"] == "Alex" and got["customer"]["facts"] == {"Wi-Fi": "HomeNet"}
    # A test set's customer merges too.
    ts = await call(admin.test_sets.create, "merging set", customer={"persona": "Kim", "does_steps": False})
    ts = await call(admin.test_sets.update, ts["test_set_id"], customer={"does_steps": True})
    assert ts["customer"] == {"persona": "Kim", "does_steps": True}


async def test_attempts_filter_follows_a_key_changed_after_the_run_started(server: GwServer) -> None:
    admin, member = clients(server)
    case = await call(new_case, admin, "OLD-KEY")
    other = await call(new_case, admin, "OTHER")
    run = await call(member.test_runs.create, test_case_ids=["OLD-KEY", "OTHER"], agents=["noop"], repeat=2)
    rid = run["test_run_id"]
    await call(admin.test_cases.update, case["test_case_id"], key="NEW-KEY")
    for ident in ("NEW-KEY", "OLD-KEY", case["test_case_id"]):
        got = (await call(member.test_runs.attempts, rid, test_case_id=ident))["data"]
        assert [a["test_case_id"] for a in got] == [case["test_case_id"]] * 2, ident
    assert len(await call(member.test_runs.list_all_attempts, rid, test_case_id="NEW-KEY")) == 2
    # A case the run did not play has no attempts; a key that names no case says so.
    lone = await call(new_case, admin, "NOT-IN-RUN")
    assert (await call(member.test_runs.attempts, rid, test_case_id=lone["key"]))["data"] == []
    with pytest.raises(NotFoundError):
        await call(member.test_runs.attempts, rid, test_case_id="NO-SUCH-KEY")
    assert other["key"] == "OTHER"


async def test_an_image_is_retrievable_by_its_listed_id(server: GwServer) -> None:
    admin, member = clients(server)
    async with lab(server, admin, images=["linux-tiny"]):
        listed = (await call(member.start_states.list, kind="image"))["data"]
        image = next(x for x in listed if x["name"] == "linux-tiny")
        assert image["start_state_id"] == "linux-tiny" and image["kind"] == "image"
        got = await call(member.start_states.retrieve, image["start_state_id"])
        assert got == image
        assert await call(member.start_states.wait, "linux-tiny", timeout=10) == image  # an image is ready
        with pytest.raises(ConflictError) as e:  # an image is read-only: say so rather than "no such"
            await call(admin.start_states.update, "linux-tiny", name="x")
        assert e.value.extra["code"] == "image" and "POST /v1/start_states" in e.value.message
        with pytest.raises(NotFoundError):
            await call(member.start_states.retrieve, "no-such-image")


async def test_member_screen_is_refused_with_the_reason(server: GwServer) -> None:
    admin, member = clients(server)
    async with lab(server, admin) as the_lab:
        hand = await call(admin.start_states.create, "by hand", "linux-tiny")
        ssid = hand["start_state_id"]
        await await_for(lambda: any(j.op == "open" for j in the_lab.jobs), what="open job")
        assert (await call(member.start_states.retrieve, ssid))["status"] == "open"  # members read it
        with pytest.raises(PermissionDeniedError) as e:
            await call(member.start_states.screen, ssid)
        assert "screen" in e.value.message and "live machine" in e.value.message
        assert "passwords" in e.value.message
        assert not [q for q in the_lab.requests if q.op == "screen"]  # refused before reaching the runner
        assert await call(admin.start_states.screen, ssid) == PNG
        await call(admin.start_states.close, ssid)


def test_a_configured_agent_id_must_be_one_url_segment() -> None:
    # GET /v1/test_runs/{id}/agents/{agent_id} (the SDK's test_runs.agent) takes it as a path segment.
    for bad in ("..", ".", "team/agent"):
        with pytest.raises(pydantic.ValidationError) as e:
            AgentConfig(id=bad, kind="http", url="http://127.0.0.1:9/act")
        assert "agent id" in str(e.value)
    assert AgentConfig(id="v1.2-agent", kind="http", url="http://127.0.0.1:9/act").id == "v1.2-agent"


# -- every method, resource by resource ---------------------------------------------------------


async def test_test_cases(server: GwServer) -> None:
    admin, member = clients(server)
    full = await call(
        admin.test_cases.create, "Dark mode", "Make my apps dark", "linux-tiny", CHECK,
        key="DSP-01", setup_script="rm -f /fixed", customer={"persona": "Sam"}, operator={"approvals": "approve"},
        limits={"minutes": 15, "steps": 40}, runs_on="vm", category="display", tags=["display", "ui"],
        metadata={"ticket": "T-1"},
    )
    assert full["object"] == "test_case" and full["test_case_id"].startswith("tc_") and full["key"] == "DSP-01"
    assert full["limits"] == {"minutes": 15, "steps": 40} and full["tags"] == ["display", "ui"]
    assert full["created_at"].endswith("Z")
    assert await call(member.test_cases.retrieve, "DSP-01") == full
    assert await call(member.test_cases.retrieve, full["test_case_id"]) == full
    with pytest.raises(ConflictError) as ce:
        await call(admin.test_cases.create, "dup", "p", "linux-tiny", CHECK, key="DSP-01")
    assert ce.value.extra["param"] == "key"
    with pytest.raises(InvalidRequestError) as e:
        await call(admin.test_cases.create, "x", "p", "linux-tiny", CHECK, limits={"minutes": 61})
    assert e.value.extra["param"] == "limits.minutes"
    with pytest.raises(PermissionDeniedError):
        await call(member.test_cases.create, "x", "p", "linux-tiny", CHECK)
    with pytest.raises(NotFoundError):
        await call(member.test_cases.retrieve, "NOPE-1")
    up = await call(admin.test_cases.update, "DSP-01", name="Dark mode everywhere", category=None)
    assert up["name"] == "Dark mode everywhere" and up["category"] is None and up["tags"] == ["display", "ui"]
    batch = await call(admin.test_cases.batch, [
        {"key": "DSP-01", "name": "Dark mode", "prompt": "Make my apps dark", "start_state": "linux-tiny",
         "success": CHECK, "category": "display"},
        {"key": "NET-01", "name": "Wi-Fi", "prompt": "No internet", "start_state": "linux-tiny", "success": CHECK,
         "tags": ["network"], "category": "network"},
    ])
    assert (batch["created"], batch["updated"]) == (1, 1)
    assert batch["data"][0]["limits"] == {"minutes": 15, "steps": 40}  # not sent, so kept
    page = await call(member.test_cases.list, tag="network", include=["total_count", "facets"])
    assert [c["key"] for c in page["data"]] == ["NET-01"] and page["total_count"] == 1
    assert {f["name"] for f in page["facets"]["categories"]} == {"display", "network"}
    assert [c["key"] for c in (await call(member.test_cases.list, category="display"))["data"]] == ["DSP-01"]
    assert [c["key"] for c in (await call(member.test_cases.list, q="wi-fi"))["data"]] == ["NET-01"]
    first = await call(member.test_cases.list, limit=1)
    assert first["has_more"] is True and first["next_cursor"] and first["data"][0]["key"] == "NET-01"  # newest first
    assert [c["key"] for c in await call(member.test_cases.list_all, limit=1)] == ["NET-01", "DSP-01"]
    gone = await call(admin.test_cases.delete, "NET-01")
    assert gone == {"object": "test_case", "test_case_id": batch["data"][1]["test_case_id"], "deleted": True}
    with pytest.raises(NotFoundError):
        await call(member.test_cases.retrieve, "NET-01")


async def test_test_sets(server: GwServer) -> None:
    admin, member = clients(server)
    a, b, c = [await call(new_case, admin, k) for k in ("SET-A", "SET-B", "SET-C")]
    ts = await call(admin.test_sets.create, "Display", description="screens", repeat=2, customer={"persona": "Sam"},
                    cases=[{"test_case_id": "SET-A", "repeat": None}, {"test_case_id": b["test_case_id"], "repeat": 3}],
                    metadata={"team": "ui"})
    sid = ts["test_set_id"]
    assert ts["object"] == "test_set" and sid.startswith("ts_") and ts["case_count"] == 2
    assert ts["cases"] == [{"test_case_id": a["test_case_id"], "key": "SET-A", "repeat": None},
                           {"test_case_id": b["test_case_id"], "key": "SET-B", "repeat": 3}]
    assert await call(member.test_sets.retrieve, sid) == ts
    with pytest.raises(PermissionDeniedError):
        await call(member.test_sets.create, "nope")
    ts = await call(admin.test_sets.add_cases, sid, ["SET-C", "SET-A"], repeat=4)
    assert [(m["key"], m["repeat"]) for m in ts["cases"]] == [("SET-A", 4), ("SET-B", 3), ("SET-C", 4)]
    ts = await call(admin.test_sets.remove_case, sid, "SET-B")
    assert [m["key"] for m in ts["cases"]] == ["SET-A", "SET-C"]
    with pytest.raises(NotFoundError):
        await call(admin.test_sets.remove_case, sid, "SET-B")
    ts = await call(admin.test_sets.update, sid, name="Display 2", cases=[{"test_case_id": c["test_case_id"]}])
    assert ts["name"] == "Display 2" and [m["key"] for m in ts["cases"]] == ["SET-C"] and ts["repeat"] == 2
    assert ts["customer"] == {"persona": "Sam"} and ts["metadata"] == {"team": "ui"}
    other = await call(admin.test_sets.create, "Network")
    assert [s["name"] for s in (await call(member.test_sets.list, q="display", include="total_count"))["data"]] \
        == ["Display 2"]
    assert [s["test_set_id"] for s in await call(member.test_sets.list_all, limit=1)] == [other["test_set_id"], sid]
    run = await call(member.test_sets.run, sid, agents=["noop"], name="set run", metadata={"ci": "1"})
    assert run["test_set_id"] == sid and run["progress"]["total"] == 2 and run["name"] == "set run"
    assert await call(admin.test_sets.delete, other["test_set_id"]) == {
        "object": "test_set", "test_set_id": other["test_set_id"], "deleted": True}
    with pytest.raises(NotFoundError):
        await call(member.test_sets.retrieve, other["test_set_id"])
    await call(admin.test_runs.delete, run["test_run_id"])


async def test_test_runs_and_attempts(server: GwServer) -> None:
    admin, member = clients(server)
    for k in ("RUN-1", "RUN-2"):
        await call(new_case, admin, k, tags=["t"], category="cat")
    ts = await call(admin.test_sets.create, "runs", cases=[{"test_case_id": "RUN-1"}, {"test_case_id": "RUN-2"}])
    async with lab(server, admin) as the_lab:
        run = await call(member.test_runs.create, test_set_id=ts["test_set_id"], agents=["noop", "reference"],
                         repeat_by_case={"RUN-2": 2}, name="nightly", metadata={"build": "42"})
        rid = run["test_run_id"]
        assert run["object"] == "test_run" and rid.startswith("tr_") and run["progress"]["total"] == 6
        done = await call(member.test_runs.wait, rid, timeout=60, poll_interval=0.2)
        assert done["status"] == "completed" and done["pass_rate"] == {"noop": 0.0, "reference": 1.0}
        assert await call(member.test_runs.retrieve, rid) == done
        assert [r["test_run_id"] for r in (await call(member.test_runs.list, status="completed"))["data"]] == [rid]
        assert [r["test_run_id"] for r in await call(member.test_runs.list_all, test_set_id=ts["test_set_id"])] \
            == [rid]
        assert (await call(member.test_runs.list, agent_id="reference", q="nightly",
                           include="total_count"))["total_count"] == 1
        page = await call(member.test_runs.attempts, rid, test_case_id="RUN-2", agent_id="noop",
                          include="total_count")
        assert page["total_count"] == 2 and {a["outcome"] for a in page["data"]} == {"failed"}
        passed = await call(member.test_runs.list_all_attempts, rid, outcome="passed", limit=1)
        assert len(passed) == 3 and {a["agent_id"] for a in passed} == {"reference"}
        detail = await call(member.attempts.retrieve, passed[0]["attempt_id"])
        assert detail["object"] == "attempt" and detail["check"]["after"] == "True"
        assert detail["test_case"]["key"] in ("RUN-1", "RUN-2") and "check_script" not in detail["test_case"]
        results = await call(member.test_runs.results, rid)
        assert results["object"] == "test_run_results" and set(results["by_agent"]) == {"noop", "reference"}
        assert results["by_agent"]["reference"]["passed"] == 3 and results["by_agent"]["noop"]["failed"] == 3
        agent = await call(member.test_runs.agent, rid, "noop")
        assert agent["object"] == "test_run_agent" and agent["agent_id"] == "noop"
        with pytest.raises(NotFoundError):
            await call(member.test_runs.agent, rid, "not-tried")
        again = await call(member.test_runs.rerun, rid, only="failed")
        assert again["progress"]["total"] == 3  # the noop pairs
        done2 = await call(member.test_runs.wait, again["test_run_id"], timeout=60, poll_interval=0.2)
        assert done2["pass_rate"] == {"noop": 0.0}
        cmp = await call(member.test_runs.compare, [rid, again["test_run_id"]])
        assert cmp["object"] == "test_run_comparison"
        with pytest.raises(InvalidRequestError) as e:
            await call(member.test_runs.compare, [rid])
        assert e.value.extra["param"] == "ids"
        the_lab.hold = True
        held = await call(member.test_runs.create, test_case_ids=["RUN-1"], agents=["noop"])
        await await_for(lambda: the_lab.held, what="lease held")
        cancelled = await call(member.test_runs.cancel, held["test_run_id"])
        assert cancelled["status"] == "cancelled"
        with pytest.raises(ConflictError):
            await call(member.test_runs.cancel, rid)  # it completed
        with pytest.raises(PermissionDeniedError):
            await call(member.test_runs.delete, rid)
        assert await call(admin.test_runs.delete, rid) == {"object": "test_run", "test_run_id": rid, "deleted": True}
        with pytest.raises(NotFoundError):
            await call(member.test_runs.retrieve, rid)


async def test_start_states(server: GwServer) -> None:
    admin, member = clients(server)
    async with lab(server, admin, images=["linux-tiny", "img-b"]) as the_lab:
        page = await call(member.start_states.list, include="total_count")
        assert [x["name"] for x in page["data"]] == ["img-b", "linux-tiny"] and page["total_count"] == 2
        built = await call(admin.start_states.create, "with app", "linux-tiny", script="touch /app",
                           description="has the app", metadata={"k": "v"})
        ssid = built["start_state_id"]
        assert built["status"] == "building" and built["method"] == "script" and ssid.startswith("ss_")
        ready = await call(member.start_states.wait, ssid, timeout=30, poll_interval=0.1)
        assert ready["status"] == "ready" and ready["version"] == 1
        assert [j.op for j in the_lab.jobs] == ["build"] and the_lab.jobs[0].script == "touch /app"
        assert [x["start_state_id"] for x in await call(member.start_states.list_all, kind="state")] == [ssid]
        assert [x["name"] for x in (await call(member.start_states.list, q="app"))["data"]] == ["with app"]
        up = await call(admin.start_states.update, ssid, name="renamed")
        assert up["name"] == "renamed" and up["description"] == "has the app" and up["metadata"] == {"k": "v"}
        opened = await call(admin.start_states.open, ssid)
        assert opened["status"] == "open" and opened["view"]["screen_url"].endswith(f"/{ssid}/screen")
        assert await call(admin.start_states.screen, ssid) == PNG
        out = await call(admin.start_states.input, ssid, [{"type": "click", "x": 10, "y": 20},
                                                          {"type": "type", "text": "hi"}])
        assert out["ok"] is True and out["count"] == 2
        with pytest.raises(PermissionDeniedError):
            await call(member.start_states.input, ssid, [{"type": "type", "text": "x"}])
        saving = await call(admin.start_states.save, ssid)
        assert saving["status"] == "saving"
        saved = await call(member.start_states.wait, ssid, timeout=30, poll_interval=0.1)
        assert saved["status"] == "ready" and saved["version"] == 2
        await call(admin.start_states.open, ssid)
        closed = await call(admin.start_states.close, ssid)
        assert closed["status"] == "ready" and closed["version"] == 2
        with pytest.raises(ConflictError):
            await call(admin.start_states.close, ssid)  # not open
        uses = await call(admin.test_cases.create, "uses it", "p", ssid, CHECK)
        with pytest.raises(ConflictError) as e:
            await call(admin.start_states.delete, ssid)
        assert e.value.extra["code"] == "in_use" and e.value.extra["test_case_ids"] == [uses["test_case_id"]]
        await call(admin.test_cases.delete, uses["test_case_id"])
        assert await call(admin.start_states.delete, ssid) == {
            "object": "start_state", "start_state_id": ssid, "deleted": True}
        await await_for(lambda: any(j.op == "delete" for j in the_lab.jobs), what="delete job")
        with pytest.raises(NotFoundError):
            await call(member.start_states.retrieve, ssid)


async def test_runners(server: GwServer) -> None:
    admin, member = clients(server)
    made = await call(admin.runners.create, "lab-7")
    assert made["object"] == "runner" and made["token"].startswith("gh_rn_") and made["status"] == "offline"
    with pytest.raises(PermissionDeniedError):
        await call(member.runners.create, "nope")
    r = await SimRunner(server.ws_url, made["token"], name="lab-7", slots=3, images=["linux-tiny"]).connect()
    try:
        got = next(x for x in (await call(member.runners.list, q="lab-7"))["data"])
        assert got["status"] == "online" and got["slots"] == 3 and "token" not in got
        assert made["runner_id"] in [x["runner_id"] for x in await call(member.runners.list_all, limit=1)]
        assert await call(admin.runners.delete, made["runner_id"]) == {
            "object": "runner", "runner_id": made["runner_id"], "deleted": True}
        assert await r.wait_closed(timeout=10) == protocol.CLOSE_TOKEN_REVOKED
    finally:
        await r.close()


async def test_webhook(server: GwServer) -> None:
    admin, member = clients(server)
    with pytest.raises(InvalidRequestError) as e:
        await call(admin.webhook.update, events=["test_run.completed"])  # the first call needs a url
    assert e.value.extra["param"] == "url"
    made = await call(admin.webhook.update, url="https://hooks.example.test/gh", events=["test_run.completed"])
    assert made["url"] == "https://hooks.example.test/gh" and made["secret"]
    got = await call(member.webhook.retrieve)
    assert got["url"] == made["url"] and got["events"] == ["test_run.completed"] and "secret" not in got
    with pytest.raises(PermissionDeniedError):
        await call(member.webhook.update, url="https://elsewhere.example.test/")
    assert (await call(admin.webhook.update, events=[]))["url"] == made["url"]  # url kept
    assert (await call(admin.webhook.delete))["url"] is None


async def test_async_client(server: GwServer) -> None:
    admin, _member = clients(server)
    async with AsyncEager(api_key=server.admin_key, base_url=server.base_url, max_retries=0, timeout=30) as ac:
        made = await ac.test_cases.create("async", "p", "linux-tiny", CHECK, key="ASYNC-1", limits={"minutes": 20})
        up = await ac.test_cases.update("ASYNC-1", limits={"steps": 3})
        assert up["limits"] == {"minutes": 20, "steps": 3}
        assert (await ac.test_cases.retrieve(made["test_case_id"]))["key"] == "ASYNC-1"
        with pytest.raises(InvalidRequestError):
            await ac.test_cases.create("dots", "p", "linux-tiny", CHECK, key="..")
        ts = await ac.test_sets.create("async set", cases=[{"test_case_id": "ASYNC-1"}])
        ts = await ac.test_sets.remove_case(ts["test_set_id"], "ASYNC-1")
        assert ts["cases"] == [] and (await ac.test_sets.retrieve(ts["test_set_id"]))["test_set_id"]
        run = await ac.test_runs.create(test_case_ids=["ASYNC-1"], agents=["noop"])
        await ac.test_cases.update("ASYNC-1", key="ASYNC-2")
        page = await ac.test_runs.attempts(run["test_run_id"], test_case_id="ASYNC-2")
        assert [a["test_case_id"] for a in page["data"]] == [made["test_case_id"]]
        async with lab(server, admin):
            image = await ac.start_states.retrieve("linux-tiny")
            assert image["kind"] == "image" and image["status"] == "ready"


def test_every_evals_method_was_driven() -> None:
    """Runs last (file order): every public method of the SDK's evals resources was called above."""
    wanted = {f"{res}.{m}" for res, cls in evals_methods().items() for m in public_methods(cls)}
    missing = sorted(wanted - CALLED)
    assert not missing, f"SDK methods this suite never called (run the whole module): {missing}"
