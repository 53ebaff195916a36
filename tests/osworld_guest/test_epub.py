"""compare_epub on the guest's Python against books written here as EPUB archives."""

from __future__ import annotations

import zipfile
from pathlib import Path

from .kit import check, embedded, metric, verdict, vm_file


def book(path: Path, *, uid: str, chapters: dict[str, str], wrap: bool = False) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("mimetype", "application/epub+zip")
        z.writestr("content.opf", f'<package>\n<dc:identifier id="uid">{uid}</dc:identifier>\n'
                                  f'<dc:title>Pass Through</dc:title>\n</package>\n')
        z.writestr("toc.ncx", f'<ncx>\n<navPoint id="{uid}">\n<text>Chapters</text>\n</ncx>\n')
        for name, text in chapters.items():
            body = f"<html><body><h1>{name}</h1>{chr(10) if wrap else ''}<p>{text}</p></body></html>"
            z.writestr(name, body)
    return path


def test_compare_epub(tmp_path: Path) -> None:
    chapters = {"ch1.html": "It began.", "ch2.html": "It ended."}
    gold = embedded(book(tmp_path / "gold.epub", uid="gold-1", chapters=chapters))
    # saved again: another identifier, other line breaks in the pages
    same = book(tmp_path / "same.epub", uid="mine-2", chapters=chapters, wrap=True)
    assert verdict(check(metric("compare_epub", vm_file(same), gold)), tmp_path)
    edited = book(tmp_path / "edited.epub", uid="gold-1", chapters={**chapters, "ch2.html": "It went on."})
    assert not verdict(check(metric("compare_epub", vm_file(edited), gold)), tmp_path)
    fewer = book(tmp_path / "fewer.epub", uid="gold-1", chapters={"ch1.html": "It began."})
    assert not verdict(check(metric("compare_epub", vm_file(fewer), gold)), tmp_path)
    (tmp_path / "broken.epub").write_text("not a zip")
    assert not verdict(check(metric("compare_epub", vm_file(tmp_path / "broken.epub"), gold)), tmp_path)
    assert not verdict(check(metric("compare_epub", vm_file(tmp_path / "none.epub"), gold)), tmp_path)
