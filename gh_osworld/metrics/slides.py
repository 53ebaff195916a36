"""Presentations (LibreOffice Impress's .pptx saves, read with python-pptx 0.6.23) and Impress's settings file.

compare_pptx_files compares the agent's presentation with the expected one slide by slide and shape by shape
(shapes paired in order; the longer list's extra shapes are not looked at, as in OSWorld). Its examine_*
options switch aspects on or off; the positional ones (examine_title_bottom_position, ...) are checks OSWorld
wrote for one task each, with that task's slide number, shape text and EMU limits, kept as they are so those
tasks are judged as OSWorld judges them.

Whose fault: the agent's file missing or unreadable is a failure; the expected one unreadable is a crash.
"""

from __future__ import annotations

import math
import zipfile
from typing import Any

from lxml import etree
from pptx import Presentation
from pptx.util import Inches

from gh_osworld.outcome import Fail
from gh_osworld.registry import metric

_A = "http://schemas.openxmlformats.org/drawingml/2006/main"
_P = "http://schemas.openxmlformats.org/presentationml/2006/main"
_OOR = "http://openoffice.org/2001/registry"

# MSO_SHAPE_TYPE's values, as the positional checks name them
_FREEFORM, _PICTURE, _TABLE = 5, 13, 19


def agents_pptx(path: Any) -> Any:
    if not path:
        raise Fail("there is no result presentation")
    try:
        return Presentation(str(path))
    except Exception as e:  # whatever python-pptx cannot read in what the agent left
        raise Fail(f"the result presentation is unreadable: {type(e).__name__}: {e}"[:500]) from None


def _shape_type(shape: Any) -> Any:
    try:
        return shape.shape_type
    except NotImplementedError:  # a shape python-pptx cannot classify: none of the types the checks ask for
        return None


def _geometry(shape: Any) -> tuple[Any, Any, Any, Any]:
    return shape.left, shape.top, shape.width, shape.height


def _has_text(shape: Any) -> bool:
    return hasattr(shape, "text")


def _notes(slide: Any) -> str:
    frame = slide.notes_slide.notes_text_frame if slide.has_notes_slide else None
    return frame.text.strip() if frame is not None else ""


def _bullets(slide: Any) -> list[tuple[Any, str, str, str]]:
    """Every paragraph of the slide: its level, bullet character, text and bullet colour."""
    out = []
    for p in slide._element.iter(f"{{{_A}}}p"):
        ppr = p.find(f"{{{_A}}}pPr")
        if ppr is None:
            lvl, char, color = "No Level", "No Bullet", "No Color"
        else:
            lvl = ppr.get("lvl")
            bu = ppr.find(f"{{{_A}}}buChar")
            char = bu.get("char") if bu is not None else "No Bullet"
            clr = ppr.find(f"{{{_A}}}buClr/{{{_A}}}srgbClr")
            color = clr.get("val") if clr is not None else "No Color"
        out.append((lvl, char, "".join(t.text or "" for t in p.iter(f"{{{_A}}}t")), color))
    return out


def _rgb(font: Any) -> Any:
    """The run's explicit RGB colour; a sentinel when it has none (a theme colour, or no colour)."""
    try:
        return font.color.rgb
    except AttributeError:
        return _NO_RGB


_NO_RGB = object()


class _Options:
    def __init__(self, o: dict[str, Any]) -> None:
        on = {"examine_number_of_slides", "examine_shape", "examine_text", "examine_indent", "examine_font_name",
              "examine_font_size", "examine_font_bold", "examine_font_italic", "examine_color_rgb",
              "examine_font_underline", "examine_strike_through", "examine_alignment", "examine_bullets",
              "examine_background_color", "examine_note"}
        off = {"examine_title_bottom_position", "examine_table_bottom_position", "examine_right_position",
               "examine_top_position", "examine_shape_for_shift_size", "examine_image_size", "examine_modify_height"}
        unknown = set(o) - on - off - {"examine_aligment"}
        if unknown:
            raise ValueError(f"compare_pptx_files: unknown options {sorted(unknown)}")
        # "examine_aligment" (so spelled in OSWorld's tasks) is not an option of OSWorld's metric: alignment
        # stays examined, as OSWorld examines it.
        self.flags = {k: bool(o.get(k, k in on)) for k in on | off}

    def __getattr__(self, name: str) -> bool:
        return self.flags[f"examine_{name}"]


def _shapes_differ(s1: Any, s2: Any, slide_no: int, x: _Options) -> str | None:
    """Why the paired shapes differ in place or size under the options, or None."""
    moved = _geometry(s1) != _geometry(s2)
    both_text = _has_text(s1) and _has_text(s2)
    t1, t2 = _shape_type(s1), _shape_type(s2)
    if x.title_bottom_position:
        if both_text and s1.text == s2.text:
            if s1.text == "Product Comparison" and (s1.top <= s2.top or s1.top < 3600000):
                return "the title is not moved to the bottom"
        elif moved:
            return "a shape moved"
    if x.table_bottom_position:
        if slide_no == 3 and t1 == _TABLE and t2 == _TABLE:
            if s1.top <= s2.top or s1.top < 3600000:
                return "the table is not moved to the bottom"
        elif moved:
            return "a shape moved"
    if x.right_position and slide_no == 2 and not _has_text(s1) and not _has_text(s2):
        if s1.left <= s2.left or s1.left < 4320000:
            return "the shape is not moved right"
    if x.top_position:
        if slide_no == 2 and t1 == _PICTURE and t2 == _PICTURE:
            if s1.top >= s2.top or s1.top > 1980000:
                return "the picture is not moved to the top"
        elif moved:
            return "a shape moved"
    if x.shape_for_shift_size and moved and not (
            both_text and s1.text == s2.text == "Elaborate on what you want to discuss."):
        return "a shape moved or was resized"
    if x.shape and moved:
        return "a shape moved or was resized"
    if x.image_size:
        if t1 == _PICTURE and t2 == _PICTURE:
            if (s1.width, s1.height) != (s2.width, s2.height):
                return "a picture's size differs"
        elif moved:
            return "a shape moved"
    if x.modify_height:
        if (not _has_text(s1) and not _has_text(s2)) or (t1 == _FREEFORM and t2 == _FREEFORM):
            if s1.height != s2.height:
                return "a shape's height differs"
        elif moved:
            return "a shape moved"
    return None


def _text_differs(s1: Any, s2: Any, x: _Options) -> str | None:
    if x.text and s1.text.strip() != s2.text.strip():
        return f"text {s1.text.strip()[:60]!r} is not {s2.text.strip()[:60]!r}"
    for p1, p2 in zip(s1.text_frame.paragraphs, s2.text_frame.paragraphs, strict=False):
        if x.alignment and p1.alignment != p2.alignment:
            return "a paragraph's alignment differs"
        if x.text and p1.text != p2.text:
            return "a paragraph's text differs"
        if x.indent and p1.level != p2.level:
            return "a paragraph's level differs"
        for r1, r2 in zip(p1.runs, p2.runs, strict=False):
            f1, f2 = r1.font, r2.font
            for aspect, a, b in (("font_name", f1.name, f2.name), ("font_size", f1.size, f2.size),
                                 ("font_bold", f1.bold, f2.bold), ("font_italic", f1.italic, f2.italic),
                                 ("font_underline", f1.underline, f2.underline),
                                 ("strike_through", f1._element.get("strike", "noStrike"),
                                  f2._element.get("strike", "noStrike"))):
                if getattr(x, aspect) and a != b:
                    return f"a run's {aspect} differs ({a!r}, expected {b!r})"
            c1, c2 = _rgb(f1), _rgb(f2)
            if x.color_rgb and c1 is not _NO_RGB and c2 is not _NO_RGB and c1 != c2:
                return "a run's colour differs"
    return None


@metric("compare_pptx_files")
def compare_pptx_files(result: Any, expected: str, **options: Any) -> bool:
    """Slide by slide: notes, and each pair of shapes' place and size, text, paragraphs (alignment, level)
    and runs (font, size, bold, italic, colour, underline, strike), and the slide's bullets; each aspect as the
    examine_* options say. The slides' background colours are never compared: OSWorld's comparison of them
    reads None for every slide (examine_background_color changes nothing there either)."""
    x = _Options(options)
    mine, want = agents_pptx(result), Presentation(expected)
    if x.number_of_slides and len(mine.slides) != len(want.slides):
        raise Fail(f"{len(mine.slides)} slides, expected {len(want.slides)}")
    for no, (sl1, sl2) in enumerate(zip(mine.slides, want.slides, strict=False), start=1):
        if x.note and _notes(sl1) != _notes(sl2):
            raise Fail(f"slide {no}: the notes differ")
        bullets_checked = False
        for s1, s2 in zip(sl1.shapes, sl2.shapes, strict=False):
            why = _shapes_differ(s1, s2, no, x)
            if why is None and _has_text(s1) and _has_text(s2):
                why = _text_differs(s1, s2, x)
                # The bullets are the whole slide's, compared once a pair of text shapes with runs is met.
                has_runs = any(p1.runs and p2.runs for p1, p2 in
                               zip(s1.text_frame.paragraphs, s2.text_frame.paragraphs, strict=False))
                if why is None and x.bullets and has_runs and not bullets_checked:
                    bullets_checked = True
                    if _bullets(sl1) != _bullets(sl2):
                        why = "the bullets differ"
            if why is not None:
                raise Fail(f"slide {no}: {why}")
    return True


@metric("check_image_stretch_and_center")
def check_image_stretch_and_center(result: Any, expected: str, **_: Any) -> bool:
    """The first slide's picture (the one the original's first slide has) fills the slide and is centred, each
    within half an inch."""
    mine, original = agents_pptx(result), Presentation(expected)
    if not mine.slides:
        raise Fail("the presentation has no slides")
    # The original is the case's document, not the agent's: one without a picture to look for is no verdict.
    wanted = next((s for s in original.slides[0].shapes if _shape_type(s) == _PICTURE), None) \
        if original.slides else None
    if wanted is None:
        raise ValueError("the original presentation (the case's) has no picture on its first slide")
    found = [s for s in mine.slides[0].shapes if _shape_type(s) == _PICTURE and s.image.blob == wanted.image.blob]
    if not found:
        raise Fail("the picture is not on the first slide")
    pic, w, h, tol = found[-1], original.slide_width, original.slide_height, Inches(0.5)
    return (abs(pic.width - w) <= tol and abs(pic.height - h) <= tol
            and abs(pic.left - (w - pic.width) / 2) <= tol and abs(pic.top - (h - pic.height) / 2) <= tol)


@metric("check_slide_orientation_Portrait")
def check_slide_orientation_portrait(result: Any, *_: Any, **__: Any) -> bool:
    prs = agents_pptx(result)
    return bool(prs.slide_width < prs.slide_height)


@metric("check_transition")
def check_transition(result: Any, rules: dict[str, Any], **_: Any) -> bool:
    """Slide rules.slide_idx (from 0) has a transition, and it is rules.transition_type (an element name
    of PresentationML's transitions: dissolve, fade, ...)."""
    prs = agents_pptx(result)
    idx = rules["slide_idx"]
    if not 0 <= idx < len(prs.slides):
        raise Fail(f"there is no slide {idx}")
    transition = next(prs.slides[idx]._element.iter(f"{{{_P}}}transition"), None)
    if transition is None:
        return False
    return next(transition.iter(f"{{{_P}}}{rules['transition_type']}"), None) is not None


def _osworld_channels(val: str) -> tuple[int, int, int]:
    """The three numbers desktop-env 1.0.2 reads from an srgbClr's val as red, green and blue: it expects a
    leading "#", which the XML has not, so it reads the hex digits from the second on in pairs (FF0000 is
    F0, 00, 0: 240, 0, 0; C00000 is 0, 0, 0). Kept: a page number Impress writes C00000 is not red to OSWorld,
    nor 0000FF blue, and an agent's score must equal OSWorld's on the same file."""
    return int(val[1:3], 16), int(val[3:5], 16), int(val[5:7], 16)


@metric("check_page_number_colors")
def check_page_number_colors(result: Any, rules: dict[str, Any], **_: Any) -> bool:
    """The colour the first slide master gives its slide numbers (its last solid RGB fill but one, where
    Impress writes the number placeholder's) is rules.color: red, blue or green when that channel exceeds
    the other two by more than 50, black when all three are below 50, the channels as OSWorld reads them
    (_osworld_channels: one place off)."""
    if not result:
        raise Fail("there is no result presentation")
    try:
        with zipfile.ZipFile(str(result)) as z:
            root = etree.fromstring(z.read("ppt/slideMasters/slideMaster1.xml"))
    except (OSError, KeyError, zipfile.BadZipFile, etree.XMLSyntaxError) as e:
        raise Fail(f"the result presentation is unreadable: {e}") from None
    colors = [c.get("val") for fill in root.iter(f"{{{_A}}}solidFill") for c in fill.iter(f"{{{_A}}}srgbClr")]
    if len(colors) < 2 or not colors[-2]:
        return False
    try:
        r, g, b = _osworld_channels(str(colors[-2]))
    except ValueError:
        return False
    color = rules["color"]
    test = {"red": r > g + 50 and r > b + 50, "blue": b > g + 50 and b > r + 50,
            "green": g > r + 50 and g > b + 50, "black": r < 50 and g < 50 and b < 50}
    return test.get(color, True)


@metric("evaluate_presentation_fill_to_rgb_distance")
def evaluate_presentation_fill_to_rgb_distance(result: Any, rules: dict[str, Any], **_: Any) -> float:
    """1 less the mean over slides of the distance from each slide's solid background colour (its master's
    where it has none of its own) to rules.rgb, scaled to 0..1; a slide with no solid colour, or still in
    rules.original_rgb (the colour the task started from), is at distance 1."""
    prs = agents_pptx(result)
    if not prs.slides:
        return 0.0
    want = rules["rgb"]
    original = rules.get("original_rgb")

    def distance(slide: Any) -> float:
        fill = slide.background.fill
        if fill.type == 5:  # MSO_FILL.BACKGROUND: the master's
            fill = slide.slide_layout.slide_master.background.fill
        if fill.type != 1:  # MSO_FILL.SOLID
            return 1.0
        try:
            rgb = fill.fore_color.rgb
        except AttributeError:  # a theme colour: no RGB of its own
            return 1.0
        if original is not None and tuple(rgb) == tuple(original):
            return 1.0
        return math.dist(tuple(rgb), tuple(want)) / math.dist((0, 0, 0), (255, 255, 255))
    return 1.0 - sum(distance(s) for s in prs.slides) / len(prs.slides)


def _settings(result: Any) -> Any:
    if not result:
        raise Fail("there is no settings file")
    try:
        return etree.parse(str(result)).getroot()
    except (OSError, etree.XMLSyntaxError) as e:
        raise Fail(f"the settings file is unreadable: {e}") from None


def _setting(root: Any, path: str, name: str) -> str | None:
    for item in root.iter("item"):
        if item.get(f"{{{_OOR}}}path") == path:
            for prop in item.iter("prop"):
                if prop.get(f"{{{_OOR}}}name") == name:
                    return prop.findtext("value")
    return None


@metric("check_presenter_console_disable")
def check_presenter_console_disable(result: Any, *_: Any, **__: Any) -> bool:
    """LibreOffice's user settings turn Impress's presenter console off."""
    value = _setting(_settings(result), "/org.openoffice.Office.Impress/Misc/Start", "EnablePresenterScreen")
    return value is not None and value.lower() == "false"


@metric("check_auto_saving_time")
def check_auto_saving_time(result: Any, rules: dict[str, Any], **_: Any) -> bool:
    """LibreOffice's user settings save recovery information every rules.minutes minutes."""
    value = _setting(_settings(result), "/org.openoffice.Office.Common/Save/Document", "AutoSaveTimeIntervall")
    try:
        return value is not None and int(value) == rules["minutes"]
    except ValueError:
        return False
