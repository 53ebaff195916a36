"""Text, lists, JSON and plain files: OSWorld's general metrics.

Each takes (result, expected, **options) as evaluate.py hands them: `result` what the result getter
gave (a text, a path, a dict, None when there was nothing), `expected` what the expected getter gave
(usually a rule: a dict with "expected", "include", "expect", ...).
"""

from __future__ import annotations

import ast
import csv
import io
import json
import os
import re
import shutil
import sqlite3
import tempfile
import zipfile
from datetime import datetime
from difflib import SequenceMatcher
from typing import Any

from gh_osworld import registry
from gh_osworld.matching import matches_record, matches_rule
from gh_osworld.metrics.pdf import pdf_bytes_text
from gh_osworld.metrics.similarity import ratio
from gh_osworld.outcome import Fail
from gh_osworld.reading import Embedded, agent_json, agent_text, is_ours, ours_text, query_copy
from gh_osworld.registry import metric
from gh_osworld.spec import SpecError


@metric("exact_match")
def exact_match(result: Any, rules: dict[str, Any]) -> float:
    """The value equals rules["expected"] exactly (a command's text with its newlines, as the getter gives it)."""
    return float(result is not None and result == rules["expected"])


@metric("fuzzy_match")
def fuzzy_match(result: Any, rules: dict[str, Any]) -> float:
    """The two strings' similarity (rapidfuzz's ratio, similarity.py); no result scores 0."""
    if result is None:
        return 0.0
    return ratio(str(result), str(rules["expected"])) / 100.0


@metric("is_in_list")
def is_in_list(result: Any, rules: dict[str, Any]) -> float:
    """rules["expected"] is in the result (an item of a list, or a part of a text)."""
    if result is None:
        return 0.0
    try:
        return float(rules["expected"] in result)
    except TypeError:
        return 0.0


@metric("check_include_exclude")
def check_include_exclude(result: str | None, rules: dict[str, Any]) -> float:
    """Every "include" string is in the text and no "exclude" string is."""
    if result is None:
        return 0.0
    return float(all(s in result for s in rules.get("include", []))
                 and not any(s in result for s in rules.get("exclude", [])))


@metric("literal_match")
def literal_match(result: Any, expected: Any, **options: Any) -> float:
    """`type: str` (default): the two as text are equal; `type: list`: two lists of the same length whose
    items as text are equal in order. `ignore_case` compares lowercased."""
    kind = options.get("type", "str")
    fold = (lambda s: str(s).lower()) if options.get("ignore_case", False) else str
    if kind == "str":
        return float(fold(result) == fold(expected))
    if kind == "list":
        if not isinstance(result, list | tuple) or not isinstance(expected, list | tuple):
            return 0.0
        return float(len(result) == len(expected) and [fold(s) for s in result] == [fold(s) for s in expected])
    raise SpecError(f"literal_match: type {kind!r} is not known")


def _blank_folded(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[\t\n]", " ", text).strip())


@metric("compare_text_file")
def compare_text_file(result: str | None, expected: str, **options: Any) -> float:
    """The two files' texts are equal; `ignore_blanks` folds every run of blanks to one space and trims,
    `ignore_case` compares lowercased."""
    if not result:
        return 0.0
    mine, gold = agent_text(result), ours_text(expected)
    if options.get("ignore_blanks", False):
        mine, gold = _blank_folded(mine), _blank_folded(gold)
    if options.get("ignore_case", False):
        mine, gold = mine.lower(), gold.lower()
    return float(mine == gold)


@metric("diff_text_file")
def diff_text_file(result: str | None, expected: str) -> float:
    """OSWorld scores the lines' similarity; the full score is the same lines."""
    if result is None:
        return 0.0
    mine, gold = agent_text(result).splitlines(), ours_text(expected).splitlines()
    return SequenceMatcher(a=mine, b=gold).ratio() if mine != gold else 1.0


@metric("compare_config")
def compare_config(result: str | None, rules: dict[str, Any]) -> float:
    """The file's text is rules["expected"]."""
    if not result:
        return 0.0
    return float(agent_text(result) == rules["expected"])


@metric("compare_python_pure_text")
def compare_python_pure_text(result: str | None, expected: str | None) -> float:
    """The two sources are equal as OSWorld normalises them (_python_lines)."""
    if not result or not expected:
        return 0.0
    return float(_python_lines(agent_text(result)) == _python_lines(ours_text(expected)))


_PYTHON_HEADER = ("#!", "# -*- coding:", "# coding:", "# coding=")


def _python_lines(text: str) -> list[str]:
    """A source's lines without the shebang and coding lines that open it (among its first three), without
    blank lines, tabs expanded to 4 columns and trailing blanks cut."""
    lines = text.splitlines()
    start = 0
    while start < min(3, len(lines)) and lines[start].strip().startswith(_PYTHON_HEADER):
        start += 1
    return [line.expandtabs(4).rstrip() for line in lines[start:] if line.strip()]


@metric("compare_result_files")
def compare_result_files(result: str | None, expected: str | None) -> float:
    """The answer file matches the gold one: when the gold is a number, the answer contains it or is a
    number within 1e-4 of it; else the two trimmed texts are equal."""
    if not result or not expected:
        return 0.0
    mine, gold = agent_text(result).strip(), ours_text(expected).strip()
    try:
        gold_number = float(gold)
    except ValueError:
        return float(mine == gold)
    if gold in mine:
        return 1.0
    try:
        return float(abs(float(mine) - gold_number) < 1e-4)
    except ValueError:
        return 0.0


@metric("file_contains")
def file_contains(result: str | None, rules: dict[str, Any]) -> float:
    """Every string of rules["expected"] is in the file's text."""
    if not result:
        return 0.0
    text = agent_text(result)
    return float(all(s in text for s in rules["expected"]))


_CLOCK_TIME = re.compile(r"([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)")  # a leap second's :60 counts


@metric("check_line_number")
def check_line_number(result: str | None, rules: dict[str, Any]) -> float:
    """The file has rules["expected"] lines that hold a clock time HH:MM:SS (lines as a text file's, split
    at newlines only)."""
    if result is None or not os.path.isfile(result):
        return 0.0
    lines = agent_text(result).split("\n")
    return float(sum(1 for line in lines if _CLOCK_TIME.search(line)) == int(rules["expected"]))


@metric("check_list")
def check_list(result: str | None, rules: dict[str, Any]) -> float:
    """Every "expect" pattern is found on some line of the file and no "unexpect" pattern on any."""
    if result is None:
        return 0.0
    lines = agent_text(result).splitlines()
    expect = [re.compile(p) for p in rules.get("expect", [])]
    unexpect = [re.compile(p) for p in rules.get("unexpect", [])]
    return float(all(any(p.search(line) for line in lines) for p in expect)
                 and not any(p.search(line) for p in unexpect for line in lines))


@metric("check_csv")
def check_csv(result: str | None, rules: dict[str, Any]) -> float:
    """A CSV file with a header: every "expect" record matches some row, no "unexpect" record matches any."""
    if result is None:
        return 0.0
    rows = list(csv.DictReader(io.StringIO(agent_text(result))))
    return float(all(any(matches_record(p, r) for r in rows) for p in rules.get("expect", []))
                 and not any(matches_record(p, r) for p in rules.get("unexpect", []) for r in rows))


@metric("check_json_settings")
def check_json_settings(result: str | None, rules: dict[str, Any]) -> float:
    """The JSON object holds every key of rules["expected"] with that value (at the top level)."""
    if not result:
        return 0.0
    data = agent_json(result)
    if not isinstance(data, dict):
        return 0.0
    return float(all(k in data and data[k] == v for k, v in rules["expected"].items()))


def _load_yaml(path: str) -> Any:
    import yaml  # Debian's python3-yaml; only the yaml form of check_json needs it

    text = agent_text(path)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise Fail(f"{path} is not YAML: {e}") from None


def _at(data: Any, keys: list[Any]) -> tuple[bool, Any]:
    for k in keys:
        try:
            data = data[k]
        except (KeyError, IndexError, TypeError):
            return False, None
    return True, data


@metric("check_json")
def check_json(result: str | None, rules: dict[str, Any], **options: Any) -> float:
    """The file (JSON, or YAML with `is_yaml`) holds, at each "expect" rule's key path, a value matching
    the rule (matching.py), and at no "unexpect" key path one that matches (an absent key is None)."""
    if result is None:
        return 0.0
    data = _load_yaml(result) if options.get("is_yaml", False) else agent_json(result)
    for r in rules.get("expect", []):
        found, value = _at(data, r["key"])
        if not found or not matches_rule(value, r):
            return 0.0
    for r in rules.get("unexpect", []):
        _, value = _at(data, r["key"])
        if matches_rule(value, r):
            return 0.0
    return 1.0


@metric("check_direct_json_object")
def check_direct_json_object(result: Any, rules: dict[str, Any]) -> float:
    """The result object (a dict, or its text with single quotes read as double) has each key of
    rules["expected"] with an equal value; with rules["expect_in_result"], an expected string is a part of
    the result's value and an expected list has an item that is in the result's list. (rule_relativeTime's
    dates arrive already written into rules["expected"].)"""
    if isinstance(result, str):
        try:
            result = json.loads(result.strip().replace("'", '"'))
        except ValueError:
            raise Fail("the result is not a JSON object") from None
    if not isinstance(result, dict):
        return 0.0
    expected = rules["expected"]
    if not rules.get("expect_in_result", False):
        return float(all(result.get(k) == v for k, v in expected.items()))
    for key, want in expected.items():
        got = result.get(key)
        if isinstance(want, list):
            if not isinstance(got, list) or not any(w in got for w in want):
                return 0.0
        elif isinstance(want, str):
            if not isinstance(got, str | list | dict) or want not in got:
                return 0.0
        else:
            return 0.0
    return 1.0


@metric("run_sqlite3")
def run_sqlite3(result: str | None, rules: dict[str, Any]) -> float:
    """The task's SQL query on the agent's database; its first column of the first row is the score."""
    if result is None:
        return 0.0
    try:
        found = query_copy(result, rules["sql"], rows=1)
    except (OSError, sqlite3.DatabaseError) as e:
        raise Fail(f"the database {result} cannot be queried: {e}") from None
    row = found[0] if found else None
    return float(row[0] or 0) if row else 0.0


@metric("is_utc_0")
def is_utc_0(result: str | None, expected: Any = None) -> float:
    """`timedatectl` output: its time zone line (the fourth) ends with an offset of +0000."""
    if result is None:
        return 0.0
    lines = result.split("\n")
    return float(len(lines) > 3 and lines[3].endswith("+0000)"))


@metric("is_in_vm_clickboard")
def is_in_vm_clickboard(rules: dict[str, Any], clipboard: str | None) -> float:
    """The clipboard's text (the expected getter: `xsel --clipboard --output`) holds rules["expected"]
    (a string, or every string of a list)."""
    if clipboard is None:
        return 0.0
    want = rules["expected"]
    return float(all(s in clipboard for s in want) if isinstance(want, list) else want in clipboard)


@metric("check_gnome_favorite_apps")
def check_gnome_favorite_apps(result: str | None, rules: dict[str, Any]) -> float:
    """`gsettings get org.gnome.shell favorite-apps` names exactly the expected apps, in any order."""
    if result is None:
        return 0.0
    text = result.strip()
    if text.startswith("@as "):  # gsettings' typed empty list
        text = text[4:]
    try:
        apps = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise Fail(f"the favourite apps are not a list: {result[:200]!r}") from None
    want = rules["expected"]
    return float(isinstance(apps, list) and len(apps) == len(want) and set(apps) == set(want))


@metric("check_moved_jpgs")
def check_moved_jpgs(result: dict[str, Any] | None, rules: dict[str, Any]) -> float:
    """The directory (list_directory's tree) holds exactly the expected names."""
    if not result or "children" not in result:
        return 0.0
    names = [node["name"] for node in result["children"]]
    want = rules["expected"]
    return float(len(names) == len(want) and set(names) == set(want))


# Archives: unpacked to a scratch directory, the names compared, then each pair of files by the metric the
# `file_type` option names (a metric of this package, looked up when it runs).
_ARCHIVE_FILE_METRIC = {"text": "compare_text_file", "pdf": "compare_pdfs", "docx": "compare_docx_files",
                        "ppt": "compare_pptx_files", "image": "compare_images", "csv": "compare_csv",
                        "table": "compare_table", "audio": "compare_audios", "video": "compare_videos"}


def _unpack(archive: str, into: str, *, ours: bool) -> None:
    try:
        shutil.unpack_archive(archive, into)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, shutil.ReadError) as e:
        if ours:
            raise
        raise Fail(f"the archive {archive} cannot be unpacked: {e}") from None


@metric("compare_archive")
def compare_archive(result: str | None, expected: str, **options: Any) -> float:
    """The two archives hold the same names (under `file_path` inside them), and each pair of files passes
    the metric of `file_type` (text by default) with the remaining options."""
    if not result:
        return 0.0
    options = dict(options)
    inner = options.pop("file_path", "")
    kind = options.pop("file_type", "text")
    name = _ARCHIVE_FILE_METRIC.get(kind)
    if name is None:
        raise SpecError(f"compare_archive: file_type {kind!r} is not known")
    compare = registry.METRICS.get(name)
    if compare is None:
        raise SpecError(f"compare_archive: {name} (file_type {kind}) is not implemented here")
    with tempfile.TemporaryDirectory() as scratch:
        mine, gold = os.path.join(scratch, "result"), os.path.join(scratch, "expected")
        _unpack(result, mine, ours=False)
        _unpack(expected, gold, ours=True)
        try:
            mine_names = sorted(os.listdir(os.path.join(mine, inner)))
        except OSError:
            return 0.0
        gold_names = sorted(os.listdir(os.path.join(gold, inner)))
        if mine_names != gold_names:
            return 0.0
        # the gold archive's members are ours when the archive is (reading.py: whose fault)
        as_gold = Embedded if is_ours(expected) else str
        scores = [float(compare(os.path.join(mine, inner, n), as_gold(os.path.join(gold, inner, n)), **options))
                  for n in mine_names]
    return sum(scores) / len(scores) if scores else 1.0


def _similar_pdfs(a: bytes, b: bytes) -> bool:
    """Two PDFs whose texts are at least 95% alike (an agent's member that is no PDF is not)."""
    try:
        mine = pdf_bytes_text(a, ours=False)
    except Fail:
        return False
    return SequenceMatcher(None, mine, pdf_bytes_text(b, ours=True)).ratio() >= 0.95


@metric("compare_zip_files")
def compare_zip_files(result: str | None, expected: str) -> float:
    """The two zip files hold the same names with the same bytes, a PDF counting as the same when its text
    is at least 95% similar."""
    if not result:
        return 0.0
    try:
        mine = zipfile.ZipFile(result)
    except (OSError, zipfile.BadZipFile) as e:
        raise Fail(f"{result} is not a zip file: {e}") from None
    with mine, zipfile.ZipFile(expected) as gold:
        names = set(mine.namelist())
        if names != set(gold.namelist()):
            return 0.0
        for name in names:
            try:
                a = mine.read(name)
            except (OSError, zipfile.BadZipFile, ValueError) as e:
                raise Fail(f"{result}: {name} cannot be read: {e}") from None
            b = gold.read(name)
            if a == b:
                continue
            if not name.lower().endswith(".pdf") or not _similar_pdfs(a, b):
                return 0.0
    return 1.0


@metric("check_text_enlarged")
def check_text_enlarged(result: str | None, expected: Any = None) -> float:
    """The text scaling factor (`gsettings get org.gnome.desktop.interface text-scaling-factor`) is above 1."""
    try:
        return float(result is not None and float(result.strip()) > 1.0)
    except ValueError:
        return 0.0


@metric("compare_time_in_speedtest_results")
def compare_time_in_speedtest_results(result: str | None, minutes: Any) -> float:
    """The speed test export's first result (its second line, second column, ending HH:MM) was taken less
    than `minutes` (time_diff_range) from the time of day now.

    As desktop-env 1.0.2 reads it, to the character: the column's last five characters as they stand in
    the line, so a quoted date (`"12/06/2026 18:21"`) or one ending the line (its newline is in them)
    reads as no time, and scores 0 (docs/osworld.md, "Scores")."""
    if not result:
        return 0.0
    lines = list(io.StringIO(agent_text(result), newline=None))  # lines as a text file gives them: "\n" kept
    try:
        taken = datetime.strptime(lines[1].split(",")[1][-5:], "%H:%M")
    except (IndexError, ValueError):
        return 0.0
    now = datetime.strptime(datetime.now().strftime("%H:%M"), "%H:%M")
    return float(abs((taken - now).total_seconds()) / 60 < int(minutes))
