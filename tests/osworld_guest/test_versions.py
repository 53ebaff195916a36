"""The guest's document readers are the versions pypi.txt pins (OSWorld's own, where Debian 12's read
documents differently), they win over Debian's, and they work on Debian's python3.11 and numpy 1.24.

The host has the guest's Python as kit.py runs it: Debian's python3 with scripts/setup.sh's install of
image-builder/imagebuilder/assets/osworld-desktop/pypi.txt in kit.GUEST_SITE.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .kit import GUEST_SITE, REPO, make

PINS = REPO / "image-builder" / "imagebuilder" / "assets" / "osworld-desktop" / "pypi.txt"
# The module each pinned distribution is imported as.
MODULES = {"python-docx": "docx", "typing_extensions": "typing_extensions", "openpyxl": "openpyxl",
           "PyMuPDF": "pymupdf", "rapidfuzz": "rapidfuzz", "python-pptx": "pptx", "scikit-image": "skimage",
           "lazy_loader": "lazy_loader"}


def pins() -> dict[str, str]:
    found = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) --hash=sha256:[0-9a-f]{64}$", PINS.read_text(), re.MULTILINE)
    return dict(found)


def test_every_pin_is_the_version_the_guest_imports(tmp_path: Path) -> None:
    pinned = pins()
    assert set(pinned) == set(MODULES)  # a pin without a module here, or the other way, is a test to write
    make("import importlib, importlib.metadata\n"
         "out = {d: [importlib.metadata.version(d), importlib.import_module(m).__file__] for d, m in modules.items()}\n"
         "import numpy\n"
         "out['numpy'] = [numpy.__version__, numpy.__file__]\n"
         "open(path, 'w').write(json.dumps(out))\n", tmp_path, modules=MODULES, path=str(tmp_path / "v.json"))
    seen = json.loads((tmp_path / "v.json").read_text())
    for dist, version in pinned.items():
        assert seen[dist][0] == version, dist
        assert seen[dist][1].startswith(GUEST_SITE + "/"), (dist, seen[dist][1])  # not Debian's
    assert seen["numpy"][0].startswith("1.24.") and seen["numpy"][1].startswith("/usr/lib/python3/")


# A paragraph "See " with a hyperlink "our site" (w:hyperlink around the run, as Writer and Word save a link).
_HYPERLINK_DOCX = """
import docx
from docx.oxml import OxmlElement
from docx.oxml.ns import qn
d = docx.Document()
p = d.add_paragraph("See ")
rel = d.part.relate_to("https://example.org/", docx.opc.constants.RELATIONSHIP_TYPE.HYPERLINK, is_external=True)
link = OxmlElement("w:hyperlink")
link.set(qn("r:id"), rel)
run = OxmlElement("w:r")
text = OxmlElement("w:t")
text.text = "our site"
run.append(text)
link.append(run)
p._p.append(link)
d.save(path)
"""


def test_a_hyperlinks_text_is_in_its_paragraph_as_osworlds_python_docx_reads_it(tmp_path: Path) -> None:
    """Debian's python-docx 0.8.11 reads "See "; OSWorld's (1.2.0) "See our site": the docx metrics compare
    paragraphs' text."""
    doc = tmp_path / "link.docx"
    make(_HYPERLINK_DOCX, tmp_path, path=str(doc))
    make("import docx\nopen(out, 'w').write(json.dumps([p.text for p in docx.Document(path).paragraphs]))",
         tmp_path, path=str(doc), out=str(tmp_path / "text.json"))
    assert json.loads((tmp_path / "text.json").read_text()) == ["See our site"]


def test_pdf_text_and_fuzzy_ratio_read_as_osworld_reads_them(tmp_path: Path) -> None:
    """compare_pdfs' readers: PyMuPDF's text of a page, rapidfuzz's ratio of two texts."""
    make("import pymupdf\n"
         "from rapidfuzz import fuzz\n"
         "doc = pymupdf.open()\n"
         "doc.new_page().insert_text((72, 72), 'Invoice 1234')\n"
         "text = pymupdf.open('pdf', doc.tobytes())[0].get_text()\n"
         "open(out, 'w').write(json.dumps([text, fuzz.ratio('Invoice 1234', 'Invoice 1235')]))\n",
         tmp_path, out=str(tmp_path / "pdf.json"))
    text, ratio = json.loads((tmp_path / "pdf.json").read_text())
    assert (text, round(ratio, 4)) == ("Invoice 1234\n", 91.6667)
