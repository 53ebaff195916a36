"""Doubles at the daemon's boundaries: a provider double and a scripted attempt.

`FakeProvider` stands in for the hypervisor. Its machines "exist" in a JSON state file when one is
given, so a runner process that is killed and restarted (`GH_RUNNER_TEST_PROVIDER=
runner.doubles:make_provider` with `GH_TEST_PROVIDER_STATE=...`) finds what it left behind and the
test can read which machines were reaped. Check scripts answer `False` before the task and `True`
after, so a real `Attempt` passes on it.

`ScriptedAttempt` is a stand-in for `gh_runner.attempt.Attempt` at the daemon <-> attempt
interface, for daemon unit tests that need exact control over when an attempt ends.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from PIL import Image

from gh_wire.input import InputEvent
from gh_wire.protocol import AttemptResult, Lease, MachineRequest, MachineResponse, TaskEnd
from providers.base import ImageInfo, Machine, MachineSource, Provider, SavedVersion, ScriptResult
from providers.errors import AccessibilityTooLarge, HypervisorUnavailable, ProviderError


def tiny_png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(buf, format="PNG")
    return buf.getvalue()


class FakeMachine(Machine):
    def __init__(self, machine_id: str, provider: FakeProvider) -> None:
        self.machine_id = machine_id
        self.provider = provider
        self.inputs: list[Any] = []

    async def wait_ready(self, timeout: float) -> None:
        await asyncio.sleep(self.provider.delay)

    async def run_script(self, script: str, *, env: Mapping[str, str] | None = None, timeout: float,
                         output_cap: int = 1024 * 1024) -> ScriptResult:
        await asyncio.sleep(self.provider.delay)
        phase = (env or {}).get("GH_CHECK_PHASE")
        out = {"before": "False\n", "after": "True\n"}.get(phase or "", "ok\n")
        return ScriptResult(exit_code=0, stdout=out, stderr="")

    async def screenshot(self) -> bytes:
        return self.provider.png

    async def send_input(self, events: Sequence[InputEvent]) -> None:
        self.inputs.extend(events)

    async def accessibility_tree(self, timeout: float, max_bytes: int) -> str:
        """The provider's `a11y` (None: no desktop, the base's refusal), read in `delay` seconds; the
        most reads in flight at once are counted in `a11y_most_at_once`."""
        if self.provider.a11y is None:
            return await super().accessibility_tree(timeout, max_bytes)
        self.provider.a11y_in_flight += 1
        self.provider.a11y_most_at_once = max(self.provider.a11y_most_at_once, self.provider.a11y_in_flight)
        try:
            await asyncio.sleep(self.provider.delay)
        finally:
            self.provider.a11y_in_flight -= 1
        if len(self.provider.a11y.encode()) > max_bytes:
            raise AccessibilityTooLarge(f"the accessibility tree is over {max_bytes} bytes")
        return self.provider.a11y

    async def save(self, start_state_id: str, version: int, *, with_memory: bool = True) -> SavedVersion:
        raise ProviderError("the provider double does not save machines")

    async def destroy(self) -> None:
        if self.provider.destroy_gate is not None:  # a destroy as slow as the test wants
            await self.provider.destroy_gate.wait()
        self.provider._forget(self.machine_id, "destroyed")


class FakeProvider(Provider):
    def __init__(self, delay: float = 0.0, state_file: Path | None = None,
                 images: Sequence[str] = ("linux-tiny",)) -> None:
        self.delay = delay
        self.state_file = state_file
        self.png = tiny_png()
        self.images = [ImageInfo(name=n, os="linux", version="2026.11.1", checksum=f"sha256:{'ab' * 32}",
                                 shell="sh") for n in images]
        self.held: list[tuple[str, int]] = []
        self.hypervisor_down: str | None = None  # set: probe() raises HypervisorUnavailable with it
        self.state: dict[str, Any] = {"existing": [], "created": [], "destroyed": [], "reap_calls": []}
        if state_file is not None and state_file.exists():
            self.state = json.loads(state_file.read_text())
        self.machines: dict[str, FakeMachine] = {}
        self.closed = False
        self.destroy_gate: asyncio.Event | None = None
        self.pooled: list[MachineSource] = []
        self.a11y: str | None = None  # the machines' accessibility tree (None: they have no desktop)
        self.a11y_in_flight = 0
        self.a11y_most_at_once = 0

    async def probe(self) -> None:
        if self.hypervisor_down is not None:
            raise HypervisorUnavailable(self.hypervisor_down)

    def _save(self) -> None:
        if self.state_file is not None:
            tmp = self.state_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.state))
            os.replace(tmp, self.state_file)

    def _forget(self, machine_id: str, how: str) -> None:
        if machine_id in self.state["existing"]:
            self.state["existing"].remove(machine_id)
            self.state[how].append(machine_id)
            self._save()
        self.machines.pop(machine_id, None)

    async def list_images(self) -> list[ImageInfo]:
        return list(self.images)

    async def held_versions(self) -> list[tuple[str, int]]:
        return list(self.held)

    async def create_machine(self, machine_id: str, source: MachineSource, *, timeout: float) -> Machine:
        if source.image not in {i.name for i in self.images}:
            raise ProviderError(f"no image {source.image}")
        self.state["existing"].append(machine_id)
        self.state["created"].append(machine_id)
        self._save()
        await asyncio.sleep(self.delay)
        m = FakeMachine(machine_id, self)
        self.machines[machine_id] = m
        return m

    async def reap(self, keep: set[str]) -> list[str]:
        gone = [m for m in self.state["existing"] if m not in keep]
        self.state["reap_calls"].append({"keep": sorted(keep), "reaped": gone})
        for m in gone:
            self.state["existing"].remove(m)
            self.machines.pop(m, None)
        self._save()
        return gone

    async def delete_version(self, start_state_id: str, version: int) -> None:
        self.held = [h for h in self.held if h != (start_state_id, version)]

    async def pooled_sources(self) -> list[MachineSource]:
        return list(self.pooled)

    async def close(self) -> None:
        self.closed = True


def make_provider(config: Any) -> FakeProvider:
    """Factory for GH_RUNNER_TEST_PROVIDER (test-only). Env: GH_TEST_PROVIDER_DELAY (seconds per
    provider step), GH_TEST_PROVIDER_STATE (JSON file shared with the test)."""
    state = os.environ.get("GH_TEST_PROVIDER_STATE")
    return FakeProvider(delay=float(os.environ.get("GH_TEST_PROVIDER_DELAY", "0")),
                        state_file=Path(state) if state else None)


class ScriptedAttempt:
    """Makes its machine, then waits for `task_end` (-> passed), `cancel` (-> error) or `hold`
    seconds (-> passed); always destroys the machine. Requests get a screenshot or an echo."""

    hold: float | None = None  # None: wait for task_end or cancel

    def __init__(self, lease: Lease, provider: Provider, link: Any, timeouts: Any = None) -> None:
        self.lease = lease
        self.provider = provider
        self.link = link
        self.machine_id = lease.attempt_id
        self._end = asyncio.Event()
        self._cancel: str | None = None
        self._answer = ""
        self.requests: list[MachineRequest] = []
        self.machine: Machine | None = None
        self._requests: Any = None  # gh_runner.machine_requests.MachineRequests, made on first use
        self.masked = asyncio.Event()  # a secret typed (gh_runner/attempt.py): never, here
        self.agent_acked = False
        self.agent_late: float | None = None

    async def run(self) -> AttemptResult:
        started = datetime.now(UTC)
        self.machine = await self.provider.create_machine(
            self.machine_id, MachineSource(image=self.lease.start_state.image), timeout=30)
        try:
            await self.link.status("running", "task")
            if self._cancel is None:
                try:
                    await asyncio.wait_for(self._end.wait(), self.hold)
                except TimeoutError:
                    pass
        finally:
            await self.machine.destroy()
        await self.link.status("done", "done")
        if self._cancel is not None:
            return AttemptResult(attempt_id=self.lease.attempt_id, outcome="error", error=f"cancelled: {self._cancel}",
                                 error_phase="task", started_at=started, finished_at=datetime.now(UTC))
        return AttemptResult(attempt_id=self.lease.attempt_id, outcome="passed", answer=self._answer,
                             started_at=started, finished_at=datetime.now(UTC))

    async def handle_request(self, req: MachineRequest) -> MachineResponse:
        self.requests.append(req)
        if self.machine is None:
            return MachineResponse(request_id=req.request_id, ok=False, error="no machine yet")
        if req.op == "screen":
            import base64

            png = await self.machine.screenshot()
            await self.link.frame("input", png, None)
            return MachineResponse(request_id=req.request_id, ok=True, png_b64=base64.b64encode(png).decode())
        if req.op == "accessibility":  # the runner's own server of it (its bounds, its one-at-a-time)
            if self._requests is None:
                from gh_runner.config import Timeouts
                from gh_runner.machine_requests import MachineRequests

                self._requests = MachineRequests(self.machine, Timeouts())
            return await self._requests.serve(req)
        if req.op == "exec":
            res = await self.machine.run_script(req.script or "", env=req.env, timeout=req.timeout)
            return MachineResponse(request_id=req.request_id, ok=True, exit_code=res.exit_code, stdout=res.stdout)
        await self.machine.send_input(req.events)
        return MachineResponse(request_id=req.request_id, ok=True)

    async def wait_torn_down(self) -> None:
        return None  # `run` destroys its machine before it returns

    def agent_started(self, late_seconds: float | None = None) -> None:
        self.agent_late = late_seconds
        self.agent_acked = True

    def task_end(self, msg: TaskEnd) -> None:
        self._answer = msg.answer
        self._end.set()

    def task_hold(self, held: bool) -> bool:
        return False  # no task clock here

    def cancel(self, reason: str) -> None:
        if self._cancel is None:
            self._cancel = reason
            self._end.set()
