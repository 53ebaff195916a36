"""Chromium: tabs, URLs, bookmarks, history, cookies, flags, fonts, extensions, desktop shortcuts."""

from __future__ import annotations

import functools
import re
from itertools import product
from typing import Any
from urllib.parse import urlparse, urlunparse

from gh_osworld.registry import metric
from gh_osworld.spec import SpecError

# Debian's publicsuffix package (osworld-desktop's image): the public suffix list, whose ICANN section
# OSWorld's URL comparison (tldextract, its default list) uses.
SUFFIX_LIST = "/usr/share/publicsuffix/public_suffix_list.dat"
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+\-.]*://")


@functools.cache
def _suffix_rules(path: str) -> tuple[frozenset[str], frozenset[str], frozenset[str]] | None:
    """The list's ICANN rules: plain suffixes, the bases of wildcards (`*.ck`: "ck"), exceptions (`!www.ck`);
    None where the guest has no list."""
    plain: set[str] = set()
    wild: set[str] = set()
    exceptions: set[str] = set()
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if "===BEGIN PRIVATE DOMAINS===" in line:
                    break
                rule = line.strip().split(" ", 1)[0].lower()
                if not rule or rule.startswith("//"):
                    continue
                if rule.startswith("!"):
                    exceptions.add(rule[1:])
                elif rule.startswith("*."):
                    wild.add(rule[2:])
                else:
                    plain.add(rule)
    except OSError:
        return None
    return frozenset(plain), frozenset(wild), frozenset(exceptions)


def _suffix_length(labels: list[str]) -> int:
    """How many of the host's last labels are its public suffix: the longest listed one (an exception is
    not one), 0 when its top label is not listed (`localhost`, an address). Without the list, the top label."""
    rules = _suffix_rules(SUFFIX_LIST)
    if rules is None:
        return 1 if len(labels) > 1 else 0
    plain, wild, exceptions = rules
    for i in range(len(labels)):
        name = ".".join(labels[i:])
        if name in exceptions:
            return len(labels) - i - 1
        if name in plain or (i + 1 < len(labels) and ".".join(labels[i + 1:]) in wild):
            return len(labels) - i
    return 0


def _host(netloc: str) -> str:
    """The host of a netloc without its user and port, its public suffix dropped, and "www" dropped where it
    is all that stands before the registered name: www.example.org and example.com.sg are both "example"."""
    host = netloc.rpartition("@")[2]
    if not host.startswith("["):
        host = host.partition(":")[0]
    labels = host.strip(".").split(".")
    suffix = _suffix_length(labels)
    name = labels[:len(labels) - suffix]
    if not name:
        return ""
    sub = ".".join(name[:-1])
    return name[-1] if sub in ("", "www") else f"{sub}.{name[-1]}"


def normal_url(url: str) -> str:
    """A URL as OSWorld compares them (desktop-env 1.0.2's compare_urls): http:// put before a URL without a
    scheme, the scheme and host lowercased, the host as _host gives it, a path of only "/" dropped; the
    parameters, query and fragment kept."""
    parts = urlparse(url if _SCHEME.match(url) else "http://" + url)
    return urlunparse(parts._replace(scheme=parts.scheme.lower(), netloc=_host(parts.netloc.lower()),
                                     path="" if parts.path == "/" else parts.path))


def same_url(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a == b
    return normal_url(a) == normal_url(b)


def _url_of(tab: Any) -> str | None:
    return tab.get("url") if isinstance(tab, dict) else tab


@metric("is_expected_active_tab")
def is_expected_active_tab(result: Any, rules: dict[str, Any]) -> float:
    """The front tab's URL is rules["url"] (`type: url`), compared as normal_url does."""
    if not result:
        return 0.0
    if rules.get("type") != "url":
        raise SpecError(f"is_expected_active_tab: type {rules.get('type')!r} is not known")
    return float(same_url(rules["url"], _url_of(result)))


@metric("is_expected_url_pattern_match")
def is_expected_url_pattern_match(result: Any, rules: dict[str, Any]) -> float:
    """Every regular expression of rules["expected"] is found in the front tab's URL."""
    url = _url_of(result) if result else None
    if not url:
        return 0.0
    return float(all(re.search(p, url) for p in rules["expected"]))


@metric("is_expected_search_query")
def is_expected_search_query(result: Any, rules: dict[str, Any]) -> float:
    url = _url_of(result) if result else None
    return float(bool(url) and re.search(rules["expect"]["pattern"], url or "") is not None)


@metric("is_expected_tabs")
def is_expected_tabs(result: list[dict[str, str]] | None, rules: dict[str, Any]) -> float:
    """The open tabs are the expected URLs: as many, and each expected URL the same as one open (any order)."""
    if rules.get("type") != "url":
        raise SpecError(f"is_expected_tabs: type {rules.get('type')!r} is not known")
    urls = [t.get("url") for t in result or []]
    want = rules["urls"]
    return float(len(urls) == len(want) and all(any(same_url(w, u) for u in urls) for w in want))


def _bar(bookmarks: Any) -> list[dict[str, Any]]:
    try:
        children = bookmarks["bookmark_bar"]["children"]
    except (KeyError, TypeError):
        return []
    return [c for c in children if isinstance(c, dict)]


@metric("is_expected_bookmarks")
def is_expected_bookmarks(result: Any, rules: dict[str, Any]) -> float:
    """On the bookmark bar: `bookmark_bar_folders_names` its folders are exactly the names;
    `bookmark_bar_websites_urls` its links are exactly the URLs; `liked_authors_websites_urls` its folder
    "Liked Authors" holds exactly one URL of each alternative list."""
    if not result:
        return 0.0
    kind, bar = rules.get("type"), _bar(result)
    if kind == "bookmark_bar_folders_names":
        return float({b.get("name") for b in bar if b.get("type") == "folder"} == set(rules["names"]))
    if kind == "bookmark_bar_websites_urls":
        return float({b.get("url") for b in bar if b.get("type") == "url"} == set(rules["urls"]))
    if kind == "liked_authors_websites_urls":
        folder = next((b for b in bar if b.get("type") == "folder" and b.get("name") == "Liked Authors"), None)
        if folder is None:
            return 0.0
        urls = {c.get("url") for c in folder.get("children", []) if isinstance(c, dict) and c.get("type") == "url"}
        choices = [[u] if isinstance(u, str) else list(u) for u in rules["urls"]]
        return float(any(set(pick) == urls for pick in product(*choices)))
    raise SpecError(f"is_expected_bookmarks: type {kind!r} is not known")


@metric("check_history_deleted")
def check_history_deleted(result: list[tuple[Any, ...]] | None, rules: dict[str, Any]) -> float:
    """No URL left in the history contains any of the keywords (`type: keywords`)."""
    if rules.get("type") != "keywords":
        raise SpecError(f"check_history_deleted: type {rules.get('type')!r} is not known")
    if result is None:
        return 0.0
    return float(not any(k in str(row[0]) for k in rules["keywords"] for row in result))


@metric("is_cookie_deleted")
def is_cookie_deleted(result: list[tuple[Any, ...]] | None, rules: dict[str, Any]) -> float:
    """No cookie's host is any of the domains (`type: domains`), compared as normal_url does."""
    if rules.get("type") != "domains":
        raise SpecError(f"is_cookie_deleted: type {rules.get('type')!r} is not known")
    if result is None:
        return 0.0
    return float(not any(same_url(d, str(row[1])) for d in rules["domains"] for row in result))


@metric("check_enabled_experiments")
def check_enabled_experiments(result: list[str] | None, rules: dict[str, Any]) -> float:
    """The flags set (their names, without "@option") are exactly rules["names"], in that order."""
    if rules.get("type") != "names":
        raise SpecError(f"check_enabled_experiments: type {rules.get('type')!r} is not known")
    return float([e.split("@")[0] for e in result or []] == rules["names"])


@metric("check_font_size")
def check_font_size(result: dict[str, Any] | None, rules: dict[str, Any]) -> float:
    """The default font size: `type: value` equal to rules["value"]; `type: range` strictly between min and max."""
    if not result:
        return 0.0
    size = result.get("default_font_size")
    if rules.get("type") == "value":
        return float(size == rules["value"])
    if rules.get("type") == "range":
        try:
            return float(rules["min"] < size < rules["max"])
        except TypeError:
            return 0.0
    raise SpecError(f"check_font_size: type {rules.get('type')!r} is not known")


@metric("is_expected_installed_extensions")
def is_expected_installed_extensions(result: list[str] | None, rules: dict[str, Any]) -> float:
    """Every expected extension name is among the installed ones."""
    return float(set(rules["expected"]) <= set(result or []))


@metric("is_shortcut_on_desktop")
def is_shortcut_on_desktop(result: dict[str, str] | None, rules: dict[str, Any]) -> float:
    """A desktop shortcut has the line Name=<name> (`type: name`)."""
    if rules.get("type") != "name":
        raise SpecError(f"is_shortcut_on_desktop: type {rules.get('type')!r} is not known")
    line = "Name=" + rules["name"] + "\n"
    return float(any(line in text for text in (result or {}).values()))
