"""PDF documents, by their text (poppler's pdftotext, Debian's poppler-utils in the guest).

OSWorld scores the similarity of two PDFs' texts (the pages' text joined, trimmed); its full score is the
same text, which is what passes here.
"""

from __future__ import annotations

import subprocess
import tempfile
from typing import Any

from gh_osworld.outcome import Fail
from gh_osworld.reading import is_ours
from gh_osworld.registry import metric

PDF_TEXT_TIMEOUT_S = 120
MAX_TEXT_BYTES = 64 << 20


class NoPdfText(RuntimeError):
    """pdftotext is not in the machine: the image's error, never the agent's."""


def pdf_text(path: str, *, ours: bool | None = None) -> str:
    """The PDF's text, trimmed. A file the agent left that is no PDF fails the check; ours that is none,
    or a missing pdftotext, is our error."""
    try:
        done = subprocess.run(["pdftotext", "-q", "-enc", "UTF-8", path, "-"], capture_output=True,
                              timeout=PDF_TEXT_TIMEOUT_S, stdin=subprocess.DEVNULL)
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


@metric("compare_pdfs")
def compare_pdfs(result: Any, expected: Any) -> float:
    """Each PDF has the same text as its gold PDF (a path, or lists of paths compared pairwise); the score
    is the share of pairs that do."""
    mine = result if isinstance(expected, list) else [result]
    gold = expected if isinstance(expected, list) else [expected]
    if not isinstance(mine, list) or not gold:
        return 0.0
    same = 0
    for r, e in zip(mine, gold, strict=False):
        if not r or not e:
            continue
        try:
            same += pdf_text(r) == pdf_text(e)
        except Fail:
            continue
    return same / len(gold)
