"""Images (PIL and numpy, Debian's python3-pil and python3-numpy): OSWorld's image comparisons and GIMP's
checks.

Structural similarity (SSIM) is written here: Wang et al.'s index over 7x7 uniform windows (K1 0.01, K2
0.03, the data range of the pixels' type, sample covariances), averaged over every window that lies wholly
inside the image; an image with channels is the mean of its channels' indexes. Two images whose arrays
differ in shape are not similar (OSWorld's comparison stops with an error there, which scores nothing).

OSWorld's metrics here take (result, expected): the image the agent made and the one it is held against
(the original in the guest, or a gold image the check brought).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from PIL import Image, ImageChops, ImageStat, UnidentifiedImageError

from gh_osworld.outcome import Fail
from gh_osworld.reading import is_ours
from gh_osworld.registry import metric

WINDOW = 7


def open_image(path: str) -> Image.Image:
    """The image at `path`, loaded: one the agent left that cannot be read fails the check; one the check
    brought that cannot be read is our error."""
    try:
        image = Image.open(path)
        image.load()
        return image
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as e:
        if is_ours(path):
            raise
        raise Fail(f"{path} cannot be read as an image: {e}") from None


def _window_means(a: np.ndarray) -> np.ndarray:
    """The mean of every WINDOW x WINDOW box lying wholly inside the 2-D array (summed-area table)."""
    s = np.pad(a, ((1, 0), (1, 0))).cumsum(0).cumsum(1)
    w = WINDOW
    return (s[w:, w:] - s[:-w, w:] - s[w:, :-w] + s[:-w, :-w]) / (w * w)


def _data_range(dtype: np.dtype[Any]) -> float:
    if dtype == np.bool_:
        return 1.0
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return float(info.max) - float(info.min)
    return 2.0  # floats are taken to span [-1, 1]


def _ssim_2d(x: np.ndarray, y: np.ndarray, data_range: float) -> float:
    x, y = x.astype(np.float64), y.astype(np.float64)
    n = WINDOW * WINDOW
    cov = n / (n - 1)
    ux, uy = _window_means(x), _window_means(y)
    vx = cov * (_window_means(x * x) - ux * ux)
    vy = cov * (_window_means(y * y) - uy * uy)
    vxy = cov * (_window_means(x * y) - ux * uy)
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    index = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux * ux + uy * uy + c1) * (vx + vy + c2))
    return float(index.mean())


def ssim(a: np.ndarray, b: np.ndarray) -> float | None:
    """The structural similarity of two pixel arrays (2-D, or with channels last); None when they cannot be
    compared (shapes differ, or smaller than a window)."""
    if a.shape != b.shape or a.ndim not in (2, 3) or min(a.shape[:2]) < WINDOW:
        return None
    data_range = _data_range(a.dtype)
    if a.ndim == 2:
        return _ssim_2d(a, b, data_range)
    return float(np.mean([_ssim_2d(a[..., c], b[..., c], data_range) for c in range(a.shape[2])]))


def similar(a: Image.Image, b: Image.Image, threshold: float = 0.9) -> bool:
    """OSWorld's structure check: both images in RGB (a grey, palette or alpha image converted first), the
    same size, each side at least a window, and an SSIM of at least the threshold."""
    if min(a.size + b.size) < WINDOW or a.size != b.size:
        return False
    score = ssim(np.asarray(a.convert("RGB")), np.asarray(b.convert("RGB")))
    return score is not None and score >= threshold


@metric("compare_images")
def compare_images(result: str | None, expected: str | None, **options: Any) -> float:
    """The SSIM of the two images in grey, both scaled (Lanczos) to the size of the narrower one. With
    `reference_base_result` B (the untouched file's score), the gain over it: (SSIM - B) / (1 - B) when
    SSIM is at least B + 0.01, else 0."""
    if not result or not expected:
        return 0.0
    a, b = open_image(result).convert("L"), open_image(expected).convert("L")
    size = min(a.size, b.size)  # OSWorld takes the smaller (width, height) pair, width first
    a, b = a.resize(size, Image.Resampling.LANCZOS), b.resize(size, Image.Resampling.LANCZOS)
    score = ssim(np.asarray(a), np.asarray(b))
    if score is None:
        return 0.0
    base = options.get("reference_base_result")
    if base is None:
        return score
    return (score - base) / (1 - base) if score >= base + 0.01 else 0.0


@metric("compare_image_list")
def compare_image_list(result: str | list[str | None] | None, expected: str | list[str] | None) -> float:
    """Each image is pixel for pixel its gold image (same mode and size, no pixel differs)."""
    mine = result if isinstance(result, list) else [result]
    gold = expected if isinstance(expected, list) else [expected]
    for r, e in zip(mine, gold, strict=False):
        if not r or not e:
            return 0.0
        a, b = open_image(r), open_image(e)
        if a.mode != b.mode or a.size != b.size or ImageChops.difference(a, b).getbbox() is not None:
            return 0.0
    return 1.0


@metric("check_structure_sim")
def check_structure_sim(result: str | None, expected: str | None) -> float:
    """The two images' SSIM is at least 0.9."""
    if result is None or expected is None:
        return 0.0
    return float(similar(open_image(result), open_image(expected)))


@metric("check_structure_sim_resized")
def check_structure_sim_resized(result: str | None, expected: str | None) -> float:
    """The result scaled to the original's size has an SSIM of at least 0.9 with it."""
    if result is None or expected is None:
        return 0.0
    gold = open_image(expected)
    return float(similar(open_image(result).resize(gold.size), gold))


def _brightness(image: Image.Image) -> float:
    return float(ImageStat.Stat(image.convert("L")).mean[0])


def _normalised(image: Image.Image, target: float) -> Image.Image:
    factor = target / _brightness(image)
    return image.point(lambda v: min(255, max(0, int(v * factor))))


@metric("check_brightness_decrease_and_structure_sim")
def check_brightness_decrease_and_structure_sim(result: str | None, expected: str | None) -> float:
    """The result is darker than the original, and with both brought to the same mean brightness their
    pixels differ by a mean squared error (on 0..1) under 0.03."""
    if result is None or expected is None:
        return 0.0
    mine, gold = open_image(result), open_image(expected)
    if not _brightness(mine) < _brightness(gold) or _brightness(mine) == 0:
        return 0.0
    a = np.asarray(_normalised(mine, 128), dtype=np.float32) / 255
    b = np.asarray(_normalised(gold, 128), dtype=np.float32) / 255
    return float(a.shape == b.shape and float(np.mean((a - b) ** 2)) < 0.03)


def _hsv(image: Image.Image) -> Image.Image:
    return (image if image.mode == "RGB" else image.convert("RGB")).convert("HSV")


@metric("check_saturation_increase_and_structure_sim")
def check_saturation_increase_and_structure_sim(result: str | None, expected: str | None) -> float:
    """The result's mean saturation is above the original's, and its hue and value channels each have an
    SSIM of at least 0.9 with the original's."""
    if result is None or expected is None:
        return 0.0
    mine, gold = _hsv(open_image(result)), _hsv(open_image(expected))
    h1, s1, v1 = mine.split()
    h2, s2, v2 = gold.split()
    if not float(np.mean(np.asarray(s1))) > float(np.mean(np.asarray(s2))):
        return 0.0
    return float(similar(h1, h2) and similar(v1, v2))


@metric("check_contrast_increase_and_structure_sim")
def check_contrast_increase_and_structure_sim(result: str | None, expected: str | None) -> float:
    """The result's contrast (the standard deviation of its pixel values) is above the original's, and the
    two have an SSIM of at least 0.65."""
    if result is None or expected is None:
        return 0.0
    mine, gold = open_image(result), open_image(expected)
    higher = float(np.std(np.asarray(mine, dtype=np.float32))) > float(np.std(np.asarray(gold, dtype=np.float32)))
    return float(higher and similar(mine, gold, 0.65))


@metric("check_file_exists_and_structure_sim")
def check_file_exists_and_structure_sim(result: str | None, expected: str | None) -> float:
    """The exported file is there and has an SSIM of at least 0.9 with the original."""
    if result is None or expected is None or not os.path.isfile(result):
        return 0.0
    return float(similar(open_image(result), open_image(expected)))


@metric("check_palette_and_structure_sim")
def check_palette_and_structure_sim(result: str | None, expected: str | None) -> float:
    """The result is a palette (indexed) image and, in RGB, has an SSIM of at least 0.9 with the original."""
    if result is None or expected is None:
        return 0.0
    mine = open_image(result)
    return float(mine.mode == "P" and similar(mine.convert("RGB"), open_image(expected)))


@metric("check_image_mirror")
def check_image_mirror(result: str | None, expected: str | None) -> float:
    """The result flipped left to right has an SSIM of at least 0.99 with the original."""
    if result is None or expected is None:
        return 0.0
    flipped = open_image(result).transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return float(similar(flipped, open_image(expected), 0.99))


@metric("check_green_background")
def check_green_background(result: str | None, expected: str | None) -> float:
    """Wherever the original is not black (its background), the result's pixel is green: its green above
    its red and its blue."""
    if result is None or expected is None:
        return 0.0
    mine = np.asarray(open_image(result).convert("RGB"), dtype=np.int32)
    gold = np.asarray(open_image(expected).convert("RGB"), dtype=np.int32)
    if mine.shape != gold.shape:
        return 0.0
    background = np.any(gold != 0, axis=2)
    r, g, b = mine[..., 0], mine[..., 1], mine[..., 2]
    return float(bool(np.all(((g > r) & (g > b))[background])))


@metric("check_triangle_position")
def check_triangle_position(result: str | None, expected: Any = None) -> float:
    """The colour OSWorld takes for the triangle has its centroid within 5% of the image's size from the
    image's centre, on both axes. OSWorld takes the second least common colour (its pixel values with
    every channel, alpha too): on a picture of only a triangle and its background, that is the
    background, whose centroid is the centre whatever the triangle does; its number is what counts here."""
    if result is None:
        return 0.0
    image = open_image(result)
    pixels = np.asarray(image if image.mode in ("RGB", "RGBA") else image.convert("RGB"))
    colours, counts = np.unique(pixels.reshape(-1, pixels.shape[2]), axis=0, return_counts=True)
    if len(colours) < 2:
        return 0.0
    triangle = colours[np.argsort(counts)][1]
    coords = np.argwhere(np.all(pixels == triangle, axis=2))
    centre = np.array(pixels.shape[:2]) / 2
    return float(bool(np.all(np.abs(coords.mean(axis=0) - centre) < 0.05 * np.array(pixels.shape[:2]))))


@metric("check_image_size")
def check_image_size(result: str | None, rules: dict[str, Any]) -> float:
    """The image is rules["width"] wide and rules["height"] high (each only when given)."""
    if result is None:
        return 0.0
    width, height = open_image(result).size
    return float(rules.get("width") in (None, width) and rules.get("height") in (None, height))


@metric("check_image_file_size")
def check_image_file_size(result: str | None, rules: dict[str, Any]) -> float:
    """The file is smaller than rules["max_size"] bytes."""
    if result is None:
        return 0.0
    try:
        return float(os.path.getsize(result) < rules["max_size"])
    except OSError:
        return 0.0
