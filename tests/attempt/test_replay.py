"""Replay capture: what counts as a screen change, and what of an input event may be shown."""

from __future__ import annotations

import io

from PIL import Image, ImageDraw

from gh_runner.replay import REDACTED, ReplayRecorder, _decode, changed, redact_event, redact_text
from gh_wire.input import ClickEvent, KeyEvent, TypeEvent
from gh_wire.masking import mask_png

from .fakes import is_mosaic


def screen(*boxes: tuple[int, int, int, int], fill: int = 255, size: tuple[int, int] = (720, 400)) -> bytes:
    im = Image.new("RGB", size, (0, 0, 0))
    d = ImageDraw.Draw(im)
    for b in boxes:
        d.rectangle(b, fill=(fill, fill, fill))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def test_change_detection() -> None:
    base = _decode(screen((0, 0, 100, 20)))
    assert changed(None, base)
    assert not changed(base, _decode(screen((0, 0, 100, 20))))  # same pixels
    assert not changed(base, _decode(screen((0, 0, 100, 20), (300, 300, 307, 301))))  # an 8x2 cursor blinks
    assert not changed(base, _decode(screen((0, 0, 100, 20), (300, 300, 301, 317))))  # a 2x18 caret
    assert not changed(base, _decode(screen((0, 0, 100, 20), fill=245)))  # a faint fade
    assert changed(base, _decode(screen((0, 0, 100, 20), (200, 200, 260, 216))))  # a word of output
    assert changed(base, _decode(screen((0, 0, 100, 20), size=(1024, 768))))  # resolution change


def test_redaction() -> None:
    secrets = ["s3cret", "", "s3cret-longer"]
    assert redact_event(TypeEvent(text="s3cret"), secrets) == {"type": "type", "text": REDACTED}
    assert redact_event(TypeEvent(text="user s3cret-longer!"), secrets)["text"] == REDACTED
    assert redact_event(TypeEvent(text="hello"), secrets) == {"type": "type", "text": "hello"}
    assert redact_event(TypeEvent(text="hello"), [""]) == {"type": "type", "text": "hello"}  # "" is no secret
    assert redact_event(KeyEvent(keys=["ENTER"]), secrets) == {"type": "key", "keys": ["ENTER"]}
    assert redact_event(ClickEvent(x=1, y=2), secrets) == {"type": "click", "x": 1, "y": 2, "button": "left"}
    redacted = redact_text("cannot type 's3cret-longer' here, s3cret", secrets)
    assert redacted == f"cannot type '{REDACTED}' here, {REDACTED}"


def _console(size: tuple[int, int] = (1024, 768)) -> bytes:
    im = Image.new("RGB", size, (0, 0, 0))
    draw = ImageDraw.Draw(im)
    for row in range(40):
        draw.text((8, 40 + row * 16), f"root@linux-tiny:~# echo blue-kite-{row:02d} > /etc/wifi", fill=(200, 200, 200))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def test_a_masked_frame_keeps_size_and_layout_but_no_text() -> None:
    for size in ((1024, 768), (720, 400), (1366, 768), (320, 200)):
        raw = _console(size)
        masked = mask_png(raw)
        assert not is_mosaic(raw) and is_mosaic(masked), size
        with Image.open(io.BytesIO(masked)) as im:
            assert im.size == size
            # Where the text was is still brighter than the empty screen below it: layout survives.
            if size[1] > 700:
                assert im.getpixel((40, 200))[0] > im.getpixel((40, 720))[0] == 0


class _Sink:
    def __init__(self) -> None:
        self.frames: list[tuple[str, bytes]] = []
        self.events: list[dict[str, object] | None] = []

    async def frame(self, label: str, png: bytes, event: dict[str, object] | None) -> None:
        self.frames.append((label, png))
        self.events.append(event)


async def test_every_frame_after_a_secret_is_masked() -> None:
    sink = _Sink()
    rec = ReplayRecorder(sink, attempt_id="at_1")
    raw = _console()
    assert await rec.send_frame("first", raw)
    rec.mask_from_now()
    assert await rec.send_frame("input", raw, {"type": "type", "text": REDACTED})
    assert await rec.send_frame("last", raw)
    assert [(label, is_mosaic(p)) for label, p in sink.frames] == [("first", False), ("input", True), ("last", True)]
    assert sink.frames[0][1] == raw


async def test_a_frame_that_cannot_be_masked_is_not_sent() -> None:
    sink = _Sink()
    rec = ReplayRecorder(sink, attempt_id="at_1")
    rec.mask_from_now()
    assert not await rec.send_frame("last", b"not a png")
    assert sink.frames == []


async def test_the_first_masked_frame_says_so_and_the_masked_event_is_set() -> None:
    """How the server tells that the replay masks (a watcher then sees frames, not the screen), and how the
    runner's live views know (gh_runner/live_views.py)."""
    sink = _Sink()
    rec = ReplayRecorder(sink, attempt_id="at_1")
    raw = _console()
    assert await rec.send_frame("first", raw, {"type": "screen"})
    assert not rec.masked.is_set()
    rec.mask_from_now()
    assert rec.masked.is_set()
    assert await rec.send_frame("input", raw, {"type": "type", "text": REDACTED})
    assert await rec.send_frame("change", raw)
    assert sink.events == [{"type": "screen"}, {"type": "type", "text": REDACTED, "masked": True}, None]
