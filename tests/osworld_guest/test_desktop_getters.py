"""The desktop getters (gh_osworld/getters/desktop.py, chrome.py's default_video_player) read what the X
and desktop tools print. This host has no display: the tools are stand-ins on PATH printing what
x11-utils, gsettings, xfconf-query and xdg-mime print in a session (their real output's format); the
guest's desktop tests read the real ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from .kit import check, make, metric, rule, verdict


def tool(bin_dir: Path, name: str, script: str) -> None:
    p = bin_dir / name
    p.write_text("#!/bin/sh\n" + script)
    p.chmod(0o755)


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    monkeypatch.setenv("PATH", f"{d}:/usr/bin:/bin")
    return d


def x_session(bin_dir: Path, *, vlc: tuple[int, int] | None) -> None:
    tool(bin_dir, "xdpyinfo", 'echo "screen #0:"; echo "  dimensions:    1920x1080 pixels (508x285 millimeters)"\n')
    tool(bin_dir, "xprop", """
case "$*" in
  "-root _NET_CLIENT_LIST") echo "_NET_CLIENT_LIST(WINDOW): window id # 0x1200003, 0x1400007" ;;
  "-id 0x1200003 WM_CLASS") echo 'WM_CLASS(STRING) = "xfce4-panel", "Xfce4-panel"' ;;
  "-id 0x1400007 WM_CLASS") echo 'WM_CLASS(STRING) = "%s", "%s"' ;;
  *) exit 1 ;;
esac
""" % (("vlc", "vlc") if vlc else ("mousepad", "Mousepad")))
    w, h = vlc or (640, 480)
    tool(bin_dir, "xwininfo", f'echo "  Absolute upper-left X:  0"; echo "  Width: {w}"; echo "  Height: {h}"\n')


def fullscreen(tmp: Path) -> bool:
    return verdict(check(metric("is_vlc_fullscreen", {"type": "vm_window_size", "app_class_name": "vlc"},
                                {"type": "vm_screen_size"})), tmp)


def test_vlc_fullscreen_from_the_window_and_screen_sizes(bin_dir: Path, tmp_path: Path) -> None:
    x_session(bin_dir, vlc=(1920, 1080))
    assert fullscreen(tmp_path)
    x_session(bin_dir, vlc=(800, 600))
    assert not fullscreen(tmp_path)
    x_session(bin_dir, vlc=None)  # no VLC window
    assert not fullscreen(tmp_path)
    tool(bin_dir, "xdpyinfo", "exit 1\n")  # no display
    assert not fullscreen(tmp_path)


def test_wallpaper(bin_dir: Path, tmp_path: Path) -> None:
    image = tmp_path / "wall.png"
    gold = tmp_path / "gold.png"
    make("from PIL import Image, ImageDraw\nim = Image.new('RGB', (64, 48), (10, 80, 200))\n"
         "ImageDraw.Draw(im).ellipse((5, 5, 40, 40), fill=(250, 250, 0))\nfor p in paths: im.save(p)",
         tmp_path, paths=[str(image), str(gold)])
    spec = check(metric("compare_images", {"type": "vm_wallpaper", "dest": "background.png"},
                        {"type": "embedded_file", "path": str(gold)}))
    tool(bin_dir, "gsettings", f"echo \"'file://{image}'\"\n")
    assert verdict(spec, tmp_path)
    # GNOME's key unset: XFCE's desktop property
    tool(bin_dir, "gsettings", "echo \"''\"\n")
    tool(bin_dir, "xfconf-query", f"""
case "$*" in
  "-c xfce4-desktop -l") echo /backdrop/screen0/monitorVirtual-1/workspace0/last-image ;;
  *) echo "{image}" ;;
esac
""")
    assert verdict(spec, tmp_path)
    tool(bin_dir, "xfconf-query", "exit 1\n")
    assert not verdict(spec, tmp_path)


def test_default_video_player(bin_dir: Path, tmp_path: Path) -> None:
    want = rule(include=["vlc.desktop"])
    tool(bin_dir, "xdg-mime", 'case "$4" in video/webm) echo totem.desktop ;; *) echo vlc.desktop ;; esac\n')
    assert verdict(check(metric("check_include_exclude", {"type": "default_video_player"}, want)), tmp_path)
    tool(bin_dir, "xdg-mime", "echo org.gnome.Totem.desktop\n")
    assert not verdict(check(metric("check_include_exclude", {"type": "default_video_player"}, want)), tmp_path)
