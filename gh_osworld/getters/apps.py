"""Applications' own files and interfaces: VLC's configuration and its HTTP status, GIMP's configuration."""

from __future__ import annotations

import base64
import os
import urllib.error
import urllib.request
from typing import Any

from gh_osworld.getters.files import vm_path
from gh_osworld.registry import getter

VLC_HTTP_PORT = 8080  # VLC's http interface, as OSWorld's machine configures it (password "password")
VLC_HTTP_PASSWORD = "password"
HTTP_TIMEOUT_S = 10
MAX_STATUS_BYTES = 1 << 20


@getter("vlc_config")
def vlc_config(spec: dict[str, Any]) -> str | None:
    """~/.config/vlc/vlcrc, None when VLC never saved its preferences."""
    return vm_path("~/.config/vlc/vlcrc")


@getter("gimp_config_file")
def gimp_config_file(spec: dict[str, Any]) -> str | None:
    """~/.config/GIMP/2.10/<file_name> (gimprc, sessionrc, action-history, ...)."""
    return vm_path(os.path.join("~/.config/GIMP/2.10", spec["file_name"]))


@getter("vlc_playing_info")
def vlc_playing_info(spec: dict[str, Any]) -> str | None:
    """VLC's status.xml from its HTTP interface on the loopback, as text (OSWorld writes it to a file for
    its metric; ours, vlc.py is_vlc_playing, takes the text); None when VLC does not answer (not running,
    or its HTTP interface not enabled)."""
    port = int(spec.get("port", VLC_HTTP_PORT))
    request = urllib.request.Request(f"http://127.0.0.1:{port}/requests/status.xml")
    token = base64.b64encode(f":{VLC_HTTP_PASSWORD}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as r:
            body = r.read(MAX_STATUS_BYTES)
    except (OSError, urllib.error.URLError):
        return None
    return body.decode("utf-8", "replace")
