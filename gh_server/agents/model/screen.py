"""What the model sees: the guest's screenshot scaled to the agent's `screen` and encoded, and the scale
that maps the model's coordinates back to the guest's real pixels.

Pure functions over bytes (run in a thread: decoding and resizing a 1280x800 PNG takes tens of ms).
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass

from PIL import Image

from gh_common.png import encode as encode_png  # unfiltered, zlib level 1: gh_common/png.py says why


@dataclass(frozen=True)
class Scale:
    """Model pixels <-> guest pixels (each axis on its own: `screen` need not keep the aspect ratio)."""

    model: tuple[int, int]
    guest: tuple[int, int]

    def to_guest(self, x: int, y: int) -> tuple[int, int]:
        gx = round(x * self.guest[0] / self.model[0]) if self.model[0] else 0
        gy = round(y * self.guest[1] / self.model[1]) if self.model[1] else 0
        return min(max(gx, 0), self.guest[0] - 1), min(max(gy, 0), self.guest[1] - 1)

    def from_grid(self, x: int, y: int, grid: int = 1000) -> tuple[int, int]:
        """A point on a 0..grid grid (UI-TARS) to model pixels."""
        return round(x * self.model[0] / grid), round(y * self.model[1] / grid)


@dataclass(frozen=True)
class Shot:
    """One screenshot as the model gets it."""

    png: bytes  # the scaled image
    scale: Scale
    tree: str | None = None  # the accessibility tree, linearized (observation a11y_tree / screenshot_a11y_tree)

    @property
    def b64(self) -> str:
        return base64.b64encode(self.png).decode()

    @property
    def data_url(self) -> str:
        return "data:image/png;base64," + self.b64


def prepare(png: bytes, target: tuple[int, int] | None) -> Shot:
    """The guest's PNG scaled to `target` (None: as it is)."""
    with Image.open(io.BytesIO(png)) as im:
        guest = im.size
        if target is None or tuple(target) == guest:
            return Shot(png, Scale(guest, guest))
        scaled = im.convert("RGB").resize(target, Image.Resampling.BILINEAR)
    return Shot(encode_png(scaled), Scale(tuple(target), guest))  # type: ignore[arg-type]


def zoom(png: bytes, region: tuple[int, int, int, int], scale: Scale) -> Shot:
    """The part of the guest's screen under `region` (model pixels), scaled up to the model's screen size.

    Raises:
        ValueError: an empty or inverted region.
    """
    x0, y0 = scale.to_guest(region[0], region[1])
    # The far corner is an exclusive bound: [0, 0, 100, 50] is 100x50 model pixels.
    x1 = min(round(region[2] * scale.guest[0] / scale.model[0]), scale.guest[0])
    y1 = min(round(region[3] * scale.guest[1] / scale.model[1]), scale.guest[1])
    if x1 <= x0 or y1 <= y0:
        raise ValueError("zoom region must be x0 < x1 and y0 < y1 on the screen")
    with Image.open(io.BytesIO(png)) as im:
        part = im.convert("RGB").crop((x0, y0, x1, y1))
    ratio = min(scale.model[0] / part.width, scale.model[1] / part.height)
    size = (max(1, round(part.width * ratio)), max(1, round(part.height * ratio)))
    return Shot(encode_png(part.resize(size, Image.Resampling.LANCZOS)), scale)
