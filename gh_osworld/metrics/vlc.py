"""VLC: what it plays (its HTTP status), its window, and its preferences (vlcrc).

vlcrc lists every option as `name=value`, commented out (`#name=value`, VLC's default shown) until the
user changes it. An option's value is its uncommented line's, else the default VLC documents.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse
from xml.etree import ElementTree

from gh_osworld.reading import agent_text
from gh_osworld.registry import metric
from gh_osworld.spec import SpecError


def vlcrc_value(path: str, name: str, default: str) -> str:
    value = default
    for line in agent_text(path, what="vlcrc").splitlines():
        key, sep, rest = line.strip().partition("=")
        if sep and key.strip() == name:
            value = rest.strip()
    return value


def _want(rules: dict[str, Any], key: str) -> str:
    return str(rules[key])


# Where OSWorld's is_vlc_playing (desktop-env 1.0.2) looks for what is playing, in order: the first of these
# meta entries with text is the one compared.
_NAME_INFO = ("filename", "title", "uri", "location", "name")
_URL_INFO = ("url", "URI", "location", "title", "filename")
_URL_STREAM_INFO = ("Codec", "Type", "Language")


def _first_info(tree: ElementTree.Element, category: str, names: tuple[str, ...]) -> str | None:
    for name in names:
        text = tree.findtext(f'information/category[@name="{category}"]/info[@name="{name}"]')
        if text:
            return text
    return None


def _url_plays(info: str, want: str) -> bool:
    """The URL VLC names is the expected one: it contains it; or it is the expected URL's file name alone
    (VLC names an HLS stream by its playlist's file); or it is a URL on the same host whose path contains
    the expected path."""
    if want in info:
        return True
    expected = urlparse(want)
    if info == posixpath.basename(expected.path):
        return True
    if "://" not in info:
        return False
    actual = urlparse(info)
    return actual.netloc == expected.netloc and expected.path in actual.path


@metric("is_vlc_playing")
def is_vlc_playing(result: str | None, rules: dict[str, Any]) -> float:
    """VLC's state (status.xml's text, getters/apps.py vlc_playing_info) is "playing", and what it plays
    is the expected file (`type: file_name`: the first of _NAME_INFO given ends with it) or URL (`type: url`:
    the first of _URL_INFO given, else of the first stream's _URL_STREAM_INFO, names it: _url_plays)."""
    if result is None:
        return 0.0
    try:
        tree = ElementTree.fromstring(result)
    except ElementTree.ParseError:
        return 0.0
    if tree.findtext("state") != "playing":
        return 0.0
    kind = rules.get("type")
    if kind == "file_name":
        info = _first_info(tree, "meta", _NAME_INFO)
        return float(info is not None and info.endswith(rules["file_name"]))
    if kind == "url":
        info = _first_info(tree, "meta", _URL_INFO) or _first_info(tree, "Stream 0", _URL_STREAM_INFO)
        return float(info is not None and _url_plays(info, rules["url"]))
    raise SpecError(f"is_vlc_playing: type {kind!r} is not known")


@metric("is_vlc_recordings_folder")
def is_vlc_recordings_folder(result: str | None, rules: dict[str, Any]) -> float:
    """The recordings folder (input-record-path) is set, to the expected path."""
    if result is None:
        return 0.0
    return float(vlcrc_value(result, "input-record-path", "") == rules["recording_file_path"])


@metric("is_vlc_fullscreen")
def is_vlc_fullscreen(window: dict[str, int] | None, screen: dict[str, int] | None) -> float:
    """VLC's window is as large as the screen (the window's size is the result getter's, in OSWorld's
    order the first argument)."""
    if not window or not screen:
        return 0.0
    return float(window.get("width") == screen.get("width") and window.get("height") == screen.get("height"))


def _setting(name: str, default: str, key: str) -> Callable[[str | None, dict[str, Any]], float]:
    def check(result: str | None, rules: dict[str, Any]) -> float:
        if result is None:
            return 0.0
        return float(vlcrc_value(result, name, default) == _want(rules, key))

    check.__doc__ = f"vlcrc's {name} (default {default}) is rules[{key!r}]."
    return check


metric("check_qt_bgcone")(_setting("qt-bgcone", "1", "expected_qt_bgcone"))
metric("check_qt_max_volume")(_setting("qt-max-volume", "125", "expected_qt_max_volume"))
metric("check_qt_minimal_view")(_setting("qt-minimal-view", "0", "expected_qt_minimal_view"))
metric("check_one_instance_when_started_from_file")(
    _setting("one-instance-when-started-from-file", "1", "expected_one_instance_when_started_from_file"))


@metric("check_global_key_play_pause")
def check_global_key_play_pause(result: str | None, rules: dict[str, Any]) -> float:
    """A global play/pause key is set ("1") or not ("0") as expected."""
    if result is None:
        return 0.0
    is_set = "1" if vlcrc_value(result, "global-key-play-pause", "") else "0"
    return float(is_set == _want(rules, "expected_global_key_play_pause"))


SLIDER_DEFAULT = "153;210;153;20;210;20;255;199;15;245;39;29"


@metric("check_qt_slider_colours")
def check_qt_slider_colours(result: str | None, rules: dict[str, Any]) -> float:
    """The volume slider's colours: `type: match` exactly the expected string; `type: blackish` every colour
    with each of red, green and blue under 100."""
    if result is None:
        return 0.0
    colours = vlcrc_value(result, "qt-slider-colours", SLIDER_DEFAULT)
    if rules.get("type") == "match":
        return float(colours == rules["expected_qt_slider_colours"])
    if rules.get("type") == "blackish":
        try:
            values = [int(v) for v in colours.split(";")]
        except ValueError:
            return 0.0
        return float(bool(values) and all(v < 100 for v in values))
    raise SpecError(f"check_qt_slider_colours: type {rules.get('type')!r} is not known")
