"""Text documents (LibreOffice Writer's saves: .docx read with python-docx, .odt's content.xml with lxml) and
Writer's settings file: the agent's document compared with the expected one, or checked for a property.

The result is the first argument, the expected document the second, as OSWorld's metrics take them. A
document's kind is read from its content, not its name: the importer stores the expected file under a
name of its own. Whose fault: the agent's document missing or unreadable is a failure; the expected one
unreadable is a crash.
"""

from __future__ import annotations

import io
import math
import re
import zipfile
from typing import Any

from docx import Document
from docx.enum.text import WD_ALIGN_PARAGRAPH, WD_TAB_ALIGNMENT
from lxml import etree
from PIL import Image

from gh_osworld.metrics.similarity import ratio
from gh_osworld.outcome import Fail
from gh_osworld.registry import metric

_W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
_TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
_STYLE = "urn:oasis:names:tc:opendocument:xmlns:style:1.0"
_OFFICE = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
_FO = "urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0"


def _kind(path: str) -> str:
    """"docx" or "odt" by what the file holds (a zip with word/document.xml, or with ODF's content.xml)."""
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
    if "word/document.xml" in names:
        return "docx"
    if "content.xml" in names:
        return "odt"
    raise ValueError(f"{path} is neither a .docx nor an .odt document")


def _agents(path: Any, kind: str | None = None) -> str:
    """The agent's document's path, its kind checked (the expected one's, when given)."""
    if not path:
        raise Fail("there is no result document")
    try:
        have = _kind(path)
    except (OSError, zipfile.BadZipFile, ValueError) as e:
        raise Fail(f"the result document is unreadable: {e}") from None
    if kind is not None and have != kind:
        raise Fail(f"the result is a {have} document, the expected one a {kind}")
    return str(path)


def agents_docx(path: Any) -> Any:
    p = _agents(path, "docx")
    try:
        return Document(p)
    except Exception as e:  # whatever python-docx cannot read in what the agent left
        raise Fail(f"the result document is unreadable: {type(e).__name__}: {e}"[:500]) from None


def _odt_paragraphs(path: str) -> list[str]:
    """Each text:p's own text and that of its direct text:span children (as OSWorld reads an .odt: text in
    deeper elements, links, tabs and spacers is not counted)."""
    with zipfile.ZipFile(path) as z:
        root = etree.fromstring(z.read("content.xml"))
    out = []
    for p in root.iter(f"{{{_TEXT}}}p"):
        parts = [p.text or ""]
        for child in p:
            if child.tag == f"{{{_TEXT}}}span":
                parts.append(child.text or "")
                parts.extend(grand.tail or "" for grand in child)
            parts.append(child.tail or "")
        out.append("".join(parts))
    return out


def _paragraphs(path: str, kind: str) -> list[str]:
    if kind == "docx":
        return [p.text for p in Document(path).paragraphs]
    return _odt_paragraphs(path)


def _agents_paragraphs(path: str, kind: str) -> list[str]:
    try:
        return _paragraphs(path, kind)
    except Exception as e:  # the agent's document's XML is broken
        raise Fail(f"the result document is unreadable: {type(e).__name__}: {e}"[:500]) from None


def _blank_folded(paragraphs: list[str]) -> str:
    return re.sub(r"\s+", " ", "\n".join(paragraphs)).strip()


@metric("compare_docx_files")
def compare_docx_files(result: Any, expected: str, ignore_blanks: bool = True, ignore_case: bool = False,
                       ignore_order: bool = False, content_only: bool = False, fuzzy_match: bool = False,
                       delete_empty_lines: bool = False, **_: Any) -> float:
    """The paragraphs' text. ignore_order: as sorted lists; delete_empty_lines: blank paragraphs dropped;
    content_only: the score is the texts' similarity (whitespace runs folded); ignore_blanks (default):
    the folded texts equal, or with fuzzy_match their similarity; otherwise paragraph by paragraph (as
    many of them), equal, or with fuzzy_match the mean of their similarities; ignore_case: lowered."""
    kind = _kind(expected)
    mine = _agents_paragraphs(_agents(result, kind), kind)
    want = _paragraphs(expected, kind)
    if ignore_order:
        mine, want = sorted(mine), sorted(want)
    if delete_empty_lines:
        mine, want = [p for p in mine if p.strip()], [p for p in want if p.strip()]
    if content_only or ignore_blanks:
        a, b = _blank_folded(mine), _blank_folded(want)
        if ignore_case:
            a, b = a.lower(), b.lower()
        return ratio(a, b) / 100.0 if content_only or fuzzy_match else float(a == b)
    if len(mine) != len(want):
        return 0.0
    if ignore_case:
        mine, want = [p.lower() for p in mine], [p.lower() for p in want]
    if fuzzy_match:
        return sum(ratio(a, b) / 100.0 for a, b in zip(mine, want, strict=True)) / len(mine) if mine else 1.0
    return float(mine == want)


@metric("compare_docx_files_and_ignore_new_lines")
def compare_docx_files_and_ignore_new_lines(result: Any, expected: str, ignore_blanks: bool = True,
                                            **_: Any) -> bool:
    """As compare_docx_files, empty paragraphs dropped first (so added or removed blank lines do not count)."""
    mine = [t for t in _agents_paragraphs(_agents(result, "docx"), "docx") if t != ""]
    want = [t for t in _paragraphs(expected, "docx") if t != ""]
    if ignore_blanks:
        return _blank_folded(mine) == _blank_folded(want)
    return mine == want


@metric("compare_docx_lines")
def compare_docx_lines(result: Any, expected: str, **_: Any) -> bool:
    """The same set of non-empty lines (paragraphs stripped), in any order."""
    mine = {t.strip() for t in _agents_paragraphs(_agents(result, "docx"), "docx") if t.strip()}
    return mine == {t.strip() for t in _paragraphs(expected, "docx") if t.strip()}


@metric("compare_docx_tables")
def compare_docx_tables(result: Any, expected: str, **_: Any) -> bool:
    """As many tables, each with the same rows and columns and the same cell texts (stripped)."""
    mine, want = agents_docx(result).tables, Document(expected).tables
    if len(mine) != len(want):
        return False
    for t1, t2 in zip(mine, want, strict=False):
        if len(t1.rows) != len(t2.rows) or len(t1.columns) != len(t2.columns):
            return False
        for i in range(len(t1.rows)):
            for j in range(len(t1.columns)):
                if t1.cell(i, j).text.strip() != t2.cell(i, j).text.strip():
                    return False
    return True


def _images(doc: Any) -> list[bytes]:
    return [Image.open(io.BytesIO(rel.target_part.blob)).tobytes()
            for rel in doc.part.rels.values() if "image" in rel.reltype]


@metric("compare_docx_images")
def compare_docx_images(result: Any, expected: str, **_: Any) -> bool:
    """The same images (their pixels), in the same order."""
    doc = agents_docx(result)
    try:
        mine = _images(doc)
    except Exception as e:  # an image the agent put in that PIL cannot open
        raise Fail(f"an image in the result is unreadable: {e}") from None
    return mine == _images(Document(expected))


@metric("compare_contains_image")
def compare_contains_image(result: Any, expected: str, **_: Any) -> bool:
    """Runs paired in order: where one document's run holds a drawing, so does the other's."""
    mine, want = agents_docx(result), Document(expected)
    for p1, p2 in zip(mine.paragraphs, want.paragraphs, strict=False):
        for r1, r2 in zip(p1.runs, p2.runs, strict=False):
            if ("graphicData" in r1._element.xml) != ("graphicData" in r2._element.xml):
                return False
    return True


@metric("compare_line_spacing")
def compare_line_spacing(result: Any, expected: str, **_: Any) -> bool:
    """The same text (compare_docx_files' defaults) and every paragraph's line spacing the same."""
    if not compare_docx_files(result, expected):
        return False
    mine, want = agents_docx(result).paragraphs, Document(expected).paragraphs
    if len(mine) != len(want):
        return False
    return all(a.paragraph_format.line_spacing == b.paragraph_format.line_spacing
               for a, b in zip(mine, want, strict=True))


@metric("compare_font_names")
def compare_font_names(result: Any, rules: dict[str, Any], **_: Any) -> bool:
    """Every run of the body's paragraphs is in rules.font_name."""
    want = rules["font_name"]
    return all(run.font.name == want for p in agents_docx(result).paragraphs for run in p.runs)


@metric("compare_subscript_contains")
def compare_subscript_contains(result: Any, expected: str, **_: Any) -> bool:
    """Runs paired in order: some pair is subscript in both."""
    mine, want = agents_docx(result), Document(expected)
    return any(r1.font.subscript and r2.font.subscript
               for p1, p2 in zip(mine.paragraphs, want.paragraphs, strict=False)
               for r1, r2 in zip(p1.runs, p2.runs, strict=False))


@metric("contains_page_break")
def contains_page_break(result: Any, *_: Any, **__: Any) -> bool:
    """A run of the body holds a page break."""
    for p in agents_docx(result).paragraphs:
        for run in p.runs:
            for br in run.element.iter(f"{{{_W}}}br"):
                if br.get(f"{{{_W}}}type") == "page":
                    return True
    return False


@metric("has_page_numbers_in_footers")
def has_page_numbers_in_footers(result: Any, *_: Any, **__: Any) -> bool:
    """Every section's footer's first paragraph holds a digit."""
    for section in agents_docx(result).sections:
        footer = section.footer
        text = footer.paragraphs[0].text if footer is not None and footer.paragraphs else ""
        if not any(c.isdigit() for c in text):
            return False
    return True


@metric("is_first_line_centered")
def is_first_line_centered(result: Any, *_: Any, **__: Any) -> bool:
    paragraphs = agents_docx(result).paragraphs
    return bool(paragraphs) and paragraphs[0].paragraph_format.alignment == WD_ALIGN_PARAGRAPH.CENTER


@metric("check_tabstops")
def check_tabstops(result: Any, expected: str, word_number_split_by_tabstop: int | None = None, index: int = 0,
                   **_: Any) -> float:
    """Non-empty paragraphs paired: the same tab stops (clear stops and a left stop at 0 ignored) with the same
    alignments; the score is 1 less the mean distance between paired stops as a share of the text width.
    word_number_split_by_tabstop N: each result paragraph's `index`-th tab-separated part has N words."""
    mine = [p for p in agents_docx(result).paragraphs if p.text.strip()]
    gold = Document(expected)
    want = [p for p in gold.paragraphs if p.text.strip()]
    if len(mine) != len(want) or not mine:
        return 0.0
    if word_number_split_by_tabstop is not None:
        for p in mine:
            parts = p.text.split("\t")
            if index >= len(parts) or len([w for w in re.split(r"\s", parts[index]) if w.strip()]) \
                    != word_number_split_by_tabstop:
                return 0.0
    section = gold.sections[0]
    width = section.page_width - section.left_margin - section.right_margin

    def stops(p: Any) -> list[Any]:
        return [t for t in p.paragraph_format.tab_stops
                if not (t.alignment == WD_TAB_ALIGNMENT.CLEAR or (t.alignment == WD_TAB_ALIGNMENT.LEFT
                                                                  and t.position == 0))]
    off = 0.0
    for p1, p2 in zip(mine, want, strict=False):
        s1, s2 = stops(p1), stops(p2)
        if len(s1) != len(s2) or any(a.alignment != b.alignment for a, b in zip(s1, s2, strict=False)):
            return 0.0
        off += sum(abs(a.position - b.position) for a, b in zip(s1, s2, strict=False)) / width
    return 1.0 - off / len(mine)


@metric("check_italic_font_size_14")
def check_italic_font_size_14(result: Any, expected: str, **_: Any) -> bool:
    """The same text, and every italic run is 14 pt."""
    if not compare_docx_files(result, expected):
        return False
    return all(run.font.size is not None and run.font.size.pt == 14
               for p in agents_docx(result).paragraphs for run in p.runs if run.italic)


@metric("evaluate_strike_through_last_paragraph")
def evaluate_strike_through_last_paragraph(result: Any, expected: str, **_: Any) -> bool:
    """The same text, and every run of the last paragraph struck through."""
    if not compare_docx_files(result, expected):
        return False
    paragraphs = agents_docx(result).paragraphs
    return bool(paragraphs) and all(run.font.strike for run in paragraphs[-1].runs)


def _lab(rgb: tuple[int, int, int]) -> tuple[float, float, float]:
    """sRGB (0-255) to CIE L*a*b* under D65."""
    def linear(c: float) -> float:
        c /= 255.0
        return ((c + 0.055) / 1.055) ** 2.4 if c > 0.04045 else c / 12.92
    r, g, b = (linear(c) for c in rgb)
    x = (0.412453 * r + 0.357580 * g + 0.180423 * b) / 0.95047
    y = 0.212671 * r + 0.715160 * g + 0.072169 * b
    z = (0.019334 * r + 0.119193 * g + 0.950227 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116
    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def delta_e_2000(lab1: tuple[float, float, float], lab2: tuple[float, float, float]) -> float:
    """The CIEDE2000 colour difference (kL = kC = kH = 1)."""
    l1, a1, b1 = lab1
    l2, a2, b2 = lab2
    c_bar = (math.hypot(a1, b1) + math.hypot(a2, b2)) / 2
    g = 0.5 * (1 - math.sqrt(c_bar ** 7 / (c_bar ** 7 + 25 ** 7)))
    a1p, a2p = a1 * (1 + g), a2 * (1 + g)
    c1p, c2p = math.hypot(a1p, b1), math.hypot(a2p, b2)
    h1p = math.degrees(math.atan2(b1, a1p)) % 360
    h2p = math.degrees(math.atan2(b2, a2p)) % 360
    dl, dc = l2 - l1, c2p - c1p
    dh = 0.0
    if c1p * c2p != 0:
        dh = h2p - h1p
        dh = dh - 360 if dh > 180 else dh + 360 if dh < -180 else dh
    dH = 2 * math.sqrt(c1p * c2p) * math.sin(math.radians(dh / 2))
    l_bar, cp_bar = (l1 + l2) / 2, (c1p + c2p) / 2
    if c1p * c2p == 0:
        h_bar = h1p + h2p
    elif abs(h1p - h2p) <= 180:
        h_bar = (h1p + h2p) / 2
    else:
        h_bar = (h1p + h2p + 360) / 2 if h1p + h2p < 360 else (h1p + h2p - 360) / 2
    t = (1 - 0.17 * math.cos(math.radians(h_bar - 30)) + 0.24 * math.cos(math.radians(2 * h_bar))
         + 0.32 * math.cos(math.radians(3 * h_bar + 6)) - 0.20 * math.cos(math.radians(4 * h_bar - 63)))
    s_l = 1 + 0.015 * (l_bar - 50) ** 2 / math.sqrt(20 + (l_bar - 50) ** 2)
    s_c = 1 + 0.045 * cp_bar
    s_h = 1 + 0.015 * cp_bar * t
    r_t = (-2 * math.sqrt(cp_bar ** 7 / (cp_bar ** 7 + 25 ** 7))
           * math.sin(math.radians(60 * math.exp(-(((h_bar - 275) / 25) ** 2)))))
    return math.sqrt((dl / s_l) ** 2 + (dc / s_c) ** 2 + (dH / s_h) ** 2 + r_t * (dc / s_c) * (dH / s_h))


@metric("evaluate_colored_words_in_tables")
def evaluate_colored_words_in_tables(result: Any, expected: str, threshold: float = 3.5, **_: Any) -> bool:
    """The same text, and in the tables every run starting with a vowel is red, every other one blue (within
    a CIEDE2000 difference of `threshold`); a run with no colour of its own is neither."""
    if not compare_docx_files(result, expected):
        return False
    red, blue = _lab((255, 0, 0)), _lab((0, 0, 255))
    for table in agents_docx(result).tables:
        for row in table.rows:
            for cell in row.cells:
                for p in cell.paragraphs:
                    for run in p.runs:
                        if not run.text:
                            continue
                        rgb = run.font.color.rgb if run.font.color is not None else None
                        if rgb is None:
                            return False
                        want = red if run.text[0].lower() in "aeiou" else blue
                        if delta_e_2000(_lab((rgb[0], rgb[1], rgb[2])), want) > threshold:
                            return False
    return True


@metric("check_highlighted_words")
def check_highlighted_words(result: Any, expected: str, **_: Any) -> bool:
    """The same text (an .odt's), and no text span left highlighted yellow: a style whose background is
    exactly "#ffff00", as Writer writes it (desktop-env 1.0.2 compares the string: "#FFFF00" is no highlight)."""
    if not compare_docx_files(result, expected):
        return False
    path = _agents(result, "odt")
    try:
        with zipfile.ZipFile(path) as z:
            root = etree.fromstring(z.read("content.xml"))
    except Exception as e:  # read once already; a part broken in another way
        raise Fail(f"the result document is unreadable: {e}") from None
    yellow = set()
    for style in root.iter(f"{{{_STYLE}}}style"):
        if any(prop.get(f"{{{_FO}}}background-color") == "#ffff00" for prop in style):
            yellow.add(style.get(f"{{{_STYLE}}}name"))
    return not any(span.get(f"{{{_TEXT}}}style-name") in yellow for span in root.iter(f"{{{_TEXT}}}span"))


@metric("compare_references")
def compare_references(result: Any, expected: str, reference_indicator: str = "References",
                       reference_base_result: float = 0.5, **_: Any) -> float:
    """The paragraphs after the first one that is exactly `reference_indicator` (the references): as many
    non-empty ones in both, their mean similarity rescaled so that `reference_base_result` scores 0 and 1 scores 1.
    Neither document with the heading scores 1; only one, 0."""
    mine = _agents_paragraphs(_agents(result, "docx"), "docx")
    want = _paragraphs(expected, "docx")
    if reference_indicator not in mine and reference_indicator not in want:
        return 1.0
    if reference_indicator not in mine or reference_indicator not in want:
        return 0.0
    r1 = [p for p in mine[mine.index(reference_indicator) + 1:] if p.strip()]
    r2 = [p for p in want[want.index(reference_indicator) + 1:] if p.strip()]
    if len(r1) != len(r2):
        return 0.0
    if not r1:
        return 1.0
    mean = sum(ratio(a, b) / 100.0 for a, b in zip(r1, r2, strict=False)) / len(r1)
    return (mean - reference_base_result) / (1 - reference_base_result) if mean >= reference_base_result else 0.0


_OOR = "http://openoffice.org/2001/registry"


@metric("find_default_font")
def find_default_font(result: Any, rules: dict[str, Any], **_: Any) -> bool:
    """LibreOffice's user settings (registrymodifications.xcu) set Writer's default Standard font to
    rules.font_name."""
    if not result:
        raise Fail("there is no settings file")
    try:
        root = etree.parse(str(result)).getroot()
    except (OSError, etree.XMLSyntaxError) as e:
        raise Fail(f"the settings file is unreadable: {e}") from None
    found = None
    for item in root.iter("item"):
        if item.get(f"{{{_OOR}}}path") != "/org.openoffice.Office.Writer/DefaultFont":
            continue
        for prop in item.iter("prop"):
            if prop.get(f"{{{_OOR}}}name") == "Standard":
                for value in prop.iter("value"):
                    found = value.text
    return found == rules["font_name"]
