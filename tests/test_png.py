"""gh_common/png.py: the screenshot PNG writer any reader opens, pixel for pixel."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from gh_common.png import encode


def _desktop_like(size: tuple[int, int]) -> Image.Image:
    # Flat areas (a backdrop, a panel) and some detail (text-like noise), as a screen has.
    im = Image.new("RGB", size, (58, 110, 165))
    im.paste((240, 240, 240), (0, 0, size[0], 24))
    for i in range(0, size[0], 7):
        im.putpixel((i, 12), (i % 256, (i * 3) % 256, (i * 7) % 256))
    return im


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "P"])
def test_a_screen_comes_back_pixel_for_pixel(mode: str) -> None:
    src = _desktop_like((321, 203)).convert(mode)
    back = Image.open(io.BytesIO(encode(src)))
    back.load()
    assert back.format == "PNG" and back.mode == "RGB" and back.size == (321, 203)
    assert back.tobytes() == src.convert("RGB").tobytes()


def test_a_flat_screen_is_small() -> None:
    # 1280x800 raw is 3 MB; a flat desktop must not cost the model's request (or the replay) that much.
    assert len(encode(_desktop_like((1280, 800)))) < 60_000
