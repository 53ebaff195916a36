"""The files, commands and desktop getters (gh_osworld/getters/files.py, commands.py, desktop.py), each
through a metric as a check uses it, on the guest's Python."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest

from .kit import check, crash, embedded, make, metric, rule, verdict, vm_file


def command(cmd: str | list[str], *, shell: bool = False, kind: str = "vm_command_line") -> dict:
    return {"type": kind, "command": cmd, "shell": shell}


def test_vm_file_gives_the_guest_path_and_none_when_missing(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello\n")
    (tmp_path / "gold.txt").write_text("hello\n")
    assert verdict(check(metric("compare_text_file", vm_file(tmp_path / "a.txt"), embedded(tmp_path / "gold.txt"))),
                   tmp_path) is True
    assert verdict(check(metric("compare_text_file", vm_file(tmp_path / "gone.txt"),
                                embedded(tmp_path / "gold.txt"))), tmp_path) is False
    # a directory where the file should be is no file
    (tmp_path / "dir.txt").mkdir()
    assert verdict(check(metric("compare_text_file", vm_file(tmp_path / "dir.txt"),
                                embedded(tmp_path / "gold.txt"))), tmp_path) is False


def test_vm_file_multi_gives_the_chosen_paths(tmp_path: Path) -> None:
    (tmp_path / "one.txt").write_text("one")
    (tmp_path / "two.txt").write_text("two")
    (tmp_path / "gold.txt").write_text("two")
    multi = {"type": "vm_file", "multi": True, "path": [str(tmp_path / "one.txt"), str(tmp_path / "two.txt")],
             "dest": ["one.txt", "two.txt"], "gives": [1]}
    assert verdict(check(metric("compare_text_file", multi, embedded(tmp_path / "gold.txt"))), tmp_path) is True
    multi["gives"] = [0]
    assert verdict(check(metric("compare_text_file", multi, embedded(tmp_path / "gold.txt"))), tmp_path) is False


def test_vm_file_time_suffix_names_today(tmp_path: Path) -> None:
    today = date.today().strftime("%Y_%m_%d")
    (tmp_path / f"export{today}.txt").write_text("x")
    (tmp_path / "gold.txt").write_text("x")
    spec = {"type": "vm_file", "path": str(tmp_path / "export.txt"), "dest": "export.txt", "time_suffix": True}
    assert verdict(check(metric("compare_text_file", spec, embedded(tmp_path / "gold.txt"))), tmp_path) is True


def test_embedded_file_missing_is_our_crash(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x")
    err = crash(check(metric("compare_text_file", vm_file(tmp_path / "a.txt"), embedded(tmp_path / "nope.txt"))),
                tmp_path)
    assert "embedded file" in err


def test_embedded_file_multi(tmp_path: Path) -> None:
    (tmp_path / "g0.txt").write_text("zero")
    (tmp_path / "g1.txt").write_text("one")
    (tmp_path / "a.txt").write_text("one")
    gold = {"type": "embedded_file", "multi": True, "paths": [str(tmp_path / "g0.txt"), str(tmp_path / "g1.txt")],
            "gives": [1]}
    assert verdict(check(metric("compare_text_file", vm_file(tmp_path / "a.txt"), gold)), tmp_path) is True


def test_command_output_is_text_with_universal_newlines(tmp_path: Path) -> None:
    # printf's \r\n reaches the metric as \n, as OSWorld's server decodes it
    spec = command("printf 'a\\r\\nb\\n'", shell=True)
    assert verdict(check(metric("exact_match", spec, rule(expected="a\nb\n"))), tmp_path) is True
    assert verdict(check(metric("exact_match", spec, rule(expected="a\r\nb\n"))), tmp_path) is False
    # a string without shell is split as a shell would; ~/ is expanded
    assert verdict(check(metric("exact_match", command("echo 'two words'"), rule(expected="two words\n"))),
                   tmp_path) is True
    assert verdict(check(metric("exact_match", command(["echo", "~/x"]), rule(expected=str(Path.home() / "x") + "\n"))),
                   tmp_path) is True


def test_command_error_and_a_command_that_cannot_start(tmp_path: Path) -> None:
    err = command(["python3", "-c", "import no_such_module_here"], kind="vm_command_error")
    assert verdict(check(metric("check_include_exclude", err, rule(include=["ModuleNotFoundError"]))), tmp_path)
    assert not verdict(check(metric("check_include_exclude", err, rule(exclude=["Error"]))), tmp_path)
    # a program that is not there gives None: the metric fails, no crash
    assert verdict(check(metric("check_include_exclude", command(["/no/such/program"]), rule(include=[]))),
                   tmp_path) is False


def _relative(snippet: str, tmp_path: Path) -> dict:
    out = tmp_path / "out.json"
    make("from datetime import datetime\nfrom gh_osworld.getters.commands import relative_day, format_day, "
         "rule_relative_time\n" + snippet + "\nopen(out, 'w').write(json.dumps(r))", tmp_path, out=str(out))
    return json.loads(out.read_text())


@pytest.mark.parametrize(("now", "name", "other", "day"), [
    ("2024-01-31", "tomorrow", None, "2024-02-01"),
    ("2024-12-20", "5th next month", None, "2025-01-05"),
    ("2024-01-17", "next Monday", None, "2024-01-22"),      # a Wednesday
    ("2024-01-21", "next Monday", None, "2024-01-22"),      # a Sunday: the day after
    ("2024-01-17", "this Saturday", None, "2024-01-20"),
    ("2024-01-17", "this Sunday", None, "2024-01-21"),
    ("2024-01-17", "next Friday", None, "2024-01-19"),      # before Friday: this week's
    ("2024-01-17", "next Friday", "next Monday", "2024-01-26"),
    ("2024-01-19", "next Friday", None, "2024-01-26"),      # on a Friday: a week on
    ("2024-01-17", "first monday four months later", None, "2024-05-06"),
    ("2024-09-10", "first monday four months later", None, "2025-01-06"),
])
def test_relative_days(now: str, name: str, other: str | None, day: str, tmp_path: Path) -> None:
    r = _relative(f"r = relative_day({name!r}, datetime.fromisoformat({now!r}), other={other!r})"
                  ".date().isoformat()", tmp_path)
    assert r == day


def test_rule_relative_time_writes_the_dates_in(tmp_path: Path) -> None:
    r = _relative("r = rule_relative_time({'type': 'rule_relativeTime', 'rules': {'relativeTime': "
                  "{'from': 'next Monday', 'to': 'next Friday'}, "
                  "'expected': {'from': '{DoW}, {DayD} {Month} {Year}', 'to': "
                  "'{Year}-{Month0D}-{Day0D} {MonthFull} {month}', 'city': 'Paris'}}}, "
                  "now=datetime(2024, 1, 3))", tmp_path)
    assert r["expected"] == {"from": "Mon, 8 Jan 2024", "to": "2024-01-12 January january", "city": "Paris"}


def test_rule_relative_time_through_a_check(tmp_path: Path) -> None:
    """The whole path: the rule written for today and check_direct_json_object judging a result for today."""
    today = date.today()
    spec = {"type": "rule_relativeTime", "rules": {"relativeTime": {"from": "this month"},
                                                   "expected": {"stop": "NYC", "time": "{Year}-{Month0D}"}}}
    right = {"stop": "NYC", "time": f"{today.year}-{today.month:02d}"}
    wrong = {"stop": "NYC", "time": f"{today.year - 1}-{today.month:02d}"}
    for result, want in ((right, True), (wrong, False)):
        (tmp_path / "r.json").write_text(json.dumps(result))
        got = command(["cat", str(tmp_path / "r.json")])
        assert verdict(check(metric("check_direct_json_object", got, spec)), tmp_path) is want


def test_list_directory_and_check_moved_jpgs(tmp_path: Path) -> None:
    d = tmp_path / "pics"
    d.mkdir()
    for n in ("a.jpg", "b.jpg"):
        (d / n).write_bytes(b"")
    listing = {"type": "list_directory", "path": str(d)}
    assert verdict(check(metric("check_moved_jpgs", listing, rule(expected=["b.jpg", "a.jpg"]))), tmp_path) is True
    assert verdict(check(metric("check_moved_jpgs", listing, rule(expected=["a.jpg"]))), tmp_path) is False
    gone = {"type": "list_directory", "path": str(tmp_path / "none")}
    assert verdict(check(metric("check_moved_jpgs", gone, rule(expected=["a.jpg"]))), tmp_path) is False


def test_content_from_vm_file_last_row(tmp_path: Path) -> None:
    make("import openpyxl\nwb = openpyxl.Workbook(); ws = wb.active\nws.append(['name', 'n'])\n"
         "ws.append(['Ada', 1]); ws.append(['Yann', 7])\nwb.save(path)", tmp_path, path=str(tmp_path / "r.xlsx"))
    spec = {"type": "content_from_vm_file", "path": str(tmp_path / "r.xlsx"), "file_type": "xlsx",
            "file_content": "last_row"}
    expected = rule()  # literal_match takes the expected value itself: a rule getter gives it
    expected["rules"] = ["yann", "7"]
    assert verdict(check(metric("literal_match", spec, expected, type="list", ignore_case=True)), tmp_path) is True
    expected["rules"] = ["Ada", "1"]
    assert verdict(check(metric("literal_match", spec, expected, type="list", ignore_case=True)), tmp_path) is False
    (tmp_path / "bad.xlsx").write_text("not a workbook")
    spec["path"] = str(tmp_path / "bad.xlsx")
    assert verdict(check(metric("literal_match", spec, expected, type="list")), tmp_path) is False
