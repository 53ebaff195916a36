"""The evaluator as a check script: the answer rule, postconfig, the files it brings, the hand-over to
gh_osworld and its last line passed on; run with the host's dash and bash, their `python3` the guest's
(conftest.run_script). What each metric computes is gh_osworld's, tested in tests/osworld_guest."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest
from osworld_guest.kit import make

from gh_local.osworld.fetch import Fetcher
from gh_local.osworld.skips import Skip, SkipReason

from .conftest import SHELLS, Served, case_of, run_script, task


def check_of(evaluator: dict[str, Any], fetcher: Fetcher, start_state: str = "osworld-desktop") -> str:
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


def test_the_check_hands_the_evaluator_to_gh_osworld(fetcher: Fetcher, home: Path) -> None:
    script = check_of({"func": "exact_match", "result": cmd("cat ~/a.txt"), "expected": rule(expected="it's\n")},
                      fetcher)
    assert 'python3 -m gh_osworld "$gh_w/spec.json"' in script
    assert verdict(script, home) == ["False", "False"]  # no file: empty output
    (home / "a.txt").write_text("it's\n")
    assert verdict(script, home) == ["True", "True"]


def test_the_check_passes_gh_osworlds_last_line_on_as_it_is(fetcher: Fetcher, home: Path, tmp_path: Path) -> None:
    """A score gh_osworld prints (a number in [0, 1]) is the check's last line, untouched by the sh around it,
    the postconfig's output kept off it. gh_osworld here is a stand-in that prints what it is told: the real
    one's numbers are its own (tests/osworld_guest)."""
    stand_in = tmp_path / "stand-in" / "gh_osworld"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text("")
    (stand_in / "__main__.py").write_text("import os\nprint('noise')\nprint(os.environ['GH_TEST_SAYS'])\n")
    script = check_of({"func": "exact_match", "result": cmd("echo x"), "expected": rule(expected="x\n"),
                       "postconfig": [{"type": "execute", "parameters": {"command": "echo 1.0", "shell": True}}]},
                      fetcher)
    for says in ("0.5", "0", "0.9966666666666667", "1", "True", "False"):
        for sh in SHELLS:
            ran = run_script(script, home, shell=sh, env={"PYTHONPATH": str(stand_in.parent), "GH_TEST_SAYS": says})
            assert (ran.code, ran.out.splitlines()[-1]) == (0, says), (sh, ran.err)


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


def test_an_expected_cloud_file_is_embedded(fetcher: Fetcher, home: Path, served: Served) -> None:
    served.files["/gold.txt"] = b"Line one\n\tLine  two\n"
    script = check_of({"func": "compare_text_file", "result": {"type": "vm_file", "path": str(home / "out.txt")},
                       "expected": {"type": "cloud_file", "path": served.url + "/gold.txt", "dest": "gold.txt"}},
                      fetcher)
    assert "gold" not in script and "Line one" not in script  # embedded, encoded: not readable in the guest before
    assert verdict(script, home) == ["False", "False"]
    (home / "out.txt").write_bytes(served.files["/gold.txt"])
    assert verdict(script, home) == ["True", "True"]
    assert served.hits["/gold.txt"] == 1  # fetched once, at import time, then from --files-dir


def sheet_print_task(url: str, home: Path) -> dict[str, Any]:
    """The shape of OSWorld's sheet_print tasks (calc 4f07fbe9 and six others): the workbook and the CSV the
    postconfig prints from it, each side a multi getter that gives the metric the workbook alone; compare_table
    reads the printed sheet beside it (`<stem>-Sheet1.csv`)."""
    return {"func": "compare_table",
            "result": {"type": "vm_file", "multi": True, "gives": [0],
                       "path": [str(home / "Sales.xlsx"), str(home / "Sales-Sheet1.csv")],
                       "dest": ["Sales.xlsx", "Sales-Sheet1.csv"]},
            "expected": {"type": "cloud_file", "multi": True, "gives": [0],
                         "path": [url + "/Sales_gold.xlsx", url + "/Sales_gold-Sheet1.csv"],
                         "dest": ["Sales_gold.xlsx", "Sales_gold-Sheet1.csv"]},
            "options": {"rules": [{"type": "sheet_print", "sheet_idx0": "RNSheet1", "sheet_idx1": "ENSheet1"}]}}


def test_every_file_of_a_multi_cloud_file_reaches_the_check(fetcher: Fetcher, home: Path, served: Served,
                                                            tmp_path: Path) -> None:
    """sheet_print compares the CSV printed beside each workbook: the expected one arrives with its workbook
    although `gives` hands the metric the workbook alone (before, only the given files were embedded: the
    check found no expected CSV and exited 1 once the agent had printed its own)."""
    rows = [["Name", "Sales"], ["a", 1.5], ["b", 2.25]]
    make("import openpyxl\nwb = openpyxl.Workbook()\nfor r in rows: wb.active.append(r)\nwb.save(path)", tmp_path,
         rows=rows, path=str(tmp_path / "gold.xlsx"))
    served.files["/Sales_gold.xlsx"] = (tmp_path / "gold.xlsx").read_bytes()
    served.files["/Sales_gold-Sheet1.csv"] = b"Name,Sales\na,1.50\nb,2.25\n"
    script = check_of(sheet_print_task(served.url, home), fetcher)
    assert verdict(script, home) == ["False", "False"]  # the agent printed nothing
    (home / "Sales.xlsx").write_bytes(served.files["/Sales_gold.xlsx"])
    (home / "Sales-Sheet1.csv").write_text("Name,Sales\na,1.50\nb,2.25\n")  # the correct answer, as printed
    assert verdict(script, home) == ["True", "True"]
    wrong = io.StringIO()
    csv.writer(wrong, lineterminator="\n").writerows([["Name", "Sales"], ["a", "1.5"], ["b", "2.25"]])
    (home / "Sales-Sheet1.csv").write_text(wrong.getvalue())  # printed with other decimals
    assert verdict(script, home) == ["False", "False"]


def test_a_multi_cloud_file_keeps_osworlds_names_and_what_it_gives(fetcher: Fetcher, served: Served,
                                                                    home: Path) -> None:
    served.files["/a.txt"] = b"A\n"
    served.files["/b.txt"] = b"B\n"
    both = {"type": "cloud_file", "multi": True, "gives": [1, 0], "path": [served.url + "/a.txt",
                                                                          served.url + "/b.txt"],
            "dest": ["first file.txt", "b.txt"]}
    script = check_of({"func": "compare_text_file", "result": {"type": "vm_file", "path": str(home / "o")},
                       "expected": both}, fetcher)
    assert "first file.txt" in script  # the spec names the files by their dest
    for dest, reason in ((["a.txt"], "a dest for each URL"), (["../a", "b"], "a dest for each URL"),
                         (["x", "x"], "names one dest twice")):
        with pytest.raises(Skip) as e:
            check_of({"func": "compare_text_file", "result": {"type": "vm_file", "path": "/o"},
                      "expected": dict(both, dest=dest)}, fetcher)
        assert e.value.reason is SkipReason.UNSUPPORTED_OPTION and reason in e.value.detail


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


@pytest.mark.parametrize("start_state", ["linux-tiny", "linux-desktop", "a-start-state-of-yours"])
def test_without_gh_osworld_a_metric_is_skipped(fetcher: Fetcher, start_state: str) -> None:
    """One implementation of each metric, gh_osworld's: no sh copy for a start state that does not carry it."""
    with pytest.raises(Skip) as e:
        check_of({"func": "exact_match", "result": cmd("printf a"), "expected": rule(expected="a")}, fetcher,
                 start_state)
    assert (e.value.reason, e.value.detail) == (
        SkipReason.NEEDS_GH_OSWORLD, f"its metrics run in gh_osworld, which {start_state} does not carry "
                                     "(osworld-desktop does)")


@pytest.mark.parametrize(("evaluator", "reason", "detail"), [
    ({"func": "no_such_metric", "result": {"type": "vm_file", "path": "/a"}},
     SkipReason.UNSUPPORTED_METRIC, "no_such_metric"),
    ({"func": "exact_match", "result": {"type": "no_such_getter"}, "expected": rule(expected="a")},
     SkipReason.UNSUPPORTED_GETTER, "no_such_getter"),
    ({"func": "exact_match", "result": {"type": "info_from_website"}, "expected": rule(expected="a")},
     SkipReason.LIVE_WEB, "info_from_website"),
    ({"func": "exact_match", "result": {"type": "googledrive_file"}, "expected": rule(expected="a")},
     SkipReason.GOOGLE_DRIVE, "googledrive_file"),
    ({"func": ["infeasible", "exact_match"], "result": [None, cmd("x")], "expected": [None, rule(expected="a")]},
     SkipReason.UNSUPPORTED_OPTION, "infeasible beside other metrics"),
    # The live web before the metric.
    ({"func": "no_such_metric", "result": {"type": "active_tab_html_parse"}, "expected": rule(url="x")},
     SkipReason.LIVE_WEB, "active_tab_html_parse"),
])
def test_unsupported_evaluators_are_skipped_with_the_reason(fetcher: Fetcher, evaluator: dict[str, Any],
                                                            reason: SkipReason, detail: str) -> None:
    for start_state in ("osworld-desktop", "linux-tiny"):  # the reason that says most, whatever the target
        with pytest.raises(Skip) as e:
            check_of(evaluator, fetcher, start_state)
        assert e.value.reason is reason
        assert detail in e.value.detail


def test_a_metric_that_crashes_is_no_verdict_against_the_agent(fetcher: Fetcher, home: Path) -> None:
    # An invalid regular expression is the task's fault: the check exits non-zero without a verdict (an
    # error of the case), where a missing result is the agent's (False).
    script = check_of({"func": "check_list", "result": {"type": "vm_file", "path": str(home / "l")},
                       "expected": rule(expect=["("])}, fetcher)
    (home / "l").write_text("a\n")
    for sh in SHELLS:
        ran = run_script(script, home, shell=sh)
        assert (ran.code, ran.verdict) == (1, ""), sh
        assert "the check crashed" in ran.err
    (home / "l").unlink()
    missing = check_of({"func": "check_list", "result": {"type": "vm_file", "path": str(home / "l")},
                        "expected": rule(expect=["a"])}, fetcher)
    assert verdict(missing, home) == ["False", "False"]
