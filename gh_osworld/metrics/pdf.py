"""PDF documents, by their text (poppler's pdftotext, Debian's poppler-utils in the guest).

OSWorld scores the similarity of two PDFs' texts (the pages' text joined, trimmed), read with PyMuPDF;
osworld_text reads them so when the guest has PyMuPDF, with pdftotext otherwise.
"""

from __future__ import annotations

import subprocess
import tempfile
from typing import Any

from gh_osworld.metrics.similarity import ratio
from gh_osworld.outcome import Fail
from gh_osworld.reading import is_ours
from gh_osworld.registry import metric

PDF_TEXT_TIMEOUT_S = 120
MAX_TEXT_BYTES = 64 << 20


class NoPdfText(RuntimeError):
    """pdftotext is not in the machine: the image's error, never the agent's."""


def pdf_text(path: str, *, ours: bool | None = None, raw: bool = False) -> str:
    """The PDF's text, trimmed. A file the agent left that is no PDF fails the check; ours that is none,
    or a missing pdftotext, is our error."""
    try:
        done = subprocess.run(["pdftotext", "-q", "-enc", "UTF-8", *(["-raw"] if raw else []), path, "-"],
                              capture_output=True, timeout=PDF_TEXT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise NoPdfText("pdftotext is missing (poppler-utils): the image lacks it") from None
    if done.returncode != 0:
        if is_ours(path) if ours is None else ours:
            raise RuntimeError(f"the check's PDF {path} cannot be read (pdftotext exit {done.returncode})")
        raise Fail(f"{path} cannot be read as a PDF (pdftotext exit {done.returncode})")
    return done.stdout[:MAX_TEXT_BYTES].decode("utf-8", "replace").strip()


def pdf_bytes_text(data: bytes, *, ours: bool) -> str:
    """The text of a PDF held in memory (an archive's member), ours or the agent's."""
    with tempfile.NamedTemporaryFile(suffix=".pdf") as f:
        f.write(data)
        f.flush()
        return pdf_text(f.name, ours=ours)


def osworld_text(path: str) -> str:
    """A PDF's text as OSWorld reads it: every page's text (PyMuPDF's plain text) joined, trimmed. With
    PyMuPDF absent (an image without its PyPI pin), poppler's, which agrees on simple one-column pages
    but for runs of spaces (bench/osworld_fidelity.py measures it). Raises for a file that is no PDF."""
    try:
        import pymupdf
    except ImportError:
        # in content order (-raw), as PyMuPDF reads; a page ends with a form feed there, with its last line
        # in PyMuPDF; runs of spaces stay folded to one (poppler's doing): the image's PyMuPDF is the fix
        return pdf_text(path, raw=True).replace("\f", "")
    with pymupdf.open(path) as doc:
        return "".join(page.get_text() for page in doc).strip()


@metric("compare_pdfs")
def compare_pdfs(result: Any, expected: Any) -> float:
    """Each PDF against its gold PDF (a path, or lists of paths paired in order): the texts' similarity
    (rapidfuzz's ratio, similarity.py), summed and divided by the number of gold PDFs. A pair whose PDF
    cannot be read scores 0, as in OSWorld."""
    mine = result if isinstance(expected, list) else [result]
    gold = expected if isinstance(expected, list) else [expected]
    if not isinstance(mine, list) or not gold:
        return 0.0
    total = 0.0
    for r, e in zip(mine, gold, strict=False):
        if not r or not e:
            continue
        try:
            mine_text = osworld_text(r)
        except NoPdfText:  # the image's fault, not the agent's
            raise
        except Exception:  # whatever the agent's file does to the reader: that pair scores nothing
            continue
        total += ratio(mine_text, osworld_text(e)) / 100.0
    return total / len(gold)
