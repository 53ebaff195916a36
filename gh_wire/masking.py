"""Screenshot masking, applied by whichever side holds a screen once a secret has been typed: the
runner to its replay frames, the server to the screens it hands an agent or keeps.

A frame is an image, so text cannot be taken out of it: the screen becomes a mosaic of blocks wider
than a character cell (layout and colour stay, text does not), with a note saying why.
"""

from __future__ import annotations

import io

from PIL import Image, ImageDraw

MASK_NOTE = "masked: a secret was typed"


def mask_block(width: int) -> int:
    """The mosaic's block size in pixels: wider than a character cell at any resolution."""
    return max(16, width // 48)


def mask_png(png: bytes) -> bytes:
    """The screen as a mosaic of blocks wider than a character cell, with a note saying why."""
    with Image.open(io.BytesIO(png)) as im:
        rgb = im.convert("RGB")
    w, h = rgb.size
    block = mask_block(w)
    cols, rows = -(-w // block), -(-h // block)
    small = rgb.resize((cols, rows), Image.Resampling.BOX)
    out = small.resize((cols * block, rows * block), Image.Resampling.NEAREST).crop((0, 0, w, h))
    draw = ImageDraw.Draw(out)
    # Within the first row of blocks (the rectangle includes its end coordinates).
    draw.rectangle((0, 0, min(w, 6 * len(MASK_NOTE) + 12) - 1, min(h, 16) - 1), fill=(0, 0, 0))
    draw.text((6, 2), MASK_NOTE, fill=(255, 255, 255))
    buf = io.BytesIO()
    out.save(buf, "PNG", compress_level=1)
    return buf.getvalue()
