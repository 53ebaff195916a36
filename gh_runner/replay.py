"""Runner-side replay capture: which screens become frames, and what of an input event may be shown.

Frames are best effort: a failed screenshot or a slow link is logged and dropped, never allowed to
fail an attempt. Secrets the server names in a request's `redact` list never leave this module in
a frame's event, a log line or an error message. A frame is an image, so text cannot be taken out
of it: once a secret has been typed, every later frame of the attempt is sent as a coarse mosaic
(layout and colour stay, text does not), because a guest may echo what was typed. The first
masked frame that leaves carries `"masked": true` in its event (how the server tells that the replay
masks), and `ReplayRecorder.masked` is set from that moment (how the attempt's live views for
watchers know they must end: gh_runner/live_views.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from PIL import Image, ImageChops

from gh_wire.input import InputEvent
from gh_wire.masking import mask_png

log = structlog.get_logger(__name__)

REDACTED = "•••"

# A change smaller than this (bounding box of changed pixels, in px²) is a blinking cursor or caret,
# not something worth a frame: an underline cursor is 8x2, a Windows caret about 2x18. Anything the
# agent typed gets its own "input" frame anyway.
MIN_CHANGE_AREA = 256
# Greyscale difference below this is compression noise or a colour fade, not a change.
PIXEL_THRESHOLD = 24


class FrameSink(Protocol):
    async def frame(self, label: str, png: bytes, event: dict[str, Any] | None) -> None: ...


def _secrets(redact: Sequence[str]) -> list[str]:
    # Longest first so a secret that contains another is replaced whole.
    return sorted({s for s in redact if s}, key=len, reverse=True)


def redact_text(text: str, redact: Sequence[str]) -> str:
    """`text` with every occurrence of a secret replaced by •••."""
    for s in _secrets(redact):
        text = text.replace(s, REDACTED)
    return text


def is_secret_event(event: InputEvent, redact: Sequence[str]) -> bool:
    """A `type` event whose text is, or contains, a secret: its text must never be shown."""
    text = getattr(event, "text", None)
    return event.type == "type" and isinstance(text, str) and any(s in text for s in _secrets(redact))


def redact_event(event: InputEvent, redact: Sequence[str]) -> dict[str, Any]:
    """The event as it may appear in a replay frame or a log."""
    shown = event.model_dump(exclude_none=True)
    if is_secret_event(event, redact):
        shown["text"] = REDACTED
    return shown


# An exec's frame shows the script's start and the output's end: enough to follow what the agent did
# without turning the replay into a log store.
EXEC_SCRIPT_SHOWN = 2000
EXEC_TAIL_SHOWN = 1000


def redact_value(value: Any, redact: Sequence[str]) -> Any:
    """Every string inside `value` (dicts, lists) with the secrets replaced."""
    if isinstance(value, str):
        return redact_text(value, redact)
    if isinstance(value, dict):
        return {str(k): redact_value(v, redact) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(v, redact) for v in value]
    return value


def with_note(shown: dict[str, Any], note: dict[str, Any] | None, redact: Sequence[str]) -> dict[str, Any]:
    """A frame's event with what the agent said for its request (`MachineRequest.note`), redacted."""
    if note:
        shown = {**shown, "note": redact_value(note, redact)}
    return shown


def exec_event(script: str, exit_code: int | None, stdout: str, stderr: str, timed_out: bool,
               redact: Sequence[str]) -> dict[str, Any]:
    """An exec as its replay frame shows it: the script, the exit code and the output's tail, redacted."""
    return {
        "type": "exec",
        "script": redact_text(script, redact)[:EXEC_SCRIPT_SHOWN],
        "exit_code": exit_code,
        "timed_out": timed_out,
        "stdout_tail": redact_text(stdout, redact)[-EXEC_TAIL_SHOWN:],
        "stderr_tail": redact_text(stderr, redact)[-EXEC_TAIL_SHOWN:],
    }


@dataclass(frozen=True)
class _Screen:
    digest: bytes
    grey: Image.Image


def _decode(png: bytes) -> _Screen:
    with Image.open(io.BytesIO(png)) as im:
        grey = im.convert("L")
    return _Screen(hashlib.sha256(png).digest(), grey)


def changed(before: _Screen | None, after: _Screen) -> bool:
    """Whether `after` differs enough from `before` to deserve a frame (pure, for tests)."""
    if before is None:
        return True
    if before.digest == after.digest:
        return False
    if before.grey.size != after.grey.size:
        return True
    diff = ImageChops.difference(before.grey, after.grey).point(lambda v: 255 if v >= PIXEL_THRESHOLD else 0)
    box = diff.getbbox()
    if box is None:
        return False
    left, top, right, bottom = box
    w, h = right - left, bottom - top
    return w * h >= MIN_CHANGE_AREA and min(w, h) > 2


class ReplayRecorder:
    """Sends an attempt's frames through its link, in order, remembering the last screen sent."""

    def __init__(self, sink: FrameSink, *, attempt_id: str, send_timeout: float = 15.0) -> None:
        self._sink = sink
        self._attempt_id = attempt_id
        self._watching = False
        self._send_timeout = send_timeout
        self._last: _Screen | None = None
        self._lock = asyncio.Lock()  # frames leave in the order they were taken
        # Set when a secret is about to be typed: no later frame, and no watcher's live view, may show
        # the screen as it is.
        self.masked = asyncio.Event()
        self._mask_said = False  # a frame with `"masked": true` in its event has left
        self.sent = 0

    def mask_from_now(self) -> None:
        """A secret is about to be typed: no later frame may show the screen as it is."""
        self.masked.set()

    async def send_frame(self, label: str, png: bytes, event: dict[str, Any] | None = None) -> bool:
        """Send one frame; False (and a log line) if it could not be sent. Callers pass a redacted event."""
        try:
            screen: _Screen | None = await asyncio.to_thread(_decode, png)
        except Exception as e:  # a PNG we cannot read is still worth sending; just not a change reference
            log.warning("replay frame not decodable", attempt_id=self._attempt_id, label=label, error=str(e)[:200])
            screen = None
        return await self._emit(label, png, event, screen)

    async def send_if_changed(self, png: bytes, label: str = "change") -> bool:
        """Send the screen only if it differs visibly from the last frame sent."""
        try:
            screen = await asyncio.to_thread(_decode, png)
        except Exception:
            return False
        if not changed(self._last, screen):
            return False
        return await self._emit(label, png, None, screen)

    async def _emit(self, label: str, png: bytes, event: dict[str, Any] | None, screen: _Screen | None) -> bool:
        async with self._lock:
            masked = self.masked.is_set()
            if masked:
                try:
                    png = await asyncio.to_thread(mask_png, png)
                except Exception as e:  # a frame that cannot be masked is not sent at all
                    log.warning("replay frame dropped: it could not be masked", attempt_id=self._attempt_id,
                                label=label, error=f"{type(e).__name__}: {str(e)[:200]}")
                    return False
                if not self._mask_said:
                    event = {**(event or {}), "masked": True}
            try:
                async with asyncio.timeout(self._send_timeout):
                    await self._sink.frame(label, png, event)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("replay frame not sent", attempt_id=self._attempt_id, label=label,
                            error=f"{type(e).__name__}: {str(e)[:200]}")
                return False
            if screen is not None:
                self._last = screen
            self._mask_said = self._mask_said or masked
            self.sent += 1
            return True

    def stop_watching(self) -> None:
        self._watching = False

    async def watch(self, shoot: Callable[[], Awaitable[bytes]], interval: float = 1.0) -> None:
        """Until cancelled: look at the screen every `interval` seconds and send it when it changed.
        At most one frame per interval, so a busy screen cannot flood the link. `stop_watching()` ends it
        too, at the next look: a cancel alone can be lost on Python 3.11 when it lands as a call completes."""
        self._watching = True
        while self._watching:
            started = time.monotonic()
            try:
                png = await shoot()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.debug("replay watch screenshot failed", attempt_id=self._attempt_id, error=str(e)[:200])
            else:
                await self.send_if_changed(png)
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
