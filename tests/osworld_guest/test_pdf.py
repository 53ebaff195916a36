"""compare_pdfs and the PDF members of compare_archive and compare_zip_files, on the guest's Python with
poppler's pdftotext, against PDFs written here byte by byte (one page of Helvetica text)."""

from __future__ import annotations

import zipfile
from pathlib import Path

from .kit import check, crash, embedded, metric, verdict, vm_file


def pdf(*lines: str, note: str = "") -> bytes:
    """A one-page PDF showing the lines (`note`: a comment in its content, other bytes for the same text)."""
    text = " ".join(f"({line}) Tj 0 -16 Td" for line in lines)
    stream = f"%{note}\nBT /F1 12 Tf 20 170 Td {text} ET".encode()
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 200] /Contents 4 0 R "
               b"/Resources << /Font << /F1 5 0 R >> >> >>",
               b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def test_compare_pdfs(tmp_path: Path) -> None:
    (tmp_path / "gold.pdf").write_bytes(pdf("Invoice 243729", "Total 42.00"))
    (tmp_path / "same.pdf").write_bytes(pdf("Invoice 243729", "Total 42.00"))
    (tmp_path / "other.pdf").write_bytes(pdf("Invoice 243729", "Total 41.00"))
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4 nothing else")
    gold = embedded(tmp_path / "gold.pdf")
    for name, ok in (("same.pdf", True), ("other.pdf", False), ("broken.pdf", False), ("none.pdf", False)):
        assert verdict(check(metric("compare_pdfs", vm_file(tmp_path / name), gold)), tmp_path) is ok, name
    # our gold PDF unreadable: no verdict
    assert "the check crashed" in crash(check(metric("compare_pdfs", vm_file(tmp_path / "same.pdf"),
                                                     embedded(tmp_path / "broken.pdf"))), tmp_path)


def test_pdfs_in_archives(tmp_path: Path) -> None:
    def archive(name: str, members: dict[str, bytes]) -> Path:
        with zipfile.ZipFile(tmp_path / name, "w") as z:
            for member, data in members.items():
                z.writestr(member, data)
        return tmp_path / name

    gold = archive("gold.zip", {"slides/a.pdf": pdf("Lecture 1"), "slides/b.pdf": pdf("Lecture 2")})
    same = archive("same.zip", {"slides/a.pdf": pdf("Lecture 1"), "slides/b.pdf": pdf("Lecture 2", note="re-saved")})
    other = archive("other.zip", {"slides/a.pdf": pdf("Lecture 1"), "slides/b.pdf": pdf("Lecture 9 and more")})
    for func, options in (("compare_archive", {"file_path": "slides", "file_type": "pdf"}), ("compare_zip_files", {})):
        assert verdict(check(metric(func, vm_file(same), embedded(gold), **options)), tmp_path), func
        assert not verdict(check(metric(func, vm_file(other), embedded(gold), **options)), tmp_path), func
