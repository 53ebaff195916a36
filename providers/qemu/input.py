"""Input through the hypervisor: QMP input-send-event for the USB tablet, sendKey for keys.

Keys go through QEMU's paced key queue (sendKey returns before the keys are delivered), while
pointer events are delivered at once; to keep a mixed sequence in order, pointer events wait until
the queued keys have been played.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import libvirt
import libvirt_qemu

from gh_wire.input import (
    ClickEvent,
    DoubleClickEvent,
    InputEvent,
    KeyEvent,
    MouseDownEvent,
    MouseUpEvent,
    MoveEvent,
    TypeEvent,
)
from providers.errors import InputNotSupported
from providers.qemu.errors import in_thread
from providers.qemu.handle import Domain
from providers.qemu.keymap import combo_keys, text_keys

ABS_MAX = 32767
HOLD_MS = 15  # long enough for PS/2 and Windows to register, short enough to type ~60 chars/s
# QEMU drops queued key events past a limit; keep what is queued to a few seconds' worth.
MAX_QUEUED_S = 2.0
# Between two pointer reports (a move, a press, a release). The tablet hands the guest one report
# per poll; sent back to back, a burst of them reaches the guest's X server faster than it takes
# them apart (measured on linux-desktop under TCG: 3 of 6 clicks sent back to back arrived, all 6
# with 20 ms between reports). A person's click is ~100 ms from press to release.
POINTER_GAP_S = 0.02


def abs_value(pos: int, size: int) -> int:
    """Screen pixel to the tablet's 0..32767 axis."""
    if size <= 1:
        return 0
    pos = max(0, min(pos, size - 1))
    return round(pos * ABS_MAX / (size - 1))


def move_events(x: int, y: int, size: tuple[int, int]) -> list[dict[str, Any]]:
    return [
        {"type": "abs", "data": {"axis": "x", "value": abs_value(x, size[0])}},
        {"type": "abs", "data": {"axis": "y", "value": abs_value(y, size[1])}},
    ]


def button_event(button: str, down: bool) -> list[dict[str, Any]]:
    return [{"type": "btn", "data": {"down": down, "button": button}}]


def pointer_batches(ev: InputEvent, size: tuple[int, int]) -> list[list[dict[str, Any]]]:
    """Each batch is one input-send-event (one HID report): a press and its release must not share
    a report, or the tablet reports only the final state and the click is lost. The move shares the
    first button's report, as a pen touching down at a point does: the guest applies a report's
    position before its buttons, and each report costs a pacing gap (POINTER_GAP_S)."""
    if isinstance(ev, TypeEvent | KeyEvent):
        raise InputNotSupported(f"not a pointer event: {ev.type}")
    at = move_events(ev.x, ev.y, size)
    if isinstance(ev, MoveEvent):
        return [at]
    if isinstance(ev, ClickEvent | DoubleClickEvent):
        clicks = 2 if isinstance(ev, DoubleClickEvent) else 1
        out: list[list[dict[str, Any]]] = []
        for _ in range(clicks):
            out += [button_event(ev.button, True), button_event(ev.button, False)]
    elif isinstance(ev, MouseDownEvent | MouseUpEvent):
        out = [button_event(ev.button, isinstance(ev, MouseDownEvent))]
    else:
        out = []
        for notches, wheel in ((ev.dy, "wheel-down" if ev.dy > 0 else "wheel-up"),
                               (ev.dx, "wheel-right" if ev.dx > 0 else "wheel-left")):
            for _ in range(abs(notches)):
                out += [button_event(wheel, True), button_event(wheel, False)]
        if not out:
            return [at]
    out[0] = at + out[0]
    return out


async def _until(t: float) -> None:
    left = t - time.monotonic()
    if left > 0:
        await asyncio.sleep(left)


class InputDriver:
    def __init__(self, domain: Domain, screen_size: Callable[[], Awaitable[tuple[int, int]]],
                 *, call_timeout: float = 10.0) -> None:
        self.domain = domain
        self.screen_size = screen_size
        self.call_timeout = call_timeout
        self._keys_done_at = 0.0
        self._pointer_quiet_at = 0.0  # no report or key before this: the last pointer report's gap
        self._last_press_at = 0.0  # when QEMU plays the press of the last chord sent

    def _monitor_blocking(self, cmd: str) -> str:
        def go(_c: libvirt.virConnect, dom: libvirt.virDomain) -> str:
            return str(libvirt_qemu.qemuMonitorCommand(dom, cmd, 0))

        return self.domain.call_blocking(go, retry=False)  # an event sent twice is a second click

    def _send_key_blocking(self, codes: list[int], hold_ms: int = HOLD_MS) -> None:
        def go(_c: libvirt.virConnect, dom: libvirt.virDomain) -> None:
            dom.sendKey(libvirt.VIR_KEYCODE_SET_LINUX, hold_ms, codes, len(codes), 0)

        self.domain.call_blocking(go, retry=False)  # keys sent twice type twice

    async def _send_pointer(self, events: list[dict[str, Any]]) -> None:
        cmd = json.dumps({"execute": "input-send-event", "arguments": {"events": events}})
        reply = await in_thread("sending pointer input", self._monitor_blocking, cmd, timeout=self.call_timeout)
        parsed = json.loads(reply)
        if "error" in parsed:
            raise InputNotSupported(f"the hypervisor refused pointer input: {parsed['error'].get('desc')}")

    async def _send_chord(self, codes: list[int], hold_ms: int = HOLD_MS) -> None:
        queued = self._keys_done_at - time.monotonic()
        if queued > MAX_QUEUED_S:
            await asyncio.sleep(queued - MAX_QUEUED_S)
        await in_thread("sending keys", self._send_key_blocking, codes, hold_ms, timeout=self.call_timeout)
        # QEMU plays each chord as: press, hold, release, then its inter-key delay; a chord sent
        # while another plays waits behind it in QEMU's queue.
        self._last_press_at = max(self._keys_done_at, time.monotonic())
        self._keys_done_at = self._last_press_at + (hold_ms + 10) / 1000

    async def _drain_keys(self) -> None:
        await _until(self._keys_done_at)

    async def _pointer_gap(self) -> None:
        # Paced between reports, and before a key that follows one (the release of a click must
        # reach the guest before the text typed into what it clicked); not after the last report of
        # a request: whatever comes next waits here instead.
        await _until(self._pointer_quiet_at)

    async def deliver(self, events: Sequence[InputEvent]) -> None:
        # Validate everything first so that a bad event sends nothing rather than half a sequence.
        plans: list[tuple[str, Any, int]] = []
        for ev in events:
            if isinstance(ev, TypeEvent):
                plans.append(("keys", text_keys(ev.text), HOLD_MS))
            elif isinstance(ev, KeyEvent):
                plans.append(("keys", [combo_keys(ev.keys)], ev.hold_ms or HOLD_MS))
            else:
                plans.append(("pointer", ev, 0))
        size: tuple[int, int] | None = None
        for kind, plan, hold_ms in plans:
            if kind == "keys":
                await self._pointer_gap()
                for chord in plan:
                    await self._send_chord(chord, hold_ms)
            else:
                await self._drain_keys()
                if size is None:
                    size = await self.screen_size()
                for batch in pointer_batches(plan, size):
                    await self._pointer_gap()
                    await self._send_pointer(batch)
                    self._pointer_quiet_at = time.monotonic() + POINTER_GAP_S
        # Done once the last key is pressed: typed text is all in, and a key's release (QEMU plays it
        # HOLD_MS later) is no reason to hold back the agent's next look; the next pointer report
        # waits for it. A key the agent asked to hold is held for as long as it asked.
        held = any(isinstance(ev, KeyEvent) and ev.hold_ms for ev in events)
        await _until(self._keys_done_at if held else self._last_press_at)
