"""`gh-runner selftest`: prove this host and its images end to end, with real machines.

The first command an operator runs on a lab host after building an image. For each image it runs
the steps in the order `ImageSelftest._lifecycle` reads, each bounded by its own timeout:

    machine -> user_setting -> verdict -> env -> screenshot -> typing -> click -> key_chord -> warm_start
    (cleanup, always, in `run`'s finally)

A step that goes wrong raises `StepFailed(detail, fix)`; the step is recorded as failed with what to
do, and the next step runs (each checks one thing), except that nothing runs on a machine that never
came up. The exit code is 0 only when every step of every image passed. The JSON report has one
entry per step: {"image", "step", "ok", "seconds", "detail"}.

The machines belong to a runner named `<name>-selftest` with its own state directory, so a daemon
on the same host neither reaps them nor advertises the start state the warm-start step saves.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import secrets
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TextIO

from gh_runner import outcome as rules
from gh_runner.selftest_probes import ShellProbes, probes_for
from gh_wire.input import ClickEvent, KeyEvent, TypeEvent
from providers.base import ImageInfo, Machine, MachineSource, Provider, ScriptResult
from providers.errors import ProviderError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

POLL_WITHIN = 45.0  # typed keys and clicks land within a second or two; generous for a loaded host
NON_ASCII_ANSWER = "Grüße aus Zürich — 東京 ✓ \"quoted\" 'single' $HOME `tick`"


class Step(StrEnum):
    MACHINE = "machine"
    USER_SETTING = "user_setting"
    VERDICT = "verdict"
    ENV = "env"
    SCREENSHOT = "screenshot"
    TYPING = "typing"
    CLICK = "click"
    KEY_CHORD = "key_chord"  # desktops: a chord reaches the window manager (ctrl+alt+t opens a terminal)
    WARM_START = "warm_start"
    CLEANUP = "cleanup"


@dataclass(frozen=True)
class StepTimeouts:
    machine: float = 180.0  # a cold boot until every guest channel answers
    script: float = 120.0
    screen: float = 60.0
    typing: float = 120.0
    click: float = 120.0
    warm_start: float = 300.0  # save the memory image, copy the disk, restore a second machine
    cleanup: float = 180.0

    @classmethod
    def for_image(cls, image: ImageInfo) -> StepTimeouts:
        if image.os == "windows" or image.shell == "bash":
            # A cold boot to a signed-in desktop, and a memory image of gigabytes, on a loaded host
            # (linux-desktop boots to its XFCE session in minutes under TCG).
            return cls(machine=900.0, warm_start=900.0)
        return cls()


@dataclass(frozen=True)
class StepResult:
    image: str
    step: str
    ok: bool
    seconds: float
    detail: str


class StepFailed(Exception):
    def __init__(self, detail: str, fix: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.fix = fix

    def text(self) -> str:
        return self.detail + (f"; fix: {self.fix}" if self.fix else "")


def _lines(res: ScriptResult) -> dict[str, str]:
    """`key=value` lines of a probe's stdout (CRLF from Windows included)."""
    out: dict[str, str] = {}
    for line in res.stdout.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep:
            out[key] = value
    return out


def _colours(png: bytes) -> int:
    """Distinct colours in a quarter-size sample of the screen, without blending."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as img:
        rgb = img.convert("RGB")
        small = rgb.resize((max(1, rgb.width // 4), max(1, rgb.height // 4)), Image.Resampling.NEAREST)
        return len(set(small.getdata()))


def _script_ok(what: str, res: ScriptResult, timeout: float) -> None:
    failure = rules.script_failure(what, res, timeout)
    if failure:
        raise StepFailed(failure + (f"; stderr: {rules.tail(res.stderr, 5)}" if res.stderr.strip() else ""))


class ImageSelftest:
    """The steps for one image. `run` never raises but CancelledError; its results say what failed."""

    def __init__(self, provider: Provider, image: ImageInfo, *, timeouts: StepTimeouts = StepTimeouts(),
                 on_result: Callable[[StepResult], None] | None = None) -> None:
        self.provider = provider
        self.image = image
        self.timeouts = timeouts
        self.probes: ShellProbes = probes_for(image.shell)
        self.on_result = on_result
        self.results: list[StepResult] = []
        self.run_id = secrets.token_hex(4)
        self.nonce = secrets.token_hex(8)
        self.machines: list[Machine] = []
        self.machine: Machine | None = None
        self.screen_size: tuple[int, int] | None = None
        self.start_state_id = f"ss_selftest_{self.run_id}"
        self.saved_version: int | None = None
        self.cold_seconds = 0.0

    async def run(self) -> list[StepResult]:
        try:
            await self._lifecycle()
        finally:
            # Its own bound: whatever happened above, the machines and the saved version go.
            await self._step(Step.CLEANUP, self.timeouts.cleanup, self._cleanup, needs_machine=False)
        return self.results

    async def _lifecycle(self) -> None:
        t = self.timeouts
        await self._step(Step.MACHINE, t.machine, self._cold_machine, needs_machine=False)
        await self._step(Step.USER_SETTING, t.script, self._user_setting)
        await self._step(Step.VERDICT, t.script, self._verdict)
        await self._step(Step.ENV, t.script, self._env)
        await self._step(Step.SCREENSHOT, t.screen, self._screenshot)
        await self._step(Step.TYPING, t.typing, self._typing)
        await self._step(Step.CLICK, t.click, self._click)
        if self.probes.chord is not None:
            await self._step(Step.KEY_CHORD, t.typing, self._key_chord)
        await self._step(Step.WARM_START, t.warm_start, self._warm_start)

    async def _step(self, step: Step, timeout: float, work: Callable[[], Awaitable[str]], *,
                    needs_machine: bool = True) -> None:
        started = time.monotonic()
        if needs_machine and self.machine is None:
            self._record(step, False, 0.0, f"not run: the {Step.MACHINE} step failed")
            return
        try:
            async with asyncio.timeout(timeout):
                detail = await work()
            ok = True
        except TimeoutError:
            ok, detail = False, f"did not finish within {timeout:g}s"
        except StepFailed as e:
            ok, detail = False, e.text()
        except ProviderError as e:
            ok, detail = False, f"{type(e).__name__}: {e}"
        except Exception as e:  # a bug or an unexpected peer error in one step must not hide the others
            ok, detail = False, f"the step itself crashed: {type(e).__name__}: {e}"
        self._record(step, ok, time.monotonic() - started, detail)

    def _record(self, step: Step, ok: bool, seconds: float, detail: str) -> None:
        r = StepResult(image=self.image.name, step=str(step), ok=ok, seconds=round(seconds, 2), detail=detail)
        self.results.append(r)
        if self.on_result is not None:
            self.on_result(r)

    async def _new_machine(self, source: MachineSource, timeout: float) -> Machine:
        deadline = time.monotonic() + timeout
        mid = f"st_{self.run_id}_{len(self.machines) + 1}"
        m = await self.provider.create_machine(mid, source, timeout=timeout)
        self.machines.append(m)
        await m.wait_ready(max(1.0, deadline - time.monotonic()))
        return m

    async def _run(self, script: str, env: dict[str, str] | None = None) -> ScriptResult:
        assert self.machine is not None
        return await self.machine.run_script(script, env=env, timeout=self.timeouts.script)

    # -- the steps ---------------------------------------------------------------------------

    async def _cold_machine(self) -> str:
        started = time.monotonic()
        try:
            self.machine = await self._new_machine(MachineSource(image=self.image.name), self.timeouts.machine)
        except ProviderError as e:
            raise StepFailed(f"{type(e).__name__}: {e}",
                             "run `gh-runner doctor`; see the machine's console.log under the state dir") from None
        self.cold_seconds = time.monotonic() - started
        return f"cold boot, guest channel up in {self.cold_seconds:.1f}s"

    async def _user_setting(self) -> str:
        res = await self._run(self.probes.user_setting, {"GH_SELFTEST_NONCE": self.nonce})
        _script_ok("per-user setting probe", res, self.timeouts.script)
        got = _lines(res)
        if got.get("value") != self.nonce:
            raise StepFailed(f"wrote {self.nonce!r} to {self.probes.setting_name} and read back "
                             f"{got.get('value')!r}", "the script is not running with the user's own profile")
        user, console = got.get("user", ""), got.get("console_user", "")
        if not console or user.lower() != console.lower():
            raise StepFailed(f"scripts run as {user!r}, the console is signed in as {console!r}",
                             self.probes.signed_in_fix)
        if got.get("elevated") != "True":
            raise StepFailed(f"scripts run as {user!r} without an elevated token ({got.get('elevated')!r})",
                             self.probes.elevated_fix)
        return f"{self.probes.setting_name} written and read back as {user} (the console user), elevated"

    async def _verdict(self) -> str:
        seen = []
        for want in ("True", "False"):
            res = await self._run(self.probes.print_bool(want == "True"))
            j = rules.judge_after(res, self.timeouts.script)
            expected = "passed" if want == "True" else "failed"
            if j.outcome != expected:
                raise StepFailed(f"a check printing {want} was judged {j.outcome}"
                                 + (f" ({j.reason})" if j.reason else "") + f"; stdout {res.stdout!r}")
            seen.append(f"{want} -> {j.outcome} (stdout {res.stdout!r})")
        return "; ".join(seen)

    async def _env(self) -> str:
        res = await self._run(self.probes.print_env, {"GH_CHECK_PHASE": "after", "GH_AGENT_ANSWER": NON_ASCII_ANSWER})
        _script_ok("environment probe", res, self.timeouts.script)
        got = _lines(res)
        if got.get("phase") != "after" or got.get("answer") != NON_ASCII_ANSWER:
            raise StepFailed(f"GH_CHECK_PHASE={got.get('phase')!r}, GH_AGENT_ANSWER={got.get('answer')!r}; "
                             f"expected 'after' and {NON_ASCII_ANSWER!r}",
                             "the script channel loses or re-encodes the environment")
        return "GH_CHECK_PHASE and a non-ASCII GH_AGENT_ANSWER reached the script intact"

    async def _screenshot(self) -> str:
        from PIL import Image

        assert self.machine is not None
        png = await self.machine.screenshot()
        try:
            with Image.open(io.BytesIO(png)) as img:
                size = img.size
                lo, hi = img.convert("L").getextrema()
        except (OSError, ValueError) as e:
            raise StepFailed(f"the screenshot is not a readable PNG: {e}") from None
        if lo == hi:
            raise StepFailed(f"the screenshot ({size[0]}x{size[1]}) is blank: every pixel is {lo}",
                             "the guest shows nothing on its display: check the image's video device and that "
                             "it reached its desktop or console")
        self.screen_size = size
        if self.probes.min_colours is not None:
            colours = _colours(png)
            if colours < self.probes.min_colours:
                raise StepFailed(f"the screenshot ({size[0]}x{size[1]}) has {colours} colours: a console or a "
                                 "blank screen, not the desktop",
                                 "the image's session did not come up on its display: see the guest's "
                                 "/var/log/lightdm and ~/.xsession-errors")
            return f"{size[0]}x{size[1]} PNG of a desktop ({colours} colours), not blank, not a console"
        return f"{size[0]}x{size[1]} PNG, not blank (luma {lo}..{hi})"

    async def _typing(self) -> str:
        assert self.machine is not None
        text = f"gh{self.nonce}"
        res = await self._run(self.probes.typing_prepare)
        _script_ok("typing probe setup", res, self.timeouts.script)
        await self.machine.send_input([TypeEvent(text=self.probes.typed_line(text)), KeyEvent(keys=["ENTER"])])
        got = await self._poll(self.probes.typing_read, lambda r: r.exit_code == 0 and text in r.stdout)
        if got is None:
            raise StepFailed(f"typed {text!r} on the console but a script never read it back",
                             "keys do not reach the guest's console: check the image's keyboard and focus")
        return f"typed {text!r}; a script read it back"

    async def _click(self) -> str:
        assert self.machine is not None
        if self.screen_size is None:
            raise StepFailed(f"no screen size: the {Step.SCREENSHOT} step failed")
        w, h = self.screen_size
        x, y = w // 3, h * 2 // 3
        res = await self._run(self.probes.click_prepare)
        _script_ok("pointer probe setup", res, self.timeouts.script)
        await self.machine.send_input([ClickEvent(x=x, y=y, button="left")])
        seen: list[tuple[int, int]] = []

        def landed(r: ScriptResult) -> bool:
            pos = self.probes.click_position(r, (w, h)) if r.exit_code == 0 else None
            if pos is not None:
                seen.append(pos)
            return pos is not None

        if await self._poll(self.probes.click_read, landed) is None:
            raise StepFailed(f"clicked at {x},{y} but the guest saw no click",
                             "the pointer does not reach the guest: check the manifest's `tablet`")
        gx, gy = seen[-1]
        if abs(gx - x) > 2 or abs(gy - y) > 2:
            raise StepFailed(f"clicked at {x},{y} of {w}x{h}; the guest saw it at {gx},{gy}",
                             "pointer coordinates are scaled wrongly for this screen size")
        return f"clicked at {x},{y}; the guest saw the click at {gx},{gy}"

    async def _key_chord(self) -> str:
        assert self.machine is not None and self.probes.chord is not None
        chord = "+".join(self.probes.chord)
        try:
            await self.machine.send_input([KeyEvent(keys=self.probes.chord)])
            if await self._poll(self.probes.chord_seen, lambda r: r.exit_code == 0) is None:
                raise StepFailed(f"pressed {chord} but its effect never showed ({self.probes.chord_seen})",
                                 "key chords do not reach the desktop: check the image's keyboard and shortcuts")
        finally:
            await self._run(self.probes.chord_undo)
        return f"pressed {chord}; the desktop acted on it"

    async def _warm_start(self) -> str:
        assert self.machine is not None
        started = time.monotonic()
        saved = await self.machine.save(self.start_state_id, 1, with_memory=True)
        self.saved_version = saved.version
        if saved.memory_image is None:
            raise StepFailed("the provider saved no memory image, so there is no warm start")
        save_s = time.monotonic() - started
        started = time.monotonic()
        warm = await self._new_machine(
            MachineSource(image=self.image.name, start_state_id=self.start_state_id, version=saved.version),
            self.timeouts.warm_start)
        warm_s = time.monotonic() - started
        res = await warm.run_script(self.probes.read_setting, env=None, timeout=self.timeouts.script)
        _script_ok("per-user setting read on the warm machine", res, self.timeouts.script)
        if _lines(res).get("value") != self.nonce:
            raise StepFailed(f"the warm machine does not have the setting written before the save "
                             f"(read {_lines(res).get('value')!r})")
        return (f"memory saved in {save_s:.1f}s; warm start ready in {warm_s:.1f}s "
                f"(cold {self.cold_seconds:.1f}s), the setting survived")

    async def _cleanup(self) -> str:
        problems: list[str] = []
        for m in self.machines:
            try:
                await m.destroy()
            except ProviderError as e:
                problems.append(f"destroy failed: {e}")
        if self.saved_version is not None:
            try:
                await self.provider.delete_version(self.start_state_id, self.saved_version)
            except ProviderError as e:
                problems.append(f"deleting the saved version failed: {e}")
        # What a restarted runner would find and reap: nothing, if the destroys left nothing.
        left = await self.provider.reap(set())
        if left:
            problems.append(f"left behind and now reaped: {', '.join(left)}")
        held = [v for s, v in await self.provider.held_versions() if s == self.start_state_id]
        if held:
            problems.append(f"start-state versions still held: {held}")
        if problems:
            raise StepFailed("; ".join(problems), "report this: a destroyed machine must leave nothing")
        return f"{len(self.machines)} machine(s) destroyed; no domain, overlay or saved version left"

    async def _poll(self, script: str, done: Callable[[ScriptResult], bool]) -> ScriptResult | None:
        """Run `script` until `done` says so, for POLL_WITHIN seconds; None if it never does."""
        deadline = time.monotonic() + POLL_WITHIN
        while True:
            res = await self._run(script)
            if done(res):
                return res
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.5)


# ---------------------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------------------


def print_result(r: StepResult, out: TextIO) -> None:
    status = "ok" if r.ok else "FAIL"
    out.write(f"{status:<5} {r.image:<14} {r.step:<13} {r.seconds:>7.1f}s  {r.detail}\n")
    out.flush()


async def run_selftest(provider: Provider, images: Sequence[str] | None, *, out: TextIO,
                       timeouts: StepTimeouts | None = None) -> tuple[int, list[StepResult]]:
    """Run every step for the named images (default: all the provider would advertise)."""
    available = {i.name: i for i in await provider.list_images()}
    names = list(images) if images else sorted(available)
    unknown = [n for n in names if n not in available]
    if unknown:
        out.write(f"gh-runner selftest: no usable image named {', '.join(unknown)} "
                  f"(usable here: {', '.join(sorted(available)) or 'none'}; `gh-runner doctor` says why)\n")
        return EXIT_USAGE, []
    if not names:
        out.write("gh-runner selftest: no images to test (build one with image-builder/build)\n")
        return EXIT_FAILED, []
    results: list[StepResult] = []
    for name in names:
        info = available[name]
        results += await ImageSelftest(provider, info, timeouts=timeouts or StepTimeouts.for_image(info),
                                       on_result=lambda r: print_result(r, out)).run()
    failed = [r for r in results if not r.ok]
    if failed:
        out.write(f"\n{len(failed)} step(s) failed: "
                  + ", ".join(f"{r.image} {r.step}" for r in failed) + "\n")
        return EXIT_FAILED, results
    out.write(f"\nall {len(results)} steps passed\n")
    return EXIT_OK, results


def main(args: argparse.Namespace) -> int:
    """`gh-runner selftest`: `args.runner_config` (resolved), `args.image` (list or None), `args.json`."""
    from providers.qemu import QemuProvider  # type: ignore[attr-defined]

    config = args.runner_config
    provider: Provider = QemuProvider(config.images_dir, Path(config.state_dir) / "selftest",
                                      f"{config.name}-selftest", config.libvirt_uri)

    async def go() -> tuple[int, list[StepResult]]:
        try:
            return await run_selftest(provider, args.image, out=sys.stdout)
        finally:
            await provider.close()

    try:
        code, results = asyncio.run(go())
    except ProviderError as e:
        print(f"gh-runner selftest: {e} (run `gh-runner doctor`)", file=sys.stderr)
        return EXIT_FAILED
    if args.json is not None:
        write_report(Path(args.json), results)
    return code


def write_report(path: Path, results: Sequence[StepResult]) -> None:
    data: list[dict[str, Any]] = [asdict(r) for r in results]
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


__all__ = ["ImageSelftest", "Step", "StepResult", "StepTimeouts", "main", "run_selftest", "write_report"]
