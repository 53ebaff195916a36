"""gh_common/png.py: the screenshot PNG writer any reader opens, pixel for pixel."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from gh_common import png as fastpng
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


def test_a_large_screen_deflated_in_two_halves_comes_back_pixel_for_pixel(monkeypatch: pytest.MonkeyPatch) -> None:
    # Above PARALLEL_FROM the rows are deflated in two halves at once and joined under one zlib header.
    halves: list[bool] = []
    deflate_part = fastpng._deflate_part

    def counted(data: memoryview, last: bool) -> bytes:
        halves.append(last)
        return deflate_part(data, last)
    monkeypatch.setattr(fastpng, "_deflate_part", counted)
    src = _desktop_like((1280, 800))
    for y in range(0, 800, 3):  # detail in both halves, and a row across the cut
        src.paste(((y * 5) % 256, 40, 200 - y % 200), (y % 900, y, y % 900 + 300, y + 1))
    back = Image.open(io.BytesIO(encode(src)))
    back.load()
    assert sorted(halves) == [False, True]
    assert back.size == (1280, 800) and back.tobytes() == src.tobytes()
