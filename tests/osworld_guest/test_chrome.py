"""gh_osworld's Chromium getters and metrics: the tabs read over the debugging port of a real headless
Chromium (/usr/bin/chromium) showing file:// pages the test writes, the profile read from files in
Chromium's formats under a HOME the check runs with."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from kit.net import free_port, wait_answering

from .kit import GUEST_PYTHON, TIMEOUT_S, check, guest_env, metric, rule, verdict

CHROMIUM = "/usr/bin/chromium"


class Browser:
    def __init__(self, port: int, pages: Path) -> None:
        self.port, self.pages = port, pages

    def url(self, name: str, query: str = "") -> str:
        return (self.pages / name).as_uri() + (f"?{query}" if query else "")

    def open(self, url: str) -> str:
        # the whole URL escaped: DevTools reads /json/new's query up to the first "&" otherwise
        r = httpx.put(f"http://127.0.0.1:{self.port}/json/new?{quote(url, safe='')}", timeout=30)
        r.raise_for_status()
        return str(r.json()["id"])

    def activate(self, target: str) -> None:
        httpx.get(f"http://127.0.0.1:{self.port}/json/activate/{target}", timeout=30).raise_for_status()

    def close_all(self) -> None:
        for t in httpx.get(f"http://127.0.0.1:{self.port}/json/list", timeout=30).json():
            if t["type"] == "page":
                httpx.get(f"http://127.0.0.1:{self.port}/json/close/{t['id']}", timeout=30)

    def getter(self, kind: str, **params: Any) -> dict[str, Any]:
        return {"type": kind, "port": self.port, **params}


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no {CHROMIUM}: scripts/setup.sh installs Debian's chromium")
    pages = tmp_path / "pages"
    pages.mkdir()
    for name in ("one", "two", "three"):
        (pages / f"{name}.html").write_text(f"<title>{name.title()}</title><p>{name}</p>")
    port = free_port()
    args = [CHROMIUM, "--headless=new", f"--remote-debugging-port={port}", "--remote-debugging-address=127.0.0.1",
            f"--user-data-dir={tmp_path / 'chromium-profile'}", "--no-first-run", "--no-default-browser-check",
            (pages / "one.html").as_uri()]
    if os.geteuid() == 0:
        args.insert(1, "--no-sandbox")  # Chromium's sandbox refuses to run as root
    log = tmp_path / "chromium.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_answering(f"http://127.0.0.1:{port}/json/version", what="chromium", proc=proc, log=log, timeout=60)
        b = Browser(port, pages)
        yield b
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def test_open_tabs_and_the_front_tab(browser: Browser, tmp_path: Path) -> None:
    one = browser.url("one.html")
    two = browser.url("two.html", "q=drip+coffee&tbs=mr:1&departing=2024-01-22")
    browser.open(two)
    tabs = browser.getter("open_tabs_info")
    assert verdict(check(metric("is_expected_tabs", tabs, rule(type="url", urls=[two, one]))), tmp_path)
    assert not verdict(check(metric("is_expected_tabs", tabs, rule(type="url", urls=[one]))), tmp_path)
    assert not verdict(check(metric("is_expected_tabs", tabs, rule(type="url", urls=[one, browser.url("three.html")]))),
                       tmp_path)

    # the tab opened last is in front
    front = browser.getter("active_tab_info")
    assert verdict(check(metric("is_expected_url_pattern_match", front, rule(expected=["two\\.html", "q=drip"]))),
                   tmp_path)
    assert not verdict(check(metric("is_expected_url_pattern_match", front, rule(expected=["one\\.html"]))), tmp_path)
    parse = browser.getter("active_tab_url_parse", goto_prefix="https://www.", parse_keys=["q", "tbs", "departing"],
                           replace={"departing": "time"})
    assert verdict(check(metric("check_direct_json_object", parse,
                                rule(expected={"q": "drip coffee", "tbs": "mr:1", "time": "2024-01-22"}))), tmp_path)
    assert not verdict(check(metric("check_direct_json_object", parse, rule(expected={"q": "tea"}))), tmp_path)
    dash = browser.getter("url_dashPart", partIndex=-1, needDeleteId=True, returnType="string")
    assert verdict(check(metric("exact_match", dash, rule(expected="two.html"))), tmp_path)

    # another tab brought to the front is the active one
    first = next(t["id"] for t in httpx.get(f"http://127.0.0.1:{browser.port}/json/list", timeout=30).json()
                 if t["url"] == one)
    browser.activate(first)
    assert verdict(check(metric("is_expected_active_tab", browser.getter("active_url_from_accessTree",
                                                                          goto_prefix="https://www."),
                                rule(type="url", url=one))), tmp_path)
    assert not verdict(check(metric("is_expected_active_tab", front, rule(type="url", url=browser.url("two.html")))),
                       tmp_path)
    assert verdict(check(metric("is_expected_search_query", front, rule(expect={"pattern": "one\\.html$"}))), tmp_path)


def test_no_browser_no_tabs(browser: Browser, tmp_path: Path) -> None:
    gone = {"type": "open_tabs_info", "port": free_port()}
    assert not verdict(check(metric("is_expected_tabs", gone, rule(type="url", urls=[browser.url("one.html")]))),
                       tmp_path)
    assert not verdict(check(metric("is_expected_active_tab", {"type": "active_tab_info", "port": free_port()},
                                    rule(type="url", url=browser.url("one.html")))), tmp_path)
    browser.close_all()
    assert not verdict(check(metric("is_expected_url_pattern_match", browser.getter("active_tab_info"),
                                    rule(expected=["."]))), tmp_path)


# -- the profile, in Chromium's formats --

@pytest.fixture
def profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".config" / "google-chrome" / "Default" / "Network").mkdir(parents=True)
    (home / "Desktop").mkdir()
    monkeypatch.setenv("HOME", str(home))  # the check's subprocess runs with this HOME
    return home / ".config" / "google-chrome"


def prefs(profile: Path, data: dict[str, Any]) -> None:
    (profile / "Default" / "Preferences").write_text(json.dumps(data))


def judge(tmp: Path, func: str, getter: str, expected: dict[str, Any]) -> bool:
    return verdict(check(metric(func, {"type": getter}, expected)), tmp)


def test_preferences_getters(profile: Path, tmp_path: Path) -> None:
    prefs(profile, {"default_search_provider_data": {"template_url_data": {"short_name": "Bing"}},
                    "profile": {"name": "Thomas", "default_content_setting_values": {"cookies": 4}},
                    "enable_do_not_track": True, "safebrowsing": {"enhanced": True},
                    "session": {"restore_on_startup": 5},
                    "webkit": {"webprefs": {"default_font_size": 20}},
                    "extensions": {"settings": {"abc": {"path": "/home/user/Desktop/helloExtension",
                                                        "manifest": {"name": "Hello"}},
                                                "def": {"path": "def/1.0", "manifest": {"name": "Momentum"}}}}})
    for getter, value in (("default_search_engine", "Bing"), ("profile_name", "Thomas"),
                          ("enable_do_not_track", "true"), ("enable_enhanced_safety_browsing", "true"),
                          ("new_startup_page", "true"), ("data_delete_automacally", "true")):
        assert judge(tmp_path, "exact_match", getter, rule(expected=value)), getter
    assert judge(tmp_path, "check_font_size", "chrome_font_size", rule(type="range", min=16, max=99999))
    assert judge(tmp_path, "is_in_list", "find_unpacked_extension_path",
                 rule(expected="/home/user/Desktop/helloExtension"))
    assert judge(tmp_path, "is_expected_installed_extensions", "find_installed_extension_name",
                 rule(expected=["Momentum", "Hello"]))
    assert not judge(tmp_path, "is_expected_installed_extensions", "find_installed_extension_name",
                     rule(expected=["Momentum", "Zoom"]))

    # the untouched profile: Chromium's defaults, and every check fails
    prefs(profile, {"session": {"restore_on_startup": 1}})
    for getter, value in (("default_search_engine", "Bing"), ("profile_name", "Thomas"),
                          ("enable_do_not_track", "true"), ("enable_enhanced_safety_browsing", "true"),
                          ("new_startup_page", "true"), ("data_delete_automacally", "true")):
        assert not judge(tmp_path, "exact_match", getter, rule(expected=value)), getter
    assert not judge(tmp_path, "check_font_size", "chrome_font_size", rule(type="range", min=16, max=99999))
    assert not judge(tmp_path, "is_in_list", "find_unpacked_extension_path", rule(expected="/x"))
    # a broken Preferences file is the untouched state, not a crash
    (profile / "Default" / "Preferences").write_text("{broken")
    assert judge(tmp_path, "exact_match", "default_search_engine", rule(expected="Google"))


@pytest.mark.parametrize("state", ["missing", "broken", "a list"])
def test_unreadable_preferences_read_as_osworld_reads_them(profile: Path, tmp_path: Path, state: str) -> None:
    """OSWorld's Preferences getters answer "Google" (their search engine fallback) for a file they cannot
    read, so chrome 3299584d (no start page: new_startup_page "true") fails on a profile without one."""
    if state == "broken":
        (profile / "Default" / "Preferences").write_text("{broken")
    elif state == "a list":
        prefs(profile, [])  # type: ignore[arg-type]
    assert not judge(tmp_path, "exact_match", "new_startup_page", rule(expected="true"))
    for getter in ("new_startup_page", "enable_enhanced_safety_browsing", "data_delete_automacally",
                   "find_unpacked_extension_path", "find_installed_extension_name", "default_search_engine"):
        assert judge(tmp_path, "exact_match", getter, rule(expected="Google")), getter
    # the getters whose fallback is another value
    assert judge(tmp_path, "exact_match", "enable_do_not_track", rule(expected="false"))
    assert judge(tmp_path, "exact_match", "chrome_language", rule(expected="en-US"))


def test_bookmarks(profile: Path, tmp_path: Path) -> None:
    def link(url: str) -> dict[str, Any]:
        return {"type": "url", "name": url, "url": url}

    bar = {"children": [{"type": "folder", "name": "Favorites", "children": []},
                        {"type": "folder", "name": "Liked Authors",
                         "children": [link("https://jimfan.me/"), link("https://b.org/")]},
                        link("https://jalammar.github.io/illustrated-transformer/")]}
    (profile / "Default" / "Bookmarks").write_text(json.dumps({"roots": {"bookmark_bar": bar, "other": {}}}))
    assert judge(tmp_path, "is_expected_bookmarks", "bookmarks",
                 rule(type="bookmark_bar_folders_names", names=["Favorites", "Liked Authors"]))
    assert not judge(tmp_path, "is_expected_bookmarks", "bookmarks",
                     rule(type="bookmark_bar_folders_names", names=["Favorites"]))
    assert judge(tmp_path, "is_expected_bookmarks", "bookmarks",
                 rule(type="bookmark_bar_websites_urls", urls=["https://jalammar.github.io/illustrated-transformer/"]))
    liked = rule(type="liked_authors_websites_urls", names=["Liked Authors"],
                 urls=[["https://jimfan.me/", "https://other/"], "https://b.org/"])
    assert judge(tmp_path, "is_expected_bookmarks", "bookmarks", liked)
    liked["rules"]["urls"] = [["https://other/"], "https://b.org/"]
    assert not judge(tmp_path, "is_expected_bookmarks", "bookmarks", liked)
    (profile / "Default" / "Bookmarks").unlink()
    assert not judge(tmp_path, "is_expected_bookmarks", "bookmarks",
                     rule(type="bookmark_bar_folders_names", names=["Favorites"]))


def _sqlite(path: Path, schema: str, rows: list[tuple[Any, ...]], insert: str) -> None:
    with sqlite3.connect(path) as c:
        c.execute(schema)
        c.executemany(insert, rows)
    c.close()


def test_history_and_cookies(profile: Path, tmp_path: Path) -> None:
    history = profile / "Default" / "History"
    _sqlite(history, "CREATE TABLE urls(id INTEGER PRIMARY KEY, url LONGVARCHAR, title LONGVARCHAR, "
            "visit_count INTEGER, last_visit_time INTEGER)",
            [(1, "https://www.youtube.com/watch?v=1", "YT", 1, 1), (2, "https://example.org/", "Ex", 1, 2)],
            "INSERT INTO urls VALUES (?, ?, ?, ?, ?)")
    keywords = rule(type="keywords", keywords=["youtube"])
    assert not verdict(check(metric("check_history_deleted", {"type": "history", "dest": "h"}, keywords)), tmp_path)
    with sqlite3.connect(history) as c:
        c.execute("DELETE FROM urls WHERE url LIKE '%youtube%'")
    c.close()
    assert verdict(check(metric("check_history_deleted", {"type": "history", "dest": "h"}, keywords)), tmp_path)
    history.write_text("not a database")
    assert not verdict(check(metric("check_history_deleted", {"type": "history", "dest": "h"}, keywords)), tmp_path)

    cookies = profile / "Default" / "Network" / "Cookies"
    _sqlite(cookies, "CREATE TABLE cookies(creation_utc INTEGER, host_key TEXT, top_frame_site_key TEXT, name TEXT,"
            " value TEXT)", [(1, ".amazon.com", "", "session", "x"), (2, ".example.org", "", "a", "b")],
            "INSERT INTO cookies VALUES (?, ?, ?, ?, ?)")
    domains = rule(type="domains", domains=[".amazon.com"])
    assert not verdict(check(metric("is_cookie_deleted", {"type": "cookie_data", "dest": "Cookies"}, domains)),
                       tmp_path)
    with sqlite3.connect(cookies) as c:
        c.execute("DELETE FROM cookies WHERE host_key = '.amazon.com'")
    c.close()
    assert verdict(check(metric("is_cookie_deleted", {"type": "cookie_data", "dest": "Cookies"}, domains)), tmp_path)


def test_flags_and_shortcuts(profile: Path, tmp_path: Path) -> None:
    state = profile / "Local State"
    want = rule(type="names", names=["chrome-refresh-2023", "chrome-webui-refresh-2023"])
    state.write_text(json.dumps({"browser": {"enabled_labs_experiments": ["chrome-refresh-2023@1",
                                                                          "chrome-webui-refresh-2023@1"]}}))
    assert judge(tmp_path, "check_enabled_experiments", "enabled_experiments", want)
    state.write_text(json.dumps({"browser": {"enabled_labs_experiments": ["chrome-refresh-2023@1"]}}))
    assert not judge(tmp_path, "check_enabled_experiments", "enabled_experiments", want)
    state.unlink()
    assert not judge(tmp_path, "check_enabled_experiments", "enabled_experiments", want)

    desktop = profile.parents[1] / "Desktop"
    name = rule(type="name", name="Play Puzzle Game 2048")
    assert not judge(tmp_path, "is_shortcut_on_desktop", "shortcuts_on_desktop", name)
    (desktop / "chrome-abc.desktop").write_text("[Desktop Entry]\nName=Play Puzzle Game 2048\nExec=x\n")
    assert judge(tmp_path, "is_shortcut_on_desktop", "shortcuts_on_desktop", name)



SAME_URL = """
import json, sys
from gh_osworld.metrics import chrome
chrome.SUFFIX_LIST = sys.argv[1]
print(json.dumps([chrome.same_url(a, b) for a, b in json.loads(sys.argv[2])]))
"""


def test_urls_compare_as_osworld_compares_them_with_or_without_the_suffix_list() -> None:
    """OSWorld's compare_urls drops a host's public suffix, a lone "www" before the registered name, and the
    port (tldextract); the bench holds ours to it on Debian's list (fidelity_pairs.py _chrome_pairs). An image
    without the list takes the top label for the suffix."""
    pairs = [("https://docs.example.com.sg/a", "https://docs.example.org/a"),
             ("https://www.example.co.uk/", "https://example.org"),
             ("https://www.docs.example.org/a", "https://docs.example.org/a"),
             ("example.org/a", "http://example.org/a"),
             ("https://example.org:8443/a", "https://example.org/a")]

    def same(suffix_list: str) -> list[bool]:
        p = subprocess.run([GUEST_PYTHON, "-c", SAME_URL, suffix_list, json.dumps(pairs)], env=guest_env(),
                           capture_output=True, text=True, timeout=TIMEOUT_S)
        assert p.returncode == 0, p.stderr
        return list(json.loads(p.stdout))

    assert same("/usr/share/publicsuffix/public_suffix_list.dat") == [True, True, False, True, True]
    assert same("/nonexistent/public_suffix_list.dat") == [False, False, False, True, True]
