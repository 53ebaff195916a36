"""gh_osworld/metrics/general.py on the guest's Python: a right answer passes, each kind of wrong answer
fails, a missing or unreadable result fails without a crash."""

from __future__ import annotations

import json
import sqlite3
import zipfile
from pathlib import Path
from typing import Any

import pytest

from .kit import check, crash, embedded, metric, rule, verdict, vm_file


def text_getter(value: str) -> dict[str, Any]:
    """A getter that gives this text (a command's output)."""
    return {"type": "vm_command_line", "command": ["printf", "%s", value]}


def write(tmp: Path, name: str, content: str | bytes) -> Path:
    p = tmp / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content, encoding="utf-8")
    return p


def judge(tmp: Path, func: str, result: Any, expected: Any, **options: Any) -> bool:
    return verdict(check(metric(func, result, expected, **options)), tmp)


def test_exact_match_is_exact(tmp_path: Path) -> None:
    assert judge(tmp_path, "exact_match", text_getter("Bing"), rule(expected="Bing"))
    assert not judge(tmp_path, "exact_match", text_getter("Bing "), rule(expected="Bing"))
    assert not judge(tmp_path, "exact_match", text_getter("bing"), rule(expected="Bing"))


def test_is_in_list_and_include_exclude(tmp_path: Path) -> None:
    assert judge(tmp_path, "is_in_list", text_getter("# packages in environment at /x"),
                 rule(expected="packages in environment at"))
    assert not judge(tmp_path, "is_in_list", text_getter("nothing"), rule(expected="packages"))
    rules = rule(include=["a", "b"], exclude=["bad"])
    assert judge(tmp_path, "check_include_exclude", text_getter("a b"), rules)
    assert not judge(tmp_path, "check_include_exclude", text_getter("a"), rules)
    assert not judge(tmp_path, "check_include_exclude", text_getter("a b bad"), rules)


def test_literal_match(tmp_path: Path) -> None:
    as_value = {"type": "rule", "rules": "Hello"}
    assert judge(tmp_path, "literal_match", text_getter("Hello"), as_value)
    assert judge(tmp_path, "literal_match", text_getter("hello"), as_value, ignore_case=True)
    assert not judge(tmp_path, "literal_match", text_getter("hello"), as_value)
    a_list = {"type": "rule", "rules": ["a", "1"]}
    assert judge(tmp_path, "literal_match", {"type": "rule", "rules": ["a", 1]}, a_list, type="list")
    assert not judge(tmp_path, "literal_match", {"type": "rule", "rules": ["a"]}, a_list, type="list")
    assert not judge(tmp_path, "literal_match", text_getter("a1"), a_list, type="list")


@pytest.mark.parametrize(("mine", "options", "ok"), [
    ("line one\nline two\n", {}, True),
    ("line one\r\nline two\r\n", {}, True),        # universal newlines, as OSWorld reads text
    ("line one\nline two", {}, False),
    ("Line One\nline two\n", {}, False),
    ("Line One\nline two\n", {"ignore_case": True}, True),
    ("line   one\n\tline two", {"ignore_blanks": True}, True),
])
def test_compare_text_file(mine: str, options: dict[str, Any], ok: bool, tmp_path: Path) -> None:
    write(tmp_path, "gold.txt", "line one\nline two\n")
    (tmp_path / "mine.txt").write_bytes(mine.encode())
    assert judge(tmp_path, "compare_text_file", vm_file(tmp_path / "mine.txt"), embedded(tmp_path / "gold.txt"),
                 **options) is ok


def test_text_files_missing_or_unreadable_fail(tmp_path: Path) -> None:
    write(tmp_path, "gold.txt", "x")
    write(tmp_path, "binary.txt", b"\xff\xfe\x00bad")
    for func in ("compare_text_file", "diff_text_file", "compare_python_pure_text", "compare_result_files"):
        assert not judge(tmp_path, func, vm_file(tmp_path / "none.txt"), embedded(tmp_path / "gold.txt")), func
        assert not judge(tmp_path, func, vm_file(tmp_path / "binary.txt"), embedded(tmp_path / "gold.txt")), func


def test_diff_text_file_passes_on_the_same_lines_only(tmp_path: Path) -> None:
    write(tmp_path, "gold.js", "a\nb\n")
    write(tmp_path, "same.js", "a\r\nb")
    write(tmp_path, "other.js", "a\nc\n")
    assert judge(tmp_path, "diff_text_file", vm_file(tmp_path / "same.js"), embedded(tmp_path / "gold.js"))
    assert not judge(tmp_path, "diff_text_file", vm_file(tmp_path / "other.js"), embedded(tmp_path / "gold.js"))


def test_python_pure_text_and_result_files(tmp_path: Path) -> None:
    write(tmp_path, "gold.py", "def f(x):\n    return x\n")
    # OSWorld's normalisation: an opening shebang or coding line, blank lines, tabs (4 columns) and trailing
    # blanks do not count; the spacing inside a line does
    write(tmp_path, "mine.py", "#!/usr/bin/env python3\n# -*- coding: utf-8 -*-\ndef f(x):\n\n\treturn x   \n\n")
    write(tmp_path, "respaced.py", "def f(x):\n  return   x")
    write(tmp_path, "wrong.py", "def f(y):\n    return y\n")
    assert judge(tmp_path, "compare_python_pure_text", vm_file(tmp_path / "mine.py"), embedded(tmp_path / "gold.py"))
    for other in ("respaced.py", "wrong.py"):
        assert not judge(tmp_path, "compare_python_pure_text", vm_file(tmp_path / other),
                         embedded(tmp_path / "gold.py")), other
    write(tmp_path, "gold.txt", "42.5\n")
    for mine, ok in (("The answer is 42.5", True), ("42.50001", True), ("42.6", False), ("forty", False)):
        write(tmp_path, "r.txt", mine)
        got = judge(tmp_path, "compare_result_files", vm_file(tmp_path / "r.txt"), embedded(tmp_path / "gold.txt"))
        assert got is ok, mine


def test_file_contains_line_number_check_list(tmp_path: Path) -> None:
    write(tmp_path, "sar.txt", "12:00:01 CPU %user\n12:00:02 all 1.0\nno time here\n")
    assert judge(tmp_path, "file_contains", vm_file(tmp_path / "sar.txt"), rule(expected=["CPU", "%user"]))
    assert not judge(tmp_path, "file_contains", vm_file(tmp_path / "sar.txt"), rule(expected=["CPU", "%idle"]))
    assert judge(tmp_path, "check_line_number", vm_file(tmp_path / "sar.txt"), rule(expected="2"))
    assert not judge(tmp_path, "check_line_number", vm_file(tmp_path / "sar.txt"), rule(expected="3"))
    assert not judge(tmp_path, "check_line_number", vm_file(tmp_path / "none.txt"), rule(expected="2"))
    write(tmp_path, "list.txt", "openjdk-17-jre\nvim\n")
    assert judge(tmp_path, "check_list", vm_file(tmp_path / "list.txt"), rule(expect=[r"openjdk-\d+-(jre|jdk)"]))
    assert not judge(tmp_path, "check_list", vm_file(tmp_path / "list.txt"), rule(expect=["emacs"]))
    assert not judge(tmp_path, "check_list", vm_file(tmp_path / "list.txt"), rule(unexpect=[".+"]))
    write(tmp_path, "empty.txt", "")
    assert judge(tmp_path, "check_list", vm_file(tmp_path / "empty.txt"), rule(unexpect=[".+"]))


def test_check_csv(tmp_path: Path) -> None:
    write(tmp_path, "logins.csv", "url,user,password\nimap://a,me,pw\nsmtp://b,me,pw\n")
    r = vm_file(tmp_path / "logins.csv")
    assert judge(tmp_path, "check_csv", r, rule(expect=[{"url": "imap://a", "user": "me"}, {"url": "smtp://b"}]))
    assert not judge(tmp_path, "check_csv", r, rule(expect=[{"url": "imap://c"}]))
    assert not judge(tmp_path, "check_csv", r, rule(unexpect=[{"url": "imap://a", "user": "me"}]))
    assert judge(tmp_path, "check_csv", r, rule(unexpect=[{"url": "imap://a", "user": "you"}]))


def test_check_json_settings(tmp_path: Path) -> None:
    write(tmp_path, "settings.json", json.dumps({"editor.wordWrapColumn": 50, "other": 1}))
    write(tmp_path, "broken.json", "{ not json")
    want = rule(expected={"editor.wordWrapColumn": 50})
    assert judge(tmp_path, "check_json_settings", vm_file(tmp_path / "settings.json"), want)
    assert not judge(tmp_path, "check_json_settings", vm_file(tmp_path / "settings.json"),
                     rule(expected={"editor.wordWrapColumn": 80}))
    assert not judge(tmp_path, "check_json_settings", vm_file(tmp_path / "broken.json"), want)
    assert not judge(tmp_path, "check_json_settings", vm_file(tmp_path / "none.json"), want)


def test_check_json_with_value_rules(tmp_path: Path) -> None:
    write(tmp_path, "manifest.json", json.dumps({"name": "happy-extension", "version": "0.0.1",
                                                  "ui": {"mode": "smart folders"}, "size": 3}))
    r = vm_file(tmp_path / "manifest.json")
    assert judge(tmp_path, "check_json", r, rule(expect=[
        {"key": ["name"], "method": "eq", "ref": "happy-extension"},
        {"key": ["ui", "mode"], "method": "re", "ref": r"\bsmart\b"},
        {"key": ["size"], "method": "approx:0.5", "ref": 3.2},
        {"key": ["size"], "method": "range.te", "ref": [2, 3]}]))
    assert not judge(tmp_path, "check_json", r, rule(expect=[{"key": ["name"], "method": "eq", "ref": "sad"}]))
    assert not judge(tmp_path, "check_json", r, rule(expect=[{"key": ["absent"], "method": "eq", "ref": 1}]))
    assert not judge(tmp_path, "check_json", r, rule(unexpect=[{"key": ["version"], "method": "eq", "ref": "0.0.1"}]))
    assert judge(tmp_path, "check_json", r, rule(unexpect=[{"key": ["absent"], "method": "eq", "ref": 1}]))
    write(tmp_path, "a.yaml", "name: Test Account\nauthor:\n  name: Test Account\n")
    y = vm_file(tmp_path / "a.yaml")
    assert judge(tmp_path, "check_json", y, rule(expect=[{"key": ["author", "name"], "method": "eq",
                                                          "ref": "Test Account"}]), is_yaml=True)
    assert not judge(tmp_path, "check_json", y, rule(expect=[{"key": ["author", "name"], "method": "eq",
                                                              "ref": "Other"}]), is_yaml=True)


def test_check_direct_json_object(tmp_path: Path) -> None:
    want = rule(expected={"from": "NYC", "to": "CMH"})
    assert judge(tmp_path, "check_direct_json_object", {"type": "rule", "rules": {"from": "NYC", "to": "CMH", "x": 1}},
                 want)
    assert not judge(tmp_path, "check_direct_json_object", {"type": "rule", "rules": {"from": "NYC"}}, want)
    # a text: single quotes read as double, as OSWorld reads it
    assert judge(tmp_path, "check_direct_json_object", text_getter(" {'from': 'NYC', 'to': 'CMH'} "), want)
    assert not judge(tmp_path, "check_direct_json_object", text_getter("not json"), want)
    assert not judge(tmp_path, "check_direct_json_object", {"type": "vm_command_line", "command": ["/none"]}, want)
    inside = rule(expected={"name": "Dell", "tags": ["a", "b"]}, expect_in_result=True)
    assert judge(tmp_path, "check_direct_json_object", {"type": "rule", "rules": {"name": "Dell XPS", "tags": ["b"]}},
                 inside)
    assert not judge(tmp_path, "check_direct_json_object", {"type": "rule", "rules": {"name": "HP", "tags": ["b"]}},
                     inside)
    assert not judge(tmp_path, "check_direct_json_object",
                     {"type": "rule", "rules": {"name": "Dell", "tags": ["c"]}}, inside)


def test_run_sqlite3(tmp_path: Path) -> None:
    db = tmp_path / "global-messages-db.sqlite"
    with sqlite3.connect(db) as c:
        c.execute("create table m (folder int, flagged int)")
        c.execute("insert into m values (13, 1)")
    c.close()
    q = rule(sql="select sum(1) > 0 from m where folder = 13 and flagged = 1")
    assert judge(tmp_path, "run_sqlite3", vm_file(db), q)
    assert not judge(tmp_path, "run_sqlite3", vm_file(db), rule(sql="select sum(1) > 0 from m where folder = 14"))
    write(tmp_path, "junk.sqlite", "this is not a database" * 100)
    assert not judge(tmp_path, "run_sqlite3", vm_file(tmp_path / "junk.sqlite"), q)
    assert not judge(tmp_path, "run_sqlite3", vm_file(tmp_path / "none.sqlite"), q)


def test_is_utc_0_clipboard_favourites(tmp_path: Path) -> None:
    out = ("               Local time: Thu 2024-01-25 12:56:06 GMT\n           Universal time: Thu 2024-01-25\n"
           "                 RTC time: Thu 2024-01-25\n                Time zone: Etc/UTC (UTC, {})\n")
    assert judge(tmp_path, "is_utc_0", text_getter(out.format("+0000")), None)
    assert not judge(tmp_path, "is_utc_0", text_getter(out.format("+0100")), None)
    assert not judge(tmp_path, "is_utc_0", text_getter("short"), None)
    assert judge(tmp_path, "is_in_vm_clickboard", rule(expected=["a", "b"]), text_getter("b and a"))
    assert not judge(tmp_path, "is_in_vm_clickboard", rule(expected="c"), text_getter("b and a"))
    fav = rule(expected=["google-chrome.desktop", "thunderbird.desktop"])
    both = text_getter("['thunderbird.desktop', 'google-chrome.desktop']\n")
    assert judge(tmp_path, "check_gnome_favorite_apps", both, fav)
    assert not judge(tmp_path, "check_gnome_favorite_apps", text_getter("['thunderbird.desktop']"), fav)
    assert not judge(tmp_path, "check_gnome_favorite_apps", text_getter("@as []"), fav)
    assert not judge(tmp_path, "check_gnome_favorite_apps", text_getter("garbage["), fav)


def test_compare_config(tmp_path: Path) -> None:
    write(tmp_path, "s.json", '{"workbench.colorTheme": "Visual Studio Dark"}\n')
    assert judge(tmp_path, "compare_config", vm_file(tmp_path / "s.json"),
                 rule(expected='{"workbench.colorTheme": "Visual Studio Dark"}\n'))
    assert not judge(tmp_path, "compare_config", vm_file(tmp_path / "s.json"), rule(expected="{}"))


def _zip(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, content in files.items():
            z.writestr(name, content)
    return path


def test_compare_zip_files_and_archive(tmp_path: Path) -> None:
    gold = _zip(tmp_path / "gold.zip", {"a.txt": "A\n", "b.txt": "B\n"})
    same = _zip(tmp_path / "same.zip", {"b.txt": "B\n", "a.txt": "A\n"})
    other = _zip(tmp_path / "other.zip", {"a.txt": "A\n", "b.txt": "C\n"})
    fewer = _zip(tmp_path / "fewer.zip", {"a.txt": "A\n"})
    write(tmp_path, "broken.zip", "no zip")
    for func in ("compare_zip_files", "compare_archive"):
        assert judge(tmp_path, func, vm_file(same), embedded(gold)), func
        assert not judge(tmp_path, func, vm_file(other), embedded(gold)), func
        assert not judge(tmp_path, func, vm_file(fewer), embedded(gold)), func
        assert not judge(tmp_path, func, vm_file(tmp_path / "broken.zip"), embedded(gold)), func
        assert not judge(tmp_path, func, vm_file(tmp_path / "none.zip"), embedded(gold)), func


def test_compare_archive_under_a_folder(tmp_path: Path) -> None:
    gold = _zip(tmp_path / "gold.zip", {"slides/a.txt": "A\n", "readme": "x"})
    same = _zip(tmp_path / "same.zip", {"slides/a.txt": "A\n", "readme": "y"})
    other = _zip(tmp_path / "other.zip", {"slides/a.txt": "B\n"})
    elsewhere = _zip(tmp_path / "elsewhere.zip", {"a.txt": "A\n"})
    assert judge(tmp_path, "compare_archive", vm_file(same), embedded(gold), file_path="slides")
    assert not judge(tmp_path, "compare_archive", vm_file(other), embedded(gold), file_path="slides")
    assert not judge(tmp_path, "compare_archive", vm_file(elsewhere), embedded(gold), file_path="slides")


def test_compare_archive_unknown_file_type_is_no_verdict(tmp_path: Path) -> None:
    gold = _zip(tmp_path / "gold.zip", {"a.txt": "A\n"})
    assert "file_type" in crash(check(metric("compare_archive", vm_file(gold), embedded(gold), file_type="movie")),
                                tmp_path)


def test_text_enlarged(tmp_path: Path) -> None:
    assert judge(tmp_path, "check_text_enlarged", text_getter("1.25\n"), None)
    assert not judge(tmp_path, "check_text_enlarged", text_getter("1.0\n"), None)
    assert not judge(tmp_path, "check_text_enlarged", text_getter("no such key\n"), None)


def test_speedtest_time(tmp_path: Path) -> None:
    from datetime import datetime, timedelta

    def export(at: datetime, quote: str = "") -> Path:
        return write(tmp_path, "speed.csv", f"Server,Date,Download\nX,{quote}{at:%m/%d/%Y %H:%M}{quote},90\n")

    window = {"type": "time_diff_range", "diff_range_in_minutes": "60"}
    now = datetime.now()
    assert judge(tmp_path, "compare_time_in_speedtest_results", vm_file(export(now)), window)
    # three hours off, as a time of day (OSWorld compares times of day): 3 or 21 hours apart
    assert not judge(tmp_path, "compare_time_in_speedtest_results", vm_file(export(now - timedelta(hours=3))), window)
    # desktop-env reads the column's last five characters as they stand: a quoted date is no time there
    assert not judge(tmp_path, "compare_time_in_speedtest_results", vm_file(export(now, '"')), window)
    write(tmp_path, "empty.csv", "Server,Date\n")
    assert not judge(tmp_path, "compare_time_in_speedtest_results", vm_file(tmp_path / "empty.csv"), window)
