"""The evaluator as a check script: each getter, each metric (passing and failing), conj, postconfig,
infeasible; run with the host's dash and bash, as linux-tiny's sh and linux-desktop's bash would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gh_local.osworld.fetch import Fetcher
from gh_local.osworld.skips import Skip, SkipReason

from .conftest import SHELLS, Served, case_of, run_script, task


def check_of(evaluator: dict[str, Any], fetcher: Fetcher, start_state: str = "linux-desktop") -> str:
    return str(case_of(task(evaluator=evaluator), fetcher, start_state)["success"]["check_script"])


def cmd(command: Any, shell: bool = True, kind: str = "vm_command_line") -> dict[str, Any]:
    return {"type": kind, "command": command, "shell": shell}


def rule(**rules: Any) -> dict[str, Any]:
    return {"type": "rule", "rules": rules}


def verdict(script: str, home: Path, **kw: Any) -> list[str]:
    """The verdict under each shell (they must agree)."""
    out = []
    for sh in SHELLS:
        ran = run_script(script, home, shell=sh, **kw)
        assert ran.code == 0, (sh, ran.err)
        out.append(ran.verdict)
    return out


def test_exact_match_compares_the_output_byte_for_byte(fetcher: Fetcher, home: Path) -> None:
    script = check_of({"func": "exact_match", "result": cmd("cat ~/a.txt"), "expected": rule(expected="it's\n")},
                      fetcher)
    assert verdict(script, home) == ["False", "False"]  # no file: empty output
    (home / "a.txt").write_text("it's")  # no newline: not what `cat` of the fixed file prints
    assert verdict(script, home) == ["False", "False"]
    (home / "a.txt").write_text("it's\n")
    assert verdict(script, home) == ["True", "True"]


def test_vm_command_line_argv_and_string_forms(fetcher: Fetcher, home: Path) -> None:
    (home / "f").write_text("x y\n")
    for command, shell in ((["cat", "f"], False), ("cat f", False), ("cat f | head -n 1", True),
                           (["cat \"$0\"", "f"], True)):
        script = check_of({"func": "exact_match", "result": cmd(command, shell), "expected": rule(expected="x y\n")},
                          fetcher)
        assert verdict(script, home) == ["True", "True"], command


def test_vm_command_error_reads_stderr(fetcher: Fetcher, home: Path) -> None:
    script = check_of({"func": "check_include_exclude", "result": cmd("ls ~/nothing-here", kind="vm_command_error"),
                       "expected": rule(include=["nothing-here"], exclude=[])}, fetcher)
    assert verdict(script, home) == ["True", "True"]
    (home / "nothing-here").write_text("")
    assert verdict(script, home) == ["False", "False"]  # no error now


def test_check_include_exclude_on_a_file(fetcher: Fetcher, home: Path) -> None:
    script = check_of({"func": "check_include_exclude", "result": {"type": "vm_file", "path": str(home / "c.conf")},
                       "expected": rule(include=["mode=prod", "a.b*c"], exclude=["debug"])}, fetcher)
    assert verdict(script, home) == ["False", "False"]  # no file
    (home / "c.conf").write_text("mode=prod\na.b*c\ndebug=1\n")
    assert verdict(script, home) == ["False", "False"]  # excluded text present
    (home / "c.conf").write_text("mode=prod\nxa.b*cx\n")  # fixed strings, not patterns
    assert verdict(script, home) == ["True", "True"]
    (home / "c.conf").write_text("mode=prod\na.bxxc\n")
    assert verdict(script, home) == ["False", "False"]


def test_check_include_exclude_across_lines_uses_python(fetcher: Fetcher, home: Path) -> None:
    case = case_of(task(evaluator={"func": "check_include_exclude", "result": cmd("cat ~/f"),
                                   "expected": rule(include=["a\nb"], exclude=[])}), fetcher)
    script = case["success"]["check_script"]
    assert "python3" in script
    (home / "f").write_text("a\nb\n")
    assert verdict(script, home) == ["True", "True"]
    (home / "f").write_text("a\nc\nb\n")
    assert verdict(script, home) == ["False", "False"]
    with pytest.raises(Skip) as e:  # python3 is not on linux-tiny
        case_of(task(evaluator={"func": "check_include_exclude", "result": cmd("cat ~/f"),
                                "expected": rule(include=["a\nb"])}), fetcher, "linux-tiny")
    assert e.value.reason is SkipReason.NEEDS_DESKTOP and "python3" in e.value.detail


def test_match_in_list_and_is_in_list(fetcher: Fetcher, home: Path) -> None:
    in_list = check_of({"func": "match_in_list", "result": cmd("cat ~/v"), "expected": rule(expected=["a", "b\n"])},
                       fetcher)
    contains = check_of({"func": "is_in_list", "result": cmd("cat ~/v"), "expected": rule(expected="b")}, fetcher)
    (home / "v").write_text("b\n")
    assert verdict(in_list, home) == ["True", "True"]
    assert verdict(contains, home) == ["True", "True"]
    (home / "v").write_text("bb\n")
    assert verdict(in_list, home) == ["False", "False"]
    assert verdict(contains, home) == ["True", "True"]
    (home / "v").write_text("c\n")
    assert verdict(contains, home) == ["False", "False"]


def test_literal_match_with_and_without_case(fetcher: Fetcher, home: Path) -> None:
    exact = check_of({"func": "literal_match", "result": cmd("printf Hello"), "expected": rule(expected="hello")},
                     fetcher)
    nocase = check_of({"func": "literal_match", "result": cmd("printf Hello"), "expected": rule(expected="hello"),
                       "options": {"ignore_case": True}}, fetcher)
    assert verdict(exact, home) == ["False", "False"]
    assert verdict(nocase, home) == ["True", "True"]
    with pytest.raises(Skip) as e:
        check_of({"func": "literal_match", "result": cmd("x"), "expected": rule(expected=["a"]),
                  "options": {"type": "list"}}, fetcher)
    assert e.value.reason is SkipReason.UNSUPPORTED_OPTION


def test_compare_text_file_against_an_embedded_cloud_file(fetcher: Fetcher, home: Path, served: Served) -> None:
    served.files["/gold.txt"] = b"Line one\n\tLine  two\n"
    script = check_of({"func": "compare_text_file", "result": {"type": "vm_file", "path": str(home / "out.txt")},
                       "expected": {"type": "cloud_file", "path": served.url + "/gold.txt", "dest": "gold.txt"}},
                      fetcher)
    assert "gold" not in script and "Line one" not in script  # embedded, encoded: not readable in the guest before
    assert verdict(script, home) == ["False", "False"]
    (home / "out.txt").write_text("Line one\n\tLine two\n")
    assert verdict(script, home) == ["False", "False"]
    (home / "out.txt").write_bytes(served.files["/gold.txt"])
    assert verdict(script, home) == ["True", "True"]
    loose = check_of({"func": "compare_text_file", "result": {"type": "vm_file", "path": str(home / "out.txt")},
                      "expected": {"type": "cloud_file", "path": served.url + "/gold.txt", "dest": "gold.txt"},
                      "options": {"ignore_blanks": True, "ignore_case": True}}, fetcher)
    (home / "out.txt").write_text("line ONE line two")
    assert verdict(loose, home) == ["True", "True"]
    assert served.hits["/gold.txt"] == 1  # fetched once, at import time, then from --files-dir


def test_check_json_settings_and_check_list(fetcher: Fetcher, home: Path) -> None:
    settings = home / "settings.json"
    js = check_of({"func": "check_json_settings", "result": {"type": "vm_file", "path": str(settings)},
                   "expected": rule(expected={"editor.wordWrap": "on", "n": 2})}, fetcher)
    settings.write_text("not json")
    assert verdict(js, home) == ["False", "False"]
    settings.write_text(json.dumps({"editor.wordWrap": "on", "n": 3}))
    assert verdict(js, home) == ["False", "False"]
    settings.write_text(json.dumps({"editor.wordWrap": "on", "n": 2, "other": 1}))
    assert verdict(js, home) == ["True", "True"]
    lst = check_of({"func": "check_list", "result": {"type": "vm_file", "path": str(home / "l")},
                    "expected": rule(expect=[r"^a\d$", "b"], unexpect=["^zz"])}, fetcher)
    (home / "l").write_text("a1\nxbx\n")
    assert verdict(lst, home) == ["True", "True"]
    (home / "l").write_text("a1\nxbx\nzzz\n")
    assert verdict(lst, home) == ["False", "False"]
    (home / "l").write_text("a12\nb\n")
    assert verdict(lst, home) == ["False", "False"]


@pytest.mark.parametrize(("conj", "expected"), [("and", "False"), ("or", "True")])
def test_conj_over_a_list_of_metrics(fetcher: Fetcher, home: Path, conj: str, expected: str) -> None:
    script = check_of({"func": ["exact_match", "exact_match"], "conj": conj,
                       "result": [cmd("printf a"), cmd("printf b")],
                       "expected": [rule(expected="a"), rule(expected="not b")]}, fetcher)
    assert verdict(script, home) == [expected, expected]


def test_postconfig_runs_in_the_check_after_only(fetcher: Fetcher, home: Path) -> None:
    script = check_of({"func": "exact_match", "result": cmd("cat ~/saved"), "expected": rule(expected="yes"),
                       "postconfig": [{"type": "execute", "parameters": {"command": "printf yes > ~/saved; echo noise",
                                                                         "shell": True}}]}, fetcher)
    assert verdict(script, home, phase="before") == ["False", "False"]
    assert not (home / "saved").exists()
    ran = run_script(script, home, phase="after")
    assert ran.out.splitlines() == ["True"]  # the postconfig's own output is kept off the verdict


@pytest.mark.parametrize(("answer", "expected"), [
    ("", "False"), ("infeasible", "True"), ("Infeasible: there is no such setting", "True"),
    ("  \n INFEASIBLE.", "True"), ("infeasibleness", "False"), ("It is infeasible", "False"), ("done", "False")])
def test_infeasible_passes_on_an_answer_that_begins_with_the_word(fetcher: Fetcher, home: Path, answer: str,
                                                                    expected: str) -> None:
    case = case_of(task(evaluator={"func": "infeasible"}), fetcher, "linux-tiny")
    assert case["metadata"]["reference_answer"] == "infeasible"
    assert verdict(case["success"]["check_script"], home, answer=answer) == [expected, expected]


def test_a_feasible_task_fails_when_the_agent_says_infeasible(fetcher: Fetcher, home: Path) -> None:
    script = check_of({"func": "exact_match", "result": cmd("printf a"), "expected": rule(expected="a")}, fetcher)
    assert verdict(script, home, answer="all done") == ["True", "True"]
    assert verdict(script, home, answer="Infeasible: cannot") == ["False", "False"]


@pytest.mark.parametrize(("evaluator", "reason", "detail"), [
    ({"func": "compare_docx_files", "result": {"type": "vm_file", "path": "/a"},
      "expected": {"type": "vm_file", "path": "/b"}}, SkipReason.UNSUPPORTED_METRIC, "compare_docx_files"),
    ({"func": "exact_match", "result": {"type": "accessibility_tree"}, "expected": rule(expected="a")},
     SkipReason.UNSUPPORTED_GETTER, "accessibility_tree"),
    ({"func": "exact_match", "result": {"type": "info_from_website"}, "expected": rule(expected="a")},
     SkipReason.LIVE_WEB, "info_from_website"),
    ({"func": "exact_match", "result": {"type": "googledrive_file"}, "expected": rule(expected="a")},
     SkipReason.GOOGLE_DRIVE, "googledrive_file"),
    ({"func": "exact_match", "result": {"type": "vm_file", "path": "/a"}, "expected": rule(expected="a")},
     SkipReason.UNSUPPORTED_OPTION, "exact_match with a result that is file"),
    ({"func": "exact_match", "result": cmd("x"), "expected": rule(expected=3)},
     SkipReason.UNSUPPORTED_OPTION, "rules.expected as text"),
    ({"func": ["infeasible", "exact_match"], "result": [None, cmd("x")], "expected": [None, rule(expected="a")]},
     SkipReason.UNSUPPORTED_OPTION, "infeasible beside other metrics"),
    # The reason that says most: the metric is named before a getter it alone would read ...
    ({"func": "is_in_vm_clickboard", "result": rule(expected="x"), "expected": cmd("xsel --clipboard --output")},
     SkipReason.UNSUPPORTED_METRIC, "is_in_vm_clickboard"),
    # ... and the live web before the metric.
    ({"func": "is_expected_active_tab", "result": {"type": "active_tab_html_parse"}, "expected": rule(url="x")},
     SkipReason.LIVE_WEB, "active_tab_html_parse"),
])
def test_unsupported_evaluators_are_skipped_with_the_reason(fetcher: Fetcher, evaluator: dict[str, Any],
                                                            reason: SkipReason, detail: str) -> None:
    with pytest.raises(Skip) as e:
        check_of(evaluator, fetcher)
    assert e.value.reason is reason
    assert detail in e.value.detail


def test_a_metric_that_crashes_is_no_verdict_against_the_agent(fetcher: Fetcher, home: Path) -> None:
    # An invalid regular expression is the task's fault: the check exits non-zero without a verdict (an
    # error of the case), where a missing or malformed result is the agent's (False).
    script = check_of({"func": "check_list", "result": {"type": "vm_file", "path": str(home / "l")},
                       "expected": rule(expect=["("])}, fetcher)
    (home / "l").write_text("a\n")
    for sh in SHELLS:
        ran = run_script(script, home, shell=sh)
        assert (ran.code, ran.verdict) == (1, ""), sh
        assert "the metric crashed" in ran.err
    (home / "l").unlink()
    missing = check_of({"func": "check_list", "result": {"type": "vm_file", "path": str(home / "l")},
                        "expected": rule(expect=["a"])}, fetcher)
    assert verdict(missing, home) == ["False", "False"]
