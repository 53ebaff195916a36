"""Replay capture: what counts as a screen change, and what of an input event may be shown."""

from __future__ import annotations

import io

from PIL import Image, ImageDraw

from gh_runner.replay import REDACTED, _decode, changed, redact_event, redact_text
from providers.base import ClickEvent, KeyEvent, TypeEvent


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
