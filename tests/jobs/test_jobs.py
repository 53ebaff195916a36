"""Start-state jobs on the runner, against a provider double (the real provider is covered in e2e)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from gh_runner import machine_requests
from gh_runner.attempt import Attempt
from gh_runner.jobs import StartStateJobs
from gh_runner.machine_requests import EXEC_OUTPUT_CAP
from gh_wire import protocol
from gh_wire.input import InputEvent, TypeEvent
from providers.base import ImageInfo, Machine, MachineSource, Provider, SavedVersion, ScriptResult


class FakeMachine(Machine):
    def __init__(self, provider: FakeProvider, machine_id: str, source: MachineSource) -> None:
        self.machine_id = machine_id
        self.source = source
        self.provider = provider
        self.events: list[InputEvent] = []
        self.destroyed = False
        self.output_caps: list[int] = []

    async def wait_ready(self, timeout: float) -> None:
        return None

    async def run_script(self, script: str, *, env: Mapping[str, str] | None = None, timeout: float,
                         output_cap: int = 1 << 20) -> ScriptResult:
        self.output_caps.append(output_cap)
        if "silent guest" in script:  # the guest channel stopped answering: not even the timeout comes back
            await asyncio.Event().wait()
        if "hang" in script:
            return ScriptResult(exit_code=None, stdout="working...", stderr="", timed_out=True)
        if "fail" in script:
            return ScriptResult(exit_code=3, stdout="", stderr="boom: no such service")
        return ScriptResult(exit_code=0, stdout="ok\n", stderr="")

    async def screenshot(self) -> bytes:
        return b"\x89PNG fake"

    async def send_input(self, events: Sequence[InputEvent]) -> None:
        self.events.extend(events)

    async def save(self, start_state_id: str, version: int, *, with_memory: bool = True) -> SavedVersion:
        self.provider.versions.add((start_state_id, version))
        return SavedVersion(start_state_id, version, Path("/nonexistent"), 1234)

    async def destroy(self) -> None:
        self.destroyed = True
        self.provider.live.pop(self.machine_id, None)


class FakeProvider(Provider):
    def __init__(self) -> None:
        self.live: dict[str, FakeMachine] = {}
        self.versions: set[tuple[str, int]] = set()
        self.deleted: list[tuple[str, int]] = []

    async def list_images(self) -> list[ImageInfo]:
        return []

    async def create_machine(self, machine_id: str, source: MachineSource, *, timeout: float) -> Machine:
        m = FakeMachine(self, machine_id, source)
        self.live[machine_id] = m
        return m

    async def reap(self, keep: set[str]) -> list[str]:
        return []

    async def delete_version(self, start_state_id: str, version: int) -> None:
        self.versions.discard((start_state_id, version))
        self.deleted.append((start_state_id, version))

    async def held_versions(self) -> list[tuple[str, int]]:
        return sorted(self.versions)


IMAGE = protocol.StartStateRef(kind="image", image="linux-tiny")


def job(op: str, **kw: object) -> protocol.Job:
    return protocol.Job.model_validate({"job_id": f"jb_{op}", "op": op, "start_state_id": "ss_1", **kw})


async def test_build_runs_script_saves_and_leaves_no_machine() -> None:
    p = FakeProvider()
    res = await StartStateJobs(p).run(job("build", source=IMAGE, script="touch /x", version=1))
    assert res.ok and res.version == 1 and res.size_bytes == 1234
    assert p.versions == {("ss_1", 1)}
    assert p.live == {}


async def test_build_failure_says_exit_code_and_stderr_and_saves_nothing() -> None:
    p = FakeProvider()
    res = await StartStateJobs(p).run(job("build", source=IMAGE, script="fail", version=1))
    assert not res.ok and "exited with 3" in (res.error or "") and "no such service" in (res.error or "")
    assert p.versions == set() and p.live == {}


async def test_build_timeout_is_a_plain_failure() -> None:
    p = FakeProvider()
    res = await StartStateJobs(p).run(job("build", source=IMAGE, script="hang", version=1, script_timeout=5))
    assert not res.ok and "did not finish within 5 s" in (res.error or "")
    assert p.live == {}


async def test_build_without_script_is_refused_with_a_reason() -> None:
    res = await StartStateJobs(FakeProvider()).run(job("build", source=IMAGE, version=1))
    assert not res.ok and "needs a script" in (res.error or "")


async def test_open_drive_save_closes_machine_and_keeps_version() -> None:
    p = FakeProvider()
    jobs = StartStateJobs(p)
    assert (await jobs.run(job("open", source=IMAGE))).ok
    assert jobs.is_open("ss_1") and len(p.live) == 1
    req = protocol.MachineRequest(request_id="r1", start_state_id="ss_1", op="input",
                                  events=[TypeEvent(text="touch /hand\n")])
    assert (await jobs.handle_request(req)).ok
    shot = await jobs.handle_request(protocol.MachineRequest(request_id="r2", start_state_id="ss_1", op="screen"))
    assert shot.ok and base64.b64decode(shot.png_b64 or "") == b"\x89PNG fake"
    machine = next(iter(p.live.values()))
    assert [e.text for e in machine.events if isinstance(e, TypeEvent)] == ["touch /hand\n"]
    res = await jobs.run(job("save", version=1))
    assert res.ok and res.version == 1 and ("ss_1", 1) in p.versions
    assert not jobs.is_open("ss_1") and p.live == {}


async def test_requests_to_a_state_that_is_not_open_are_refused() -> None:
    jobs = StartStateJobs(FakeProvider())
    res = await jobs.handle_request(protocol.MachineRequest(request_id="r", start_state_id="ss_9", op="screen"))
    assert not res.ok and "not open" in (res.error or "")


async def test_close_discards_and_save_after_close_fails() -> None:
    p = FakeProvider()
    jobs = StartStateJobs(p)
    await jobs.run(job("open", source=IMAGE))
    assert (await jobs.run(job("close"))).ok
    assert p.live == {} and p.versions == set()
    res = await jobs.run(job("save", version=1))
    assert not res.ok and "no open machine" in (res.error or "")


async def test_delete_removes_every_held_version_of_that_state_only() -> None:
    p = FakeProvider()
    p.versions = {("ss_1", 1), ("ss_1", 2), ("ss_2", 1)}
    assert (await StartStateJobs(p).run(job("delete"))).ok
    assert p.versions == {("ss_2", 1)}


async def test_a_start_states_exec_is_capped_and_bounded_like_an_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    """One server answers an attempt's and an open start state's requests: the same output cap, and
    an exec whose guest never answers is refused at its timeout plus the slack instead of hanging."""
    monkeypatch.setattr(machine_requests, "SCRIPT_SLACK", 0.2)
    p = FakeProvider()
    jobs = StartStateJobs(p)
    await jobs.run(job("open", source=IMAGE))
    machine = next(iter(p.live.values()))
    res = await jobs.handle_request(protocol.MachineRequest(request_id="r1", start_state_id="ss_1", op="exec",
                                                            script="echo hi"))
    assert res.ok and res.exit_code == 0
    assert machine.output_caps == [EXEC_OUTPUT_CAP]
    async with asyncio.timeout(30):  # the old path had no outer bound: this hung
        res = await jobs.handle_request(protocol.MachineRequest(request_id="r2", start_state_id="ss_1", op="exec",
                                                                script="silent guest", timeout=0.1))
    assert not res.ok and res.error == "exec got no answer from the machine in time"
    assert (await jobs.run(job("close"))).ok


async def test_attempts_and_start_states_are_served_by_the_one_request_server() -> None:
    assert "_serve" not in vars(Attempt) and "_exec" not in vars(Attempt) and "_input" not in vars(Attempt)
    jobs = StartStateJobs(FakeProvider())
    await jobs.run(job("open", source=IMAGE))
    res = await jobs.handle_request(protocol.MachineRequest(request_id="r", start_state_id="ss_1", op="exec"))
    # The same words as an attempt's refusal (tests/attempt): one server, one way of saying it.
    assert not res.ok and res.error == "an exec request needs a script"
    assert (await jobs.run(job("close"))).ok
