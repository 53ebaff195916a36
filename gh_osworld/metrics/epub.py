"""EPUB books (zip archives), compared by their parts as OSWorld compares them."""

from __future__ import annotations

import zipfile
from difflib import SequenceMatcher

import lxml.html

from gh_osworld.outcome import Fail
from gh_osworld.reading import is_ours
from gh_osworld.registry import metric


def book_parts(path: str) -> dict[str, list[str]]:
    """The book's parts as lines: toc.ncx without its navPoint lines, content.opf without its dc:identifier
    lines (both differ on every save), and every .html page with its line breaks taken out and laid out
    again (so only the markup and text count)."""
    parts: dict[str, list[str]] = {}
    with zipfile.ZipFile(path) as book:
        names = book.namelist()
        for name, drop in (("toc.ncx", "navPoint"), ("content.opf", "dc:identifier")):
            if name in names:
                parts[name] = [line for line in book.read(name).decode("utf-8").splitlines() if drop not in line]
        for name in names:
            if name.endswith(".html"):
                flat = book.read(name).decode("utf-8").replace("\r", "").replace("\n", "")
                page = lxml.html.fromstring(flat.encode("utf-8"))
                parts[name] = lxml.html.tostring(page, pretty_print=True, encoding="unicode").splitlines()
    return parts


@metric("compare_epub")
def compare_epub(result: str | None, expected: str) -> float:
    """The parts (book_parts) paired in the order of their names, each pair scored by the similarity of
    its lines (as diff_text_file), the sum divided by the number of the result's parts."""
    if result is None:
        return 0.0
    try:
        mine = book_parts(result)
    except (OSError, zipfile.BadZipFile, UnicodeDecodeError, ValueError, KeyError) as e:
        raise Fail(f"{result} cannot be read as an EPUB: {e}") from None
    try:
        gold = book_parts(expected)
    except Exception:
        if is_ours(expected):
            raise
        return 0.0
    if not mine:
        return 0.0
    pairs = zip(sorted(mine), sorted(gold), strict=False)
    return sum(SequenceMatcher(a=mine[m], b=gold[g]).ratio() for m, g in pairs) / len(mine)
