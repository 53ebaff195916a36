"""The desktop's state: the screen's and a window's size (X11, read with x11-utils as the session's user),
the wallpaper, a directory's tree."""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any
from urllib.parse import unquote, urlparse

from gh_osworld.registry import getter

X_TIMEOUT_S = 10


def _x(args: list[str]) -> str | None:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=X_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


@getter("vm_screen_size")
def vm_screen_size(spec: dict[str, Any]) -> dict[str, int] | None:
    out = _x(["xdpyinfo"])
    m = re.search(r"dimensions:\s+(\d+)x(\d+) pixels", out or "")
    return {"width": int(m.group(1)), "height": int(m.group(2))} if m else None


def _client_windows() -> list[str]:
    out = _x(["xprop", "-root", "_NET_CLIENT_LIST"]) or ""
    return re.findall(r"0x[0-9a-fA-F]+", out.split("#", 1)[1] if "#" in out else "")


@getter("vm_window_size")
def vm_window_size(spec: dict[str, Any]) -> dict[str, int] | None:
    """The first managed window whose WM_CLASS (instance or class) is `app_class_name`, case aside: its
    width and height (the client area, without the frame), None when there is none."""
    want = str(spec["app_class_name"]).lower()
    for window in _client_windows():
        wm_class = _x(["xprop", "-id", window, "WM_CLASS"]) or ""
        names = [n.lower() for n in re.findall(r'"([^"]*)"', wm_class)]
        if want not in names:
            continue
        info = _x(["xwininfo", "-id", window]) or ""
        w, h = re.search(r"Width:\s+(\d+)", info), re.search(r"Height:\s+(\d+)", info)
        if w and h:
            return {"width": int(w.group(1)), "height": int(h.group(1))}
    return None


def _wallpaper_uri() -> str | None:
    """The wallpaper's file: GNOME's setting (OSWorld's desktop), else XFCE's first monitor's image."""
    out = _x(["gsettings", "get", "org.gnome.desktop.background", "picture-uri"])
    if out and out.strip().strip("'"):
        return out.strip().strip("'")
    listing = _x(["xfconf-query", "-c", "xfce4-desktop", "-l"]) or ""
    for prop in sorted(p for p in listing.split() if p.endswith("/last-image")):
        value = _x(["xfconf-query", "-c", "xfce4-desktop", "-p", prop])
        if value and value.strip():
            return value.strip()
    return None


@getter("vm_wallpaper")
def vm_wallpaper(spec: dict[str, Any]) -> str | None:
    """The wallpaper image's path, None when none is set or the file is gone."""
    uri = _wallpaper_uri()
    if not uri:
        return None
    path = unquote(urlparse(uri).path) if uri.startswith("file://") else uri
    return path if os.path.isfile(path) else None


def _tree(directory: str) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "directory", "name": os.path.basename(directory), "children": []}
    try:
        for entry in os.listdir(directory):
            full = os.path.join(directory, entry)
            node["children"].append(_tree(full) if os.path.isdir(full) else {"type": "file", "name": entry})
    except OSError as e:
        return {"error": str(e)}
    return node


@getter("list_directory")
def list_directory(spec: dict[str, Any]) -> dict[str, Any]:
    """The directory as a tree: {"type": "directory", "name", "children": [...]}, files as {"type": "file",
    "name"}; an unreadable directory is {"error": why}."""
    return _tree(os.path.expanduser(spec["path"]))
