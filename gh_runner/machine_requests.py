"""One server of machine requests: screen, input and exec on one machine, for whoever holds it.

An attempt's agent (during the task phase: `gh_runner.attempt`) and a person working on an open
start state (`gh_runner.jobs`) send the same `machine_request`s; both are answered here, with one
output cap, one timeout rule and one way of saying what went wrong:

- screen: bounded by `timeouts.screen`.
- input:  the events in order, each bounded by `timeouts.screen`; a failure says which event and
          which were delivered before it.
- accessibility: the session's AT-SPI tree as XML (providers/qemu/atspi_tree.py), within
          ACCESSIBILITY_TIMEOUT and ACCESSIBILITY_MAX_BYTES (each a typed refusal when exceeded, as is a
          machine without a desktop); one read at a time per machine (GLib in the guest crashes in
          concurrent AT-SPI reads: OSWorld 2.0's E2B port, at 98 workers).
- exec:   the provider stops the script at the request's `timeout`; this adds SCRIPT_SLACK on top,
          which only catches a guest channel that stopped answering altogether. Each stream is cut
          at EXEC_OUTPUT_CAP, which keeps a `machine_response` well under the frame limit.

`serve` never raises but CancelledError: every failure is a refusal with a reason the sender can
read (redacted: a secret the request carried never comes back in an error).

With a `ReplayRecorder` (attempts) every request is also a step of the replay: the screen the agent
saw, the screen after each input event (masked from the first secret typed), and the screen after
an exec with its script, exit code and output's tail. Without one (start states) nothing is recorded.

An attempt's agent (`frozen` given) has its execs run in groups a takeover's hold freezes
(`Machine.run_agent_script`, gh_common/task_hold.py); an exec that stood still while it ran says so
in its answer (`frozen`: why, and for how many seconds). A person's execs (start states) are never grouped.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable

import structlog

from gh_runner.config import Timeouts
from gh_runner.replay import ReplayRecorder, exec_event, is_secret_event, redact_event, redact_text, with_note
from gh_runner.save_points import SavePoints
from gh_wire.protocol import ExecFrozen, MachineRefusal, MachineRequest, MachineResponse, SavePoint
from gh_wire.vocab import ExecFreeze
from providers.base import Machine, ScriptResult
from providers.errors import AccessibilityTooLarge, InputNotSupported, NoAccessibilityTree, ProviderError

log = structlog.get_logger(__name__)

# The provider stops a script at its own timeout; this extra margin only catches a guest channel
# that stopped answering altogether, so that a request (or a phase) can never hang past its bound.
SCRIPT_SLACK = 15.0
# How often an agent's exec in flight looks whether a hold froze it meanwhile (to move our bound on);
# well under SCRIPT_SLACK, so a freeze is seen before the bound could pass.
FROZEN_LOOK_S = 1.0
EXEC_OUTPUT_CAP = 256 * 1024  # per stream; keeps a machine_response well under the frame limit
# The accessibility tree: a LibreOffice or browser window's tree is some hundreds of KB; 4 MiB of XML,
# escaped into JSON, stays well under the frame limit. 120 s: a whole desktop's read under TCG on a
# loaded host (bench/a11y_read.py).
ACCESSIBILITY_MAX_BYTES = 4 * 1024 * 1024
ACCESSIBILITY_TIMEOUT = 120.0


def refuse(req: MachineRequest, reason: str) -> MachineResponse:
    return MachineResponse(request_id=req.request_id, ok=False, error=reason)


class MachineRequests:
    """Answers machine requests on `machine`. One per machine: its screenshots take turns (the
    replay's watcher and a request never grab the screen at once)."""

    def __init__(self, machine: Machine, timeouts: Timeouts, replay: ReplayRecorder | None = None,
                 frozen: Callable[[], float] | None = None) -> None:
        """`frozen`: for an agent, the seconds its execs have been frozen so far (TaskHold.frozen_seconds)."""
        self.machine = machine
        self._timeouts = timeouts
        self._replay = replay
        self._frozen = frozen
        self._screen_lock = asyncio.Lock()
        self.steps = 0  # input and exec requests served: the step a save point is made at
        self._restored: SavePoint | None = None  # went back to this save point; the next action is refused
        self.save_points: SavePoints | None = None  # an attempt's machine (a start state's has none)
        self._accessibility_lock = asyncio.Lock()

    def restored_at(self, point: SavePoint) -> None:
        """The machine is `point`'s (an attempt that goes on from a save point): the steps are its, and the
        agent's next input or exec is refused `machine_restored`, not done: it was planned on a screen
        the agent saw before the runner was lost, and the agent must look again."""
        self.steps = point.step
        self._restored = point

    async def screenshot(self) -> bytes:
        """The machine's screen as PNG, bounded by `timeouts.screen`."""
        async with self._screen_lock:
            async with asyncio.timeout(self._timeouts.screen):
                return await self.machine.screenshot()

    async def serve(self, req: MachineRequest) -> MachineResponse:
        """Answer one request, or refuse it with a reason."""
        log.info("machine request", request_id=req.request_id, op=req.op)
        if self._restored is not None and req.op in ("input", "exec"):
            point, self._restored = self._restored, None
            refusal = refuse(req, f"not done: the machine went back to save point {point.save_point_id} (step "
                                  f"{point.step}) after its runner was lost; look again")
            refusal.refusal = MachineRefusal.RESTORED
            refusal.save_point = point  # the agent's steps go back to its (gh_server/agents/machine_api.py)
            return refusal
        try:
            if req.op == "screen":
                return await self._screen(req)
            if req.op == "input":
                return await self._input(req)
            if req.op == "exec":
                return await self._exec(req)
            if req.op == "save_point":
                return await self._save_point(req)
            if req.op == "accessibility":
                return await self._accessibility(req)
            return refuse(req, f"unknown op {req.op!r}")
        except TimeoutError:
            return refuse(req, f"{req.op} got no answer from the machine in time")
        except ProviderError as e:
            return refuse(req, redact_text(str(e), req.redact))
        except Exception as e:
            log.exception("machine request failed", request_id=req.request_id, op=req.op)
            return refuse(req, f"internal runner error: {type(e).__name__}")

    async def _save_point(self, req: MachineRequest) -> MachineResponse:
        if self.save_points is None:
            return refuse(req, "this machine takes no save points (only an attempt's does)")
        point = await self.save_points.save(self.steps)
        return MachineResponse(request_id=req.request_id, ok=True, save_point=point)

    async def _screen(self, req: MachineRequest) -> MachineResponse:
        png = await self.screenshot()
        if self._replay is not None:  # the screen the agent saw is a step of its trajectory
            await self._replay.send_frame("screen", png, with_note({"type": "screen"}, req.note, req.redact))
        return MachineResponse(request_id=req.request_id, ok=True, png_b64=base64.b64encode(png).decode())

    async def _input(self, req: MachineRequest) -> MachineResponse:
        if not req.events:
            return refuse(req, "an input request needs at least one event")
        for i, event in enumerate(req.events):
            secret = is_secret_event(event, req.redact)
            if secret and self._replay is not None:
                self._replay.mask_from_now()  # before the keys go in: the watcher may look at any moment
            try:
                async with asyncio.timeout(self._timeouts.screen):
                    await self.machine.send_input([event])
            except (ProviderError, TimeoutError) as e:
                where = f"input event {i + 1} of {len(req.events)} ({event.type})"
                done = f"; events 1-{i} were delivered" if i else ""
                if secret:
                    # The provider's message may quote the text (a character it cannot type): not for a secret.
                    detail = "could not be delivered"
                elif isinstance(e, TimeoutError):
                    detail = "got no answer from the machine in time"
                else:
                    detail = f"could not be delivered: {redact_text(str(e), req.redact)}"
                refusal = refuse(req, f"{where} {detail}{done}")
                if isinstance(e, InputNotSupported):
                    refusal.refusal = MachineRefusal.INPUT_NOT_SUPPORTED  # the request's fault, not the machine's
                return refusal
            if self._replay is not None:
                shown = redact_event(event, req.redact)
                await self._frame_after("input", with_note(shown, req.note, req.redact) if i == 0 else shown)
        self.steps += 1
        return MachineResponse(request_id=req.request_id, ok=True)

    async def _accessibility(self, req: MachineRequest) -> MachineResponse:
        timeout = min(req.timeout, ACCESSIBILITY_TIMEOUT)
        try:
            async with self._accessibility_lock:
                async with asyncio.timeout(timeout + SCRIPT_SLACK):
                    xml = await self.machine.accessibility_tree(timeout, ACCESSIBILITY_MAX_BYTES)
        except (NoAccessibilityTree, AccessibilityTooLarge, TimeoutError) as e:
            refusal = refuse(req, str(e) or f"the accessibility tree was not read in {timeout:g} s")
            refusal.refusal = (MachineRefusal.NO_ACCESSIBILITY if isinstance(e, NoAccessibilityTree)
                               else MachineRefusal.ACCESSIBILITY_TOO_LARGE if isinstance(e, AccessibilityTooLarge)
                               else MachineRefusal.ACCESSIBILITY_TIMEOUT)
            return refusal
        return MachineResponse(request_id=req.request_id, ok=True, xml=xml)

    async def _exec(self, req: MachineRequest) -> MachineResponse:
        if not req.script:
            return refuse(req, "an exec request needs a script")
        frozen_before = self._frozen() if self._frozen is not None else 0.0
        try:
            async with asyncio.timeout(req.timeout + SCRIPT_SLACK) as bound:
                if self._frozen is None:
                    res = await self.machine.run_script(req.script, env=req.env, timeout=req.timeout,
                                                        output_cap=EXEC_OUTPUT_CAP)
                else:
                    run = asyncio.ensure_future(self.machine.run_agent_script(
                        req.script, env=req.env, timeout=req.timeout, output_cap=EXEC_OUTPUT_CAP))
                    res = await self._while_frozen_too(run, bound, self._frozen)
        except (ProviderError, TimeoutError) as e:
            if await self._guest_runs():
                # The script ran elevated and the channel under it died while the guest runs on: what it
                # did (killing or stopping the guest agent) is the sender's, not the machine's failure.
                what = "got no answer" if isinstance(e, TimeoutError) else redact_text(str(e), req.redact)
                refusal = refuse(req, f"the guest channel failed while this script ran ({what}); the guest "
                                      "still runs, so the script is what stopped it")
                refusal.refusal = MachineRefusal.CHANNEL_LOST_IN_EXEC
                return refusal
            raise
        self.steps += 1
        if self._replay is not None:
            # An exec is a step of the trajectory too: its script, exit code and output's tail, on the screen
            # as it is after it.
            await self._frame_after("exec", with_note(exec_event(req.script, res.exit_code, res.stdout, res.stderr,
                                                                 res.timed_out, req.redact), req.note, req.redact))
        return MachineResponse(
            request_id=req.request_id,
            ok=True,
            exit_code=res.exit_code,
            stdout=res.stdout,
            stderr=res.stderr,
            stdout_truncated=res.stdout_truncated,
            stderr_truncated=res.stderr_truncated,
            timed_out=res.timed_out,
            frozen=self._frozen_for(frozen_before),
        )

    def _frozen_for(self, before: float) -> ExecFrozen | None:
        """What a hold took of an exec that began when `frozen` said `before`; None when none."""
        if self._frozen is None:
            return None
        seconds = round(self._frozen() - before, 3)
        return ExecFrozen(reason=ExecFreeze.TAKEOVER, seconds=seconds) if seconds > 0 else None

    @staticmethod
    async def _while_frozen_too(run: asyncio.Future[ScriptResult], bound: asyncio.Timeout,
                                frozen: Callable[[], float]) -> ScriptResult:
        """Await an agent's exec; our own bound on it moves on by every second it stands frozen, so
        a long hold never turns its exec into a channel failure of ours."""
        counted = frozen()
        try:
            while True:
                done, _ = await asyncio.wait({run}, timeout=FROZEN_LOOK_S)
                if done:
                    return run.result()
                now = frozen()
                if now > counted:
                    when = bound.when()
                    if when is not None:
                        bound.reschedule(when + now - counted)
                    counted = now
        finally:
            run.cancel()  # our bound passed, or the request was cancelled: the exec's wait ends with it

    async def _guest_runs(self) -> bool:
        """The hypervisor says the guest runs (bounded; any doubt is False: then the failure is ours)."""
        try:
            async with asyncio.timeout(self._timeouts.screen):
                return await self.machine.guest_running()
        except asyncio.CancelledError:
            raise
        except Exception:
            return False

    async def _frame_after(self, label: str, shown: dict[str, object]) -> None:
        """The screen after an action, as a replay frame; best effort (a screenshot that fails leaves
        the action without its frame, never fails the action)."""
        assert self._replay is not None
        try:
            png = await self.screenshot()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning(f"screenshot after {label} failed", error=f"{type(e).__name__}: {str(e)[:200]}")
            return
        await self._replay.send_frame(label, png, shown)
