"""A provider double for the attempt lifecycle: a fake Machine at the Provider boundary.

The fake guest is a dict of "files" that scripts act on through handlers the tests register, so a
test reads like the real scenario (setup breaks, the agent fixes, the check looks) without QEMU.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from gh_runner import answer_file
from gh_wire.input import InputEvent
from gh_wire.protocol import FrozenCase, Lease, Limits, SavePoint, StartStateRef
from providers.base import (
    ImageInfo,
    InputNotSupported,
    Machine,
    MachineNotReady,
    MachineOrigin,
    MachineSource,
    Provider,
    ProviderError,
    SavedVersion,
    ScriptResult,
)

WAIT = 10.0  # generous deadline for a test to see an expected state


def png(color: tuple[int, int, int] = (0, 0, 0), box: tuple[int, int, int, int] | None = None) -> bytes:
    im = Image.new("RGB", (320, 200), color)
    if box is not None:
        ImageDraw.Draw(im).rectangle(box, fill=(255, 255, 255))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def is_mosaic(png_bytes: bytes) -> bool:
    """True for a frame masked by `gh_runner.replay.mask_png`: every block below its note is one colour."""
    from gh_wire.masking import mask_block

    with Image.open(io.BytesIO(png_bytes)) as im:
        rgb = im.convert("RGB")
    w, h = rgb.size
    block = mask_block(w)
    for y0 in range(block, h - block + 1, block):  # the first row of blocks carries the note
        for x0 in range(0, w - block + 1, block):
            if rgb.crop((x0, y0, x0 + block, y0 + block)).getcolors(1) is None:
                return False
    return True


ScriptHandler = Callable[["FakeMachine", Mapping[str, str], float], Awaitable[ScriptResult] | ScriptResult]


def ok(stdout: str = "", stderr: str = "", code: int | None = 0, **kw: Any) -> ScriptResult:
    return ScriptResult(exit_code=code, stdout=stdout, stderr=stderr, **kw)


class FakeMachine(Machine):
    def __init__(self, machine_id: str, provider: FakeProvider) -> None:
        self.machine_id = machine_id
        self.provider = provider
        self.files: dict[str, str] = {}
        self.screen = png()
        self.inputs: list[InputEvent] = []
        self.scripts_run: list[tuple[str, dict[str, str]]] = []
        self.destroyed = 0
        # The guest's script channel: "up"; "dead" (its agent and executor killed or removed: a request
        # fails at once); "stopped" (SIGSTOP: a request gets no answer). `respawns`: the guest's init
        # brings a dead one back when asked again. `guest_runs`: what the hypervisor says of the guest.
        self.channel = "up"
        self.respawns = False
        self.guest_runs = True

    async def wait_ready(self, timeout: float) -> None:
        if self.channel == "dead" and self.respawns:
            self.channel = "up"
        if self.channel != "up":
            await asyncio.sleep(timeout)
            raise MachineNotReady(f"guest agent of {self.machine_id} did not answer within {timeout:g} s")
        if self.provider.never_ready:
            # The real provider polls its guest channel up to the deadline, then gives up.
            await asyncio.sleep(timeout)
            raise MachineNotReady(f"guest agent of {self.machine_id} did not answer within {timeout:g} s")

    async def run_script(self, script: str, *, env: Mapping[str, str] | None = None, timeout: float,
                         output_cap: int = 1 << 20) -> ScriptResult:
        if self.channel == "dead":
            raise ProviderError("guest agent guest-exec: the guest agent is not answering")
        if self.channel == "stopped":
            return ScriptResult(exit_code=None, stdout="", stderr="", timed_out=True)
        answer, script = answer_file.split(script)
        env = dict(env or {})
        if answer is not None:  # the guest runs the runner's preamble: the answer is in a file
            env[answer_file.VARIABLE] = "/tmp/gh-answer-1"
            self.files[env[answer_file.VARIABLE]] = answer
        self.scripts_run.append((script, dict(env)))
        handler = self.provider.scripts.get(script)
        if handler is None:
            return ok(stderr=f"sh: unknown script {script!r}", code=127)
        res = handler(self, dict(env or {}), timeout)
        if asyncio.iscoroutine(res) or isinstance(res, asyncio.Future):
            return await res
        assert isinstance(res, ScriptResult)
        return res

    async def guest_running(self) -> bool:
        return self.guest_runs

    async def screenshot(self) -> bytes:
        if self.provider.screen_error:
            raise ProviderError("screendump failed")
        return self.screen

    async def send_input(self, events: Sequence[InputEvent]) -> None:
        for e in events:
            if e.type == "type" and "\u2603" in e.text:
                raise InputNotSupported(f"cannot type {e.text!r}: character not in keymap")
            self.inputs.append(e)
            self.screen = png((0, 0, 40 * len(self.inputs) % 255), box=(10, 10, 200, 100))

    async def save(self, start_state_id: str, version: int, *, with_memory: bool = True) -> SavedVersion:
        if self.provider.save_error:
            raise ProviderError("virDomainSave failed")
        self.provider.saved.append((start_state_id, version, dict(self.files)))
        self.provider.save_made.set()
        return SavedVersion(start_state_id=start_state_id, version=version, disk_path=Path("/nonexistent/disk.qcow2"),
                            size_bytes=1000 + len(self.provider.saved))

    async def destroy(self) -> None:
        self.destroyed += 1
        self.provider.destroyed.set()
        if self.provider.destroy_error:
            raise ProviderError("virsh destroy failed")


class FakeProvider(Provider):
    def __init__(self) -> None:
        self.machines: list[FakeMachine] = []
        self.sources: list[MachineSource] = []
        self.scripts: dict[str, ScriptHandler] = {}
        self.never_ready = False
        self.create_error: str | None = None
        self.create_gate: asyncio.Event | None = None  # creation waits for this when set
        self.creating = asyncio.Event()
        self.screen_error = False
        self.destroy_error = False
        self.destroyed = asyncio.Event()  # any machine destroyed
        self.origin = MachineOrigin.COLD  # what the made machines say they are
        self.saved: list[tuple[str, int, dict[str, str]]] = []  # versions saved: id, version, the files then
        self.deleted: list[tuple[str, int]] = []
        self.save_error = False
        self.save_made = asyncio.Event()  # set at each save (a test clears it to wait for the next)

    async def list_images(self) -> list[ImageInfo]:
        return []

    async def create_machine(self, machine_id: str, source: MachineSource, *, timeout: float) -> Machine:
        self.sources.append(source)
        self.creating.set()
        if self.create_gate is not None:
            await self.create_gate.wait()
        if self.create_error:
            raise ProviderError(self.create_error)
        m = FakeMachine(machine_id, self)
        m.origin = self.origin
        self.machines.append(m)
        return m

    async def reap(self, keep: set[str]) -> list[str]:
        return []

    async def delete_version(self, start_state_id: str, version: int) -> None:
        self.deleted.append((start_state_id, version))


class FakeLink:
    def __init__(self) -> None:
        self.statuses: list[tuple[str, str]] = []
        self.frames: list[tuple[str, bytes, dict[str, Any] | None]] = []
        self.frame_error = False
        self.save_points: list[SavePoint] = []  # what the server was told of (save_point_made)
        self.status_acks = False  # a server that acknowledges statuses (status_ack, docs/protocol.md)
        self._seen: dict[str, asyncio.Event] = {}

    def _event(self, phase: str) -> asyncio.Event:
        return self._seen.setdefault(phase, asyncio.Event())

    async def status(self, status: str, phase: str) -> None:
        self.statuses.append((status, phase))
        self._event(phase).set()

    async def frame(self, label: str, png: bytes, event: dict[str, Any] | None) -> None:
        if self.frame_error:
            raise ConnectionError("websocket closed")
        self.frames.append((label, png, event))
        self._event("frame:" + label).set()

    async def save_point_made(self, point: SavePoint) -> None:
        self.save_points.append(point)

    async def reached(self, phase: str) -> None:
        await asyncio.wait_for(self._event(phase).wait(), WAIT)

    def labels(self) -> list[str]:
        return [f[0] for f in self.frames]


def make_lease(*, setup: str | None = "break", check: str | None = "check", minutes: int = 10,
               script_timeout: float = 600.0, kind: str = "image") -> Lease:
    start = (StartStateRef(kind="image", image="linux-tiny") if kind == "image"
             else StartStateRef(kind="state", image="linux-tiny", start_state_id="ss_x", version=3))
    return Lease(
        attempt_id="at_test1",
        agent_id="ag_x",
        case=FrozenCase(test_case_id="tc_x", name="case", prompt="fix it", setup_script=setup,
                        check_script=check, limits=Limits(minutes=minutes)),
        start_state=start,
        script_timeout=script_timeout,
    )


def guest_scripts(provider: FakeProvider) -> None:
    """The standard scenario: `break` breaks, `fix` fixes, `check` prints True once fixed (or once the
    answer is 42 for a question case)."""

    def brk(m: FakeMachine, env: Mapping[str, str], t: float) -> ScriptResult:
        m.files["/root/x"] = "broken"
        return ok()

    def fix(m: FakeMachine, env: Mapping[str, str], t: float) -> ScriptResult:
        m.files["/root/fixed"] = "1"
        return ok(stdout="fixed\n")

    def check(m: FakeMachine, env: Mapping[str, str], t: float) -> ScriptResult:
        good = "/root/fixed" in m.files or env.get("GH_AGENT_ANSWER") == "42"
        return ok(stdout="checking...\n" + ("True" if good else "False") + "\n")

    provider.scripts.update({"break": brk, "fix": fix, "check": check})
