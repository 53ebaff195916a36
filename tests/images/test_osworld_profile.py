"""osworld-desktop is a profile of linux-desktop's builder (image-builder/imagebuilder/osworld_desktop.py):
its packages, sources and files are its own version's inputs and never linux-desktop's, and its file
store takes only files whose sha256 is their name."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from imagebuilder import linux_desktop, osworld_desktop
from imagebuilder.errors import BuildError

SIZE = "1280x800"


def _versions() -> tuple[dict[str, object], dict[str, object]]:
    ours = linux_desktop.version_inputs(linux_desktop.linux_desktop_profile(), SIZE)
    theirs = linux_desktop.version_inputs(osworld_desktop.profile(), SIZE)
    return ours, theirs


def test_osworld_desktop_adds_its_packages_and_linux_desktop_stays_lean() -> None:
    lean, full = (p.packages for p in (linux_desktop.linux_desktop_profile(), osworld_desktop.profile()))
    assert set(lean) <= set(full)
    added = set(full) - set(lean)
    assert {"libreoffice-calc", "chromium", "locales", "python3-openpyxl", "wmctrl"} <= added
    assert not added & set(linux_desktop.PACKAGES)
    assert {"libglib2.0-bin", "xdg-utils"} <= set(lean)
    # What OSWorld's setups `apt install` from the network (jq, expect, zsh, astyle, sysstat, xsel): a machine
    # here has none, so the image carries them and the setup's install finds them present.
    assert {"jq", "xsel", "expect", "astyle", "sysstat", "zsh"} <= added


def test_linux_desktops_version_does_not_read_osworld_desktops_inputs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lean_before, full_before = _versions()
    root_key = linux_desktop.root_cache_key(["a=1"], SIZE)

    # Every input osworld-desktop has and linux-desktop has not, changed: its assets (hook, wrapper,
    # PyPI pins), the gh_osworld sources, and the files of its store.
    assets = tmp_path / "assets"
    shutil.copytree(osworld_desktop.ASSETS, assets, symlinks=True)
    (assets / "customize.sh").write_text((assets / "customize.sh").read_text() + "# changed\n")
    package = tmp_path / "gh_osworld"
    shutil.copytree(osworld_desktop.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "evaluate.py").write_text((package / "evaluate.py").read_text() + "# changed\n")
    files = tmp_path / "files" / "sha256"
    files.mkdir(parents=True)
    (files / hashlib.sha256(b"x").hexdigest()).write_bytes(b"x")
    monkeypatch.setattr(osworld_desktop, "ASSETS", assets)
    monkeypatch.setattr(osworld_desktop, "PACKAGE", package)
    full_after = linux_desktop.version_inputs(osworld_desktop.profile(tmp_path / "files"), SIZE)
    lean_after = linux_desktop.version_inputs(linux_desktop.linux_desktop_profile(), SIZE)

    assert full_after["sources"] != full_before["sources"]
    assert full_after["files"] == [hashlib.sha256(b"x").hexdigest()] != full_before["files"]
    assert lean_after == lean_before
    assert "files" not in lean_after
    assert linux_desktop.root_cache_key(["a=1"], SIZE) == root_key


def test_the_hook_of_osworld_desktop_changes_its_cached_root_and_not_linux_desktops(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lean = linux_desktop.root_cache_key(["a=1"], SIZE)
    full = linux_desktop.root_cache_key(["a=1"], SIZE, osworld_desktop.profile())
    assets = tmp_path / "assets"
    shutil.copytree(osworld_desktop.ASSETS, assets, symlinks=True)
    (assets / "customize.sh").write_text((assets / "customize.sh").read_text() + "# changed\n")
    monkeypatch.setattr(osworld_desktop, "ASSETS", assets)
    assert linux_desktop.root_cache_key(["a=1"], SIZE, osworld_desktop.profile()) != full
    assert linux_desktop.root_cache_key(["a=1"], SIZE) == lean != full


def _store(tmp: Path, blobs: dict[str, bytes]) -> Path:
    d = tmp / "fetched"
    (d / "sha256").mkdir(parents=True)
    for name, data in blobs.items():
        (d / "sha256" / name).write_bytes(data)
    return d


def test_the_file_store_is_staged_into_the_root_checked_by_hash(tmp_path: Path) -> None:
    blobs = {hashlib.sha256(b).hexdigest(): b for b in (b"a spreadsheet", b"a video" * 1000)}
    root = tmp_path / "root"
    stale = root / osworld_desktop.FILE_STORE / "sha256" / ("0" * 64)
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"from the last build")

    osworld_desktop.stage_files(osworld_desktop.store_files(_store(tmp_path, blobs)), root)

    store = root / osworld_desktop.FILE_STORE / "sha256"
    assert sorted(p.name for p in store.iterdir()) == sorted(blobs)
    for name, data in blobs.items():
        assert (store / name).read_bytes() == data
        assert (store / name).stat().st_mode & 0o777 == 0o644


def test_no_files_dir_is_an_empty_store(tmp_path: Path) -> None:
    root = tmp_path / "root"
    osworld_desktop.stage_files(osworld_desktop.store_files(None), root)
    assert (root / osworld_desktop.FILE_STORE / "sha256").is_dir()
    assert not list((root / osworld_desktop.FILE_STORE / "sha256").iterdir())


def test_a_file_whose_hash_is_not_its_name_is_refused(tmp_path: Path) -> None:
    wrong = hashlib.sha256(b"what the task fetched").hexdigest()
    files = osworld_desktop.store_files(_store(tmp_path, {wrong: b"a truncated download"}))
    with pytest.raises(BuildError, match=f"{wrong}.*sha256 is {hashlib.sha256(b'a truncated download').hexdigest()}"
                       ".*damaged or partial download"):
        osworld_desktop.stage_files(files, tmp_path / "root")
    assert not (tmp_path / "root" / osworld_desktop.FILE_STORE / "sha256" / wrong).exists()


@pytest.mark.parametrize("name", ["notahash", "A" * 64])
def test_a_files_dir_that_is_not_the_importers_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(BuildError, match="not a file named by its sha256"):
        osworld_desktop.store_files(_store(tmp_path, {name: b"x"}))
    with pytest.raises(BuildError, match="no sha256/ in it"):
        osworld_desktop.store_files(tmp_path / "elsewhere")


def test_pyautogui_is_installed_into_the_root_at_its_pinned_versions(tmp_path: Path) -> None:
    """Agent kind osworld's pyautogui (assets/linux-desktop/pyautogui.txt, imagebuilder/pyautogui.py): its
    sources checked by hash, built and installed into the root's site dir, on linux-desktop and (again, after
    pypi.txt's) osworld-desktop. The sources come from PyPI once, into a cache kept in /var/tmp; a host that
    cannot reach PyPI and has no cache skips, saying so."""
    import re
    import urllib.request

    from imagebuilder import linux_desktop, pyautogui

    cache = Path("/var/tmp/gh-test-pyautogui-cache")
    if not (cache / "pyautogui-wheels").is_dir():
        try:
            urllib.request.urlopen("https://pypi.org/simple/pyautogui/", timeout=10).close()
        except OSError as e:
            pytest.skip(f"PyPI is out of reach and no cache is in {cache}: {type(e).__name__}")
    pyautogui.install(tmp_path, cache)
    site = tmp_path / pyautogui.SITE
    pinned = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) --hash", pyautogui.PINS.read_text(), re.M))
    installed = dict(p.name.removesuffix(".dist-info").lower().rsplit("-", 1) for p in site.glob("*.dist-info"))
    assert installed == {k.lower(): v for k, v in pinned.items()}
    assert (site / "pyautogui" / "_pyautogui_x11.py").is_file()
    for profile in (linux_desktop.linux_desktop_profile(), osworld_desktop.profile()):
        assert "python3-xlib" in profile.packages, profile.name  # what pyautogui drives X with on Linux
    assert linux_desktop.linux_desktop_profile().stage is pyautogui.install
