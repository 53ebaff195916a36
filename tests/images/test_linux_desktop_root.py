"""The linux-desktop builder's cached root follows the image's own files: a file the assets drop is
removed from a root built earlier (an older build's VGA watcher once stayed in every image built
on a cached root after its sources were gone)."""

from __future__ import annotations

from pathlib import Path

import pytest
from imagebuilder import linux_desktop


def _assets(tmp: Path, files: dict[str, str]) -> Path:
    assets = tmp / "assets"
    for rel, text in files.items():
        (assets / "rootfs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (assets / "rootfs" / rel).write_text(text)
    return assets


def test_a_file_dropped_from_the_assets_leaves_the_cached_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "packaged.conf").write_text("from a package\n")
    sudoers = {"etc/sudoers.d/gh-user": "user ALL=(ALL) NOPASSWD: ALL\n"}
    monkeypatch.setattr(linux_desktop, "ASSETS", _assets(tmp_path / "v1", {
        **sudoers, "usr/local/sbin/old-helper": "#!/bin/sh\n", "etc/kept.conf": "v1\n"}))
    linux_desktop.apply_files(root, "1280x800")
    assert (root / "usr/local/sbin/old-helper").is_file()

    monkeypatch.setattr(linux_desktop, "ASSETS", _assets(tmp_path / "v2", {**sudoers, "etc/kept.conf": "v2\n"}))
    linux_desktop.apply_files(root, "1024x768")

    assert not (root / "usr/local/sbin/old-helper").exists()
    assert (root / "etc/kept.conf").read_text() == "v2\n"
    assert (root / "etc/packaged.conf").read_text() == "from a package\n"  # never the assets': kept
    assert (root / "etc/gh-display").read_text() == "1024x768\n"
    assert (root / "etc/sudoers.d/gh-user").stat().st_mode & 0o777 == 0o440
