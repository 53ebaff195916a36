"""Chromium's state, read where the browser keeps it.

The profile (OSWorld's path, which osworld-desktop keeps: ~/.config/google-chrome): Default/Preferences,
Default/Bookmarks, Local State as JSON; Default/History and the cookie database as SQLite, read from a
copy (the running browser holds them locked); unpacked and store extensions as Preferences lists them.

The open tabs over the remote-debugging port on the guest's loopback (`port` in the getter's parameters,
9222 by default): `GET /json/list` lists the browser's targets, pages most recently active first, so the
first page is the tab in front. OSWorld reads the front tab's address from the accessibility tree's
address bar and puts `goto_prefix` before it (the bar hides "https://www."); here the tab's own URL is
read, whole, and `goto_prefix` is not needed. A browser that does not answer gives no tabs (None for the
front tab): the agent closed it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import urllib.error
import urllib.request
from collections import Counter
from typing import Any
from urllib.parse import parse_qs, urlparse

from gh_osworld.getters.commands import run
from gh_osworld.names import VIDEO_TYPES
from gh_osworld.reading import query_copy
from gh_osworld.registry import getter

DEVTOOLS_PORT = 9222
DEVTOOLS_TIMEOUT_S = 10
MAX_LISTING_BYTES = 4 << 20


def profile_dir() -> str:
    return os.path.expanduser("~/.config/google-chrome")


def _json_file(*parts: str) -> Any:
    """A JSON file of the profile, None when it is missing or unreadable (the browser never wrote it, or
    the agent broke it)."""
    try:
        with open(os.path.join(profile_dir(), *parts), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _preferences() -> dict[str, Any]:
    data = _json_file("Default", "Preferences")
    return data if isinstance(data, dict) else {}


# What several of OSWorld's Preferences getters answer when the file is missing or unreadable (their
# fallback is the search engine getter's): a value no check expects, so the check fails, as in OSWorld.
UNREADABLE = "Google"


def _readable_preferences() -> dict[str, Any] | None:
    """Preferences as a dict, or None when missing, unreadable or no object (OSWorld's getters then fall
    back: UNREADABLE for most)."""
    data = _json_file("Default", "Preferences")
    return data if isinstance(data, dict) else None


def _query_copy(path: str, sql: str) -> list[tuple[Any, ...]] | None:
    """Rows of a query on a copy of the SQLite file, None when it is missing or not a database."""
    if not os.path.isfile(path):
        return None
    try:
        return query_copy(path, sql)
    except (OSError, sqlite3.DatabaseError):
        return None


# -- the open tabs, over the debugging port --

def pages(spec: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The browser's pages, most recently active first; None when the browser does not answer."""
    port = int(spec.get("port", DEVTOOLS_PORT))
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=DEVTOOLS_TIMEOUT_S) as r:
            targets = json.loads(r.read(MAX_LISTING_BYTES))
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return [t for t in targets if isinstance(t, dict) and t.get("type") == "page"]


@getter("open_tabs_info")
def open_tabs_info(spec: dict[str, Any]) -> list[dict[str, str]]:
    return [{"title": p.get("title", ""), "url": p.get("url", "")} for p in pages(spec) or []]


def active_url(spec: dict[str, Any]) -> str | None:
    front = pages(spec)
    return front[0].get("url") if front else None


@getter("active_tab_info")
def active_tab_info(spec: dict[str, Any]) -> dict[str, str] | None:
    """The front tab's title and URL (OSWorld also loads the page again for its HTML: not here)."""
    front = pages(spec)
    return {"title": front[0].get("title", ""), "url": front[0].get("url", "")} if front else None


@getter("active_url_from_accessTree")
def active_url_from_access_tree(spec: dict[str, Any]) -> str | None:
    return active_url(spec)


@getter("active_tab_url_parse")
def active_tab_url_parse(spec: dict[str, Any]) -> dict[str, str] | None:
    """The front tab's query parameters named in `parse_keys` (the first value, "" when absent), each
    renamed as `replace` says."""
    url = active_url(spec)
    if url is None:
        return None
    query = parse_qs(urlparse(url).query)
    found = {k: query.get(k, [""])[0] for k in spec["parse_keys"]}
    for old, new in (spec.get("replace") or {}).items():
        found[new] = found.pop(old)
    return found


@getter("url_dashPart")
def url_dash_part(spec: dict[str, Any]) -> Any:
    """The front tab's URL's `partIndex`th part between slashes, its query cut off with `needDeleteId`;
    as text, or as {key: part} with `returnType: json`."""
    url = active_url(spec)
    if url is None:
        return None
    try:
        part = url.split("/")[spec["partIndex"]]
    except IndexError:
        return None
    if spec.get("needDeleteId", False):
        part = part.split("?")[0]
    return {spec["key"]: part} if spec.get("returnType") == "json" else part


# -- the profile --

@getter("bookmarks")
def bookmarks(spec: dict[str, Any]) -> Any:
    """The Bookmarks file's roots (bookmark_bar, other, synced); [] when there is none."""
    data = _json_file("Default", "Bookmarks")
    return data.get("roots", {}) if isinstance(data, dict) else []


@getter("history")
def history(spec: dict[str, Any]) -> list[tuple[Any, ...]] | None:
    """(url, title, last_visit_time) of every URL in the history."""
    path = os.path.join(profile_dir(), "Default", "History")
    return _query_copy(path, "SELECT url, title, last_visit_time FROM urls")


@getter("cookie_data")
def cookie_data(spec: dict[str, Any]) -> list[tuple[Any, ...]] | None:
    """Every row of the cookies table (its second column is the host); Chromium keeps it in
    Default/Network/Cookies, older versions in Default/Cookies."""
    for parts in (("Default", "Network", "Cookies"), ("Default", "Cookies")):
        path = os.path.join(profile_dir(), *parts)
        if os.path.isfile(path):
            return _query_copy(path, "SELECT * FROM cookies")
    return None


@getter("default_search_engine")
def default_search_engine(spec: dict[str, Any]) -> str:
    data = _preferences().get("default_search_provider_data", {})
    return str(data.get("template_url_data", {}).get("short_name", "Google"))


@getter("profile_name")
def profile_name(spec: dict[str, Any]) -> Any:
    return _preferences().get("profile", {}).get("name")


@getter("enabled_experiments")
def enabled_experiments(spec: dict[str, Any]) -> list[str]:
    """chrome://flags as set: Local State's browser.enabled_labs_experiments ("name@option" each)."""
    data = _json_file("Local State")
    if not isinstance(data, dict):
        return []
    return list(data.get("browser", {}).get("enabled_labs_experiments", []))


@getter("chrome_language")
def chrome_language(spec: dict[str, Any]) -> str:
    data = _json_file("Local State")
    return str(data.get("intl", {}).get("app_locale", "en-US")) if isinstance(data, dict) else "en-US"


@getter("chrome_font_size")
def chrome_font_size(spec: dict[str, Any]) -> dict[str, Any]:
    """webkit.webprefs (default_font_size, default_fixed_font_size, minimum_font_size), Chromium's defaults
    where unset."""
    prefs = _preferences().get("webkit", {}).get("webprefs")
    defaults = {"default_fixed_font_size": 13, "default_font_size": 16, "minimum_font_size": 13}
    return {**defaults, **prefs} if isinstance(prefs, dict) else defaults


def _flag(value: Any) -> str:
    return "true" if value else "false"


@getter("enable_do_not_track")
def enable_do_not_track(spec: dict[str, Any]) -> str:
    return _flag(_preferences().get("enable_do_not_track"))


@getter("enable_enhanced_safety_browsing")
def enable_enhanced_safety_browsing(spec: dict[str, Any]) -> str:
    prefs = _readable_preferences()
    if prefs is None:
        return UNREADABLE
    return _flag(prefs.get("safebrowsing", {}).get("enhanced"))


@getter("new_startup_page")
def new_startup_page(spec: dict[str, Any]) -> str:
    """"true" when the browser opens the new tab page at start: no session setting at all, or
    session.restore_on_startup 5."""
    prefs = _readable_preferences()
    if prefs is None:
        return UNREADABLE
    if "session" not in prefs:
        return "true"
    return _flag(prefs["session"].get("restore_on_startup") == 5)


@getter("data_delete_automacally")
def data_delete_automatically(spec: dict[str, Any]) -> str:
    """"true" once any site data setting is made (profile.default_content_setting_values exists), OSWorld's
    reading of "delete site data when the browser closes"; UNREADABLE without a profile object."""
    prefs = _readable_preferences()
    if prefs is None or not isinstance(prefs.get("profile"), dict):
        return UNREADABLE
    return _flag(prefs["profile"].get("default_content_setting_values") is not None)


def _extension_settings() -> dict[str, Any] | None:
    prefs = _readable_preferences()
    if prefs is None:
        return None
    settings = prefs.get("extensions", {}).get("settings", {})
    return settings if isinstance(settings, dict) else {}


@getter("find_unpacked_extension_path")
def find_unpacked_extension_path(spec: dict[str, Any]) -> list[str] | str:
    settings = _extension_settings()
    if settings is None:
        return UNREADABLE
    return [s["path"] for s in settings.values() if isinstance(s, dict) and "path" in s]


@getter("find_installed_extension_name")
def find_installed_extension_name(spec: dict[str, Any]) -> list[str] | str:
    settings = _extension_settings()
    if settings is None:
        return UNREADABLE
    return [s["manifest"]["name"] for s in settings.values()
            if isinstance(s, dict) and isinstance(s.get("manifest"), dict) and "name" in s["manifest"]]


@getter("shortcuts_on_desktop")
def shortcuts_on_desktop(spec: dict[str, Any]) -> dict[str, str]:
    """Every *.desktop file on ~/Desktop, by name, with its text."""
    desktop = os.path.expanduser("~/Desktop")
    found: dict[str, str] = {}
    try:
        names = os.listdir(desktop)
    except OSError:
        return found
    for name in names:
        if name.endswith(".desktop"):
            try:
                with open(os.path.join(desktop, name), encoding="utf-8", errors="replace") as f:
                    found[name] = f.read()
            except OSError:
                continue
    return found


@getter("default_video_player")
def default_video_player(spec: dict[str, Any]) -> str:
    """The desktop file most video types open with (`xdg-mime query default video/...`), "unknown" when
    none is set."""
    apps: Counter[str] = Counter()
    for kind in VIDEO_TYPES:
        done = run({"type": "default_video_player", "command": ["xdg-mime", "query", "default", f"video/{kind}"],
                    "timeout": 20})
        if done is not None and done.stdout:
            apps[done.stdout] += 1
    return apps.most_common(1)[0][0] if apps else "unknown"
