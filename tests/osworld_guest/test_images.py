"""gh_osworld/metrics/images.py on the guest's Python, against images made with the guest's PIL: the
right edit passes, each kind of wrong edit fails, a missing or unreadable image fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from .kit import check, crash, embedded, make, metric, rule, verdict, vm_file

# A picture with structure (gradients, shapes), and edits of it, made by the guest's PIL.
PICTURES = """
from PIL import Image, ImageDraw, ImageEnhance, ImageOps
base = Image.new("RGB", (96, 64))
px = base.load()
for x in range(96):
    for y in range(64):
        px[x, y] = (40 + x * 2, 30 + y * 3, 60 + x + y)
d = ImageDraw.Draw(base)
d.ellipse((10, 10, 40, 40), fill=(220, 200, 30))
d.rectangle((55, 20, 85, 55), fill=(20, 90, 160))
base.save("orig.png")
base.save("same.png")
ImageEnhance.Brightness(base).enhance(0.6).save("darker.png")
ImageEnhance.Brightness(base).enhance(1.3).save("brighter.png")
h, sat, v = base.convert("HSV").split()
Image.merge("HSV", (h, sat.point(lambda s: min(255, int(s * 1.4))), v)).convert("RGB").save("colourful.png")
ImageEnhance.Color(base).enhance(0.3).save("greyer.png")
ImageEnhance.Contrast(base).enhance(1.5).save("contrast.png")
ImageEnhance.Contrast(base).enhance(0.5).save("flat.png")
ImageOps.mirror(base).save("mirror.png")
ImageOps.flip(base).save("flipped.png")
base.resize((48, 32)).save("small.png")
base.convert("P", palette=Image.Palette.ADAPTIVE, colors=256).save("palette.png")
other = Image.new("RGB", (96, 64), (255, 255, 255))
ImageDraw.Draw(other).line((0, 0, 95, 63), fill=(0, 0, 0), width=5)
other.save("other.png")
b2 = base.copy(); b2.putpixel((0, 0), (0, 0, 0)); b2.save("onepixel.png")
base.save("export.jpg", quality=95, subsampling=0)
open("broken.png", "wb").write(b"not a png at all")
"""


@pytest.fixture
def pics(tmp_path: Path) -> Path:
    make(PICTURES, tmp_path)
    return tmp_path


def judge(tmp: Path, func: str, result: str | None, expected: str | None, *, gold: bool = False) -> bool:
    r = vm_file(tmp / result) if result else None
    e = None if expected is None else (embedded(tmp / expected) if gold else vm_file(tmp / expected))
    return verdict(check(metric(func, r, e)), tmp)


CASES = [
    # (metric, the right result, wrong results), each against orig.png
    ("compare_images", "same.png", ["other.png", "darker.png", "mirror.png"]),
    ("check_structure_sim", "same.png", ["other.png", "mirror.png", "small.png"]),
    ("check_structure_sim_resized", "small.png", ["other.png", "flipped.png"]),
    ("check_brightness_decrease_and_structure_sim", "darker.png", ["brighter.png", "same.png", "other.png"]),
    ("check_saturation_increase_and_structure_sim", "colourful.png", ["greyer.png", "same.png", "mirror.png"]),
    ("check_contrast_increase_and_structure_sim", "contrast.png", ["flat.png", "same.png", "other.png"]),
    ("check_file_exists_and_structure_sim", "export.jpg", ["other.png", "flipped.png"]),
    ("check_palette_and_structure_sim", "palette.png", ["same.png", "other.png"]),
    ("check_image_mirror", "mirror.png", ["same.png", "flipped.png"]),
    ("compare_image_list", "same.png", ["onepixel.png", "other.png", "export.jpg"]),
]


@pytest.mark.parametrize(("func", "right", "wrongs"), CASES, ids=[c[0] for c in CASES])
def test_right_passes_wrong_fails_missing_fails(func: str, right: str, wrongs: list[str], pics: Path) -> None:
    assert judge(pics, func, right, "orig.png") is True
    for wrong in wrongs:
        assert judge(pics, func, wrong, "orig.png") is False, wrong
    assert judge(pics, func, "gone.png", "orig.png") is False
    assert judge(pics, func, "broken.png", "orig.png") is False


def test_gold_unreadable_is_no_verdict(pics: Path) -> None:
    err = crash(check(metric("compare_images", vm_file(pics / "same.png"), embedded(pics / "broken.png"))), pics)
    assert "the check crashed" in err
    # the same unreadable file left by the agent in the guest is the agent's failure
    assert judge(pics, "compare_images", "same.png", "broken.png") is False


def test_compare_image_list_of_several(pics: Path) -> None:
    many = {"type": "vm_file", "multi": True, "path": [str(pics / "same.png"), str(pics / "mirror.png")],
            "gives": [0, 1]}
    gold = {"type": "embedded_file", "multi": True, "paths": [str(pics / "orig.png"), str(pics / "mirror.png")],
            "gives": [0, 1]}
    assert verdict(check(metric("compare_image_list", many, gold)), pics) is True
    many["path"] = [str(pics / "same.png"), str(pics / "flipped.png")]
    assert verdict(check(metric("compare_image_list", many, gold)), pics) is False


def test_green_background(tmp_path: Path) -> None:
    make("""
from PIL import Image, ImageDraw
def scene(bg, name):
    im = Image.new("RGB", (80, 50), bg)
    ImageDraw.Draw(im).rectangle((30, 10, 50, 40), fill=(0, 0, 0))
    im.save(name)
scene((255, 255, 255), "white.png")
scene((30, 200, 40), "green.png")
scene((200, 30, 40), "red.png")
im = Image.new("RGB", (80, 50), (30, 200, 40)); im.putpixel((79, 0), (255, 255, 255)); im.save("almost.png")
""", tmp_path)
    assert judge(tmp_path, "check_green_background", "green.png", "white.png") is True
    assert judge(tmp_path, "check_green_background", "red.png", "white.png") is False
    assert judge(tmp_path, "check_green_background", "almost.png", "white.png") is False
    assert judge(tmp_path, "check_green_background", "gone.png", "white.png") is False


def test_triangle_position(tmp_path: Path) -> None:
    """OSWorld takes the second least common colour for the triangle: with a rarer mark in the picture
    that is the triangle; on a picture of the triangle alone it is the background, centred whatever the
    triangle does (OSWorld's number, kept)."""
    make("""
from PIL import Image, ImageDraw
for name, dx, mark in (("middle.png", 0, True), ("corner.png", -70, True), ("alone.png", -70, False)):
    im = Image.new("RGB", (200, 160), (255, 255, 255))
    d = ImageDraw.Draw(im)
    if mark:
        d.rectangle([0, 0, 4, 4], fill=(20, 20, 20))
    d.polygon([(100 + dx, 60), (80 + dx, 100), (120 + dx, 100)], fill=(250, 220, 0))
    im.save(name)
""", tmp_path)
    assert judge(tmp_path, "check_triangle_position", "middle.png", None) is True
    assert judge(tmp_path, "check_triangle_position", "corner.png", None) is False
    assert judge(tmp_path, "check_triangle_position", "alone.png", None) is True
    assert judge(tmp_path, "check_triangle_position", "gone.png", None) is False


def test_image_size_and_file_size(pics: Path) -> None:
    r = vm_file(pics / "small.png")
    assert verdict(check(metric("check_image_size", r, rule(height=32))), pics) is True
    assert verdict(check(metric("check_image_size", r, rule(height=32, width=48))), pics) is True
    assert verdict(check(metric("check_image_size", r, rule(height=32, width=50))), pics) is False
    assert verdict(check(metric("check_image_size", vm_file(pics / "broken.png"), rule(height=32))), pics) is False
    size = (pics / "orig.png").stat().st_size
    assert verdict(check(metric("check_image_file_size", vm_file(pics / "orig.png"), rule(max_size=size + 1))), pics)
    assert not verdict(check(metric("check_image_file_size", vm_file(pics / "orig.png"), rule(max_size=size))), pics)
    assert not verdict(check(metric("check_image_file_size", vm_file(pics / "gone.png"), rule(max_size=9))), pics)


SSIM_REFERENCE = """
import numpy as np
from gh_osworld.metrics.images import ssim
rng = np.random.default_rng(7)
a = rng.integers(0, 256, (40, 50), dtype=np.uint8)
noise = rng.integers(-20, 21, (40, 50))
b = np.clip(a.astype(int) + noise, 0, 255).astype(np.uint8)
open(out, "w").write(json.dumps([ssim(a, a), ssim(a, b), ssim(a, 255 - a), ssim(a, a[:, :49])]))
"""


def test_ssim_values(tmp_path: Path) -> None:
    """SSIM is 1 for the same image, high under mild noise, negative for the inverse, None across shapes."""
    import json

    out = tmp_path / "ssim.json"
    make(SSIM_REFERENCE, tmp_path, out=str(out))
    same, noisy, inverse, shapes = json.loads(out.read_text())
    assert same == 1.0
    assert 0.5 < noisy < 1.0
    assert inverse < 0
    assert shapes is None
