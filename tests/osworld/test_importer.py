"""`gh-runner import osworld`: the cases it writes, the report and its totals, and that bad input writes
nothing (run through the real entry point, in process)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gh_local.casefile import load_case_file
from gh_local.cli import main
from gh_local.osworld.fetch import Fetcher
from gh_local.osworld.importer import case_key
from gh_local.osworld.report import ImportReport, Outcome, TaskResult
from gh_local.osworld.skips import Skip, SkipReason
from gh_runner.cli import build_parser

from .conftest import Served, case_of, task, write_task

PYAUTOGUI = {"type": "execute", "parameters": {"command": ["python", "-c", "import pyautogui; pyautogui.press('f5')"]}}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["import", "osworld", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def benchmark(root: Path, served: Served) -> Path:
    served.files["/notes.txt"] = b"remember the milk\n"
    ex = root / "examples"
    write_task(ex / "os", task(id="os-file", instruction="Put 'hello' in ~/greeting.txt.",
                               related_apps=["os", "terminal"], source="https://example.org/forum/1"))
    write_task(ex / "os", task(id="os-download", config=[{"type": "download", "parameters": {"files": [
        {"url": served.url + "/notes.txt", "path": "/home/user/notes.txt"}]}}]))
    write_task(ex / "os", task(id="os-gui", config=[PYAUTOGUI]))
    write_task(ex / "os", task(id="os-infeasible", evaluator={"func": "infeasible"}))
    write_task(ex / "chrome", task(id="web", config=[{"type": "chrome_open_tabs",
                                                      "parameters": {"urls_to_open": ["https://www.example.com"]}}]))
    write_task(ex / "multi_apps", task(id="drive", config=[{"type": "googledrive", "parameters": {}}]))
    write_task(ex / "multi_apps", task(id="broken-dl", config=[{"type": "download", "parameters": {"files": [
        {"url": served.url + "/gone.xlsx", "path": "/home/user/x.xlsx"}]}}]))
    write_task(ex / "libreoffice_calc", task(id="calc", evaluator={
        "func": "compare_table", "result": {"type": "vm_file", "path": "/a.xlsx"},
        "expected": {"type": "vm_file", "path": "/b.xlsx"}}))
    write_task(ex / "vs_code", task(id="vscode-ext", related_apps=["vs_code"], evaluator={"func": "infeasible"},
                                    config=[{"type": "download", "parameters": {"files": [
                                        {"url": served.url + "/never-fetched.vsix", "path": "/home/user/x.vsix"}]}}]))
    write_task(ex / "os", task(id="os-file"), name="zz-copy-of-os-file")
    write_task(ex / "os", task(id="os file"), name="zz-os file")
    return ex


def test_a_benchmark_imports_in_one_command_with_a_line_per_task_and_totals(
        tmp_path: Path, served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    ex = benchmark(tmp_path, served)
    out_file = tmp_path / "cases.yaml"
    code, out, err = run(capsys, str(ex), "--out", str(out_file), "--files-dir", str(tmp_path / "files"))
    assert code == 0, err
    lines = out.splitlines()
    assert set(lines[:-2]) == {
        "os-file: imported", "os-download: imported", "os-gui: imported", "os-infeasible: imported", "calc: imported",
        "web: skipped: live_web (config[0]: chrome_open_tabs opens https://www.example.com)",
        "drive: skipped: google_drive (config[0]: googledrive)",
        "broken-dl: skipped: download_failed (config[0]: 127.0.0.1: HTTP 404)",
        "vscode-ext: skipped: app_missing (needs vs_code (VS Code is not in Debian), which osworld-desktop does not "
        "have)",
        f"os-file: skipped: duplicate_id ({ex / 'os' / 'zz-copy-of-os-file.json'}: the id of an earlier task)",
        f"os file: skipped: duplicate_id ({ex / 'os' / 'zz-os file.json'}: its key os-file is the key of an earlier "
        "task)",
    }
    assert lines[-2] == ("11 tasks: 5 imported, 6 skipped (duplicate_id 2, app_missing 1, download_failed 1, "
                         "google_drive 1, live_web 1)")
    assert lines[-1] == f"wrote 5 cases to {out_file}"
    assert out_file.read_text().startswith(f"# Imported from OSWorld-format tasks ({ex}) by gh-runner import "
                                           f"osworld.\n# 11 tasks: 5 imported, 6 skipped")
    loaded = load_case_file(out_file)  # what gh-runner local and validate read
    by_key = {c["key"]: c for c in loaded.cases}
    assert set(by_key) == {"os-file", "os-download", "os-gui", "os-infeasible", "calc"}
    case = by_key["os-file"]
    assert (case["name"], case["prompt"], case["start_state"]) == ("Put 'hello' in ~/greeting.txt.",
                                                                   "Put 'hello' in ~/greeting.txt.", "osworld-desktop")
    assert (case["category"], case["tags"], case["runs_on"]) == ("os", ["osworld", "os", "terminal"], "vm")
    assert case["metadata"] == {"benchmark": "osworld", "osworld_id": "os-file", "osworld_snapshot": "os",
                                "osworld_source": "https://example.org/forum/1",
                                "osworld_evaluator": "exact_match(vm_command_line)"}
    assert "setup_script" not in case  # no config
    assert by_key["os-infeasible"]["metadata"]["reference_answer"] == "infeasible"
    assert "/never-fetched.vsix" not in served.hits  # a skipped task's files are not fetched


def test_a_start_state_of_your_own_is_taken_to_have_the_apps(
        tmp_path: Path, served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    served.files["/never-fetched.vsix"] = b"PK\x03\x04"
    ex = benchmark(tmp_path, served)
    code, out, _ = run(capsys, str(ex / "vs_code"), "--out", str(tmp_path / "c.yaml"), "--start-state",
                       "ubuntu-osworld")
    assert (code, out.splitlines()[0]) == (0, "vscode-ext: imported")
    (case,) = load_case_file(tmp_path / "c.yaml").cases
    # Given the domain's own directory, the domain is not in the layout: the category is the task's snapshot.
    assert (case["start_state"], case["tags"], case["category"]) == ("ubuntu-osworld", ["osworld", "vs_code"], "os")
    assert (tmp_path / "osworld-files" / "urls.json").is_file()  # the default --files-dir: beside --out


def test_without_gh_osworld_only_infeasible_tasks_import(
        tmp_path: Path, served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    """Every metric has one implementation, gh_osworld's: a start state that does not carry it imports the tasks
    whose check is the answer rule alone (infeasible), and skips the rest, saying why."""
    ex = benchmark(tmp_path, served)
    code, out, _ = run(capsys, str(ex / "os"), "--out", str(tmp_path / "c.yaml"), "--start-state", "linux-tiny")
    assert code == 0
    for key in ("os-file", "os-download", "os-gui"):
        assert (f"{key}: skipped: needs_gh_osworld (its metrics run in gh_osworld, which linux-tiny does not carry "
                "(osworld-desktop does))") in out.splitlines()
    assert "os-infeasible: imported" in out.splitlines()
    assert "/notes.txt" not in served.hits  # skipped before the check's files are fetched
    assert {c["start_state"] for c in load_case_file(tmp_path / "c.yaml").cases} == {"linux-tiny"}


@pytest.mark.parametrize("bad", ["{broken", json.dumps(task(evaluator={"func": []}))])
def test_bad_input_writes_nothing_and_says_what(tmp_path: Path, served: Served, capsys: pytest.CaptureFixture[str],
                                                bad: str) -> None:
    ex = benchmark(tmp_path, served)
    (ex / "os" / "zz-bad.json").write_text(bad)
    out_file = tmp_path / "cases.yaml"
    out_file.write_text("cases: []  # an earlier file, left as it was\n")
    code, out, err = run(capsys, str(ex), "--out", str(out_file), "--files-dir", str(tmp_path / "files"))
    assert code == 2
    assert err.startswith(f"gh-runner import osworld: {ex / 'os' / 'zz-bad.json'}: ")
    assert err.rstrip().endswith("nothing was written")
    assert out == ""
    assert out_file.read_text() == "cases: []  # an earlier file, left as it was\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cases.yaml", "examples"]  # nothing fetched, no partial file
    assert served.hits == {}


def test_nothing_importable_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_task(tmp_path / "t", task(id="only-web", evaluator={"func": "exact_match",
                                                              "result": {"type": "page_info"}}))
    code, out, err = run(capsys, str(tmp_path / "t"), "--out", str(tmp_path / "c.yaml"))
    assert code == 1
    assert out.splitlines() == ["only-web: skipped: live_web (evaluator.result: getter page_info)",
                                "1 tasks: 0 imported, 1 skipped (live_web 1)"]
    assert "no task could be imported; nothing was written" in err
    assert not (tmp_path / "c.yaml").exists()


def test_a_bad_out_path_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_task(tmp_path / "t", task())
    code, _, err = run(capsys, str(tmp_path / "t"), "--out", str(tmp_path / "no" / "c.yaml"))
    assert code == 2 and "does not exist" in err
    code, _, err = run(capsys, str(tmp_path / "t"), "--out", str(tmp_path))
    assert code == 2 and "is a directory" in err


def test_the_command_line() -> None:
    args = build_parser().parse_args(["import", "osworld", "a.json", "dir", "--out", "x.yaml",
                                      "--start-state", "linux-tiny", "--files-dir", "f"])
    assert (args.command, args.benchmark, args.paths, args.out, args.start_state, args.files_dir) == (
        "import", "osworld", [Path("a.json"), Path("dir")], Path("x.yaml"), "linux-tiny", Path("f"))
    defaults = build_parser().parse_args(["import", "osworld", "a.json"])
    assert (defaults.out, defaults.start_state, defaults.files_dir) == (Path("cases.yaml"), "osworld-desktop", None)
    assert (defaults.fetch_only, defaults.offline) == (False, False)


@pytest.mark.parametrize(("task_id", "key"), [
    ("0b17a146-2934-46c7-8727-73ff6b6483e8", "0b17a146-2934-46c7-8727-73ff6b6483e8"),
    ("my task/1", "my-task-1"), ("a" * 80, "a" * 64)])
def test_keys_come_from_task_ids(task_id: str, key: str) -> None:
    assert case_key(task_id) == key


def test_ids_that_cannot_be_keys_get_a_stable_one() -> None:
    for bad in ("..", "tc_123", "///"):
        assert case_key(bad).startswith("osworld-") and case_key(bad) == case_key(bad)
    assert case_key("..") != case_key("tc_123")


def test_name_prompt_and_script_limits(fetcher: Fetcher, served: Served) -> None:
    long = "word " * 100
    case = case_of(task(instruction=long), fetcher)
    assert len(case["name"]) == 200 and case["name"].endswith("…") and case["prompt"] == long
    with pytest.raises(Skip) as e:
        case_of(task(instruction="x" * 8001), fetcher)
    assert (e.value.reason, e.value.detail) == (SkipReason.PROMPT_TOO_LONG, "8,001 characters; a prompt holds 8,000")
    rng = random.Random(2)
    files = []
    for i in range(3):  # each fits in a script, the three do not
        served.files[f"/f{i}"] = rng.randbytes(30_000)
        files.append({"url": f"{served.url}/f{i}", "path": f"/tmp/f{i}"})
    with pytest.raises(Skip) as e:
        # linux-desktop has no file store to place them from instead (and imports an infeasible task's check).
        case_of(task(config=[{"type": "download", "parameters": {"files": files}}], evaluator={"func": "infeasible"}),
                fetcher, "linux-desktop")
    assert e.value.reason is SkipReason.SCRIPT_TOO_LARGE and e.value.detail.startswith("the setup is 12")


def test_report_totals_order_reasons_by_count() -> None:
    report = ImportReport([TaskResult("a", Outcome.IMPORTED, key="a"),
                           TaskResult("b", Outcome.SKIPPED, reason=SkipReason.LOGIN, detail="x"),
                           TaskResult("c", Outcome.SKIPPED, reason=SkipReason.LIVE_WEB, detail="y"),
                           TaskResult("d", Outcome.SKIPPED, reason=SkipReason.LIVE_WEB, detail="z"),
                           TaskResult("e f", Outcome.IMPORTED, key="e-f")])
    assert report.imported == 2
    assert report.skipped_by_reason() == {SkipReason.LIVE_WEB: 2, SkipReason.LOGIN: 1}
    assert report.render().splitlines() == ["a: imported", "b: skipped: login (x)", "c: skipped: live_web (y)",
                                            "d: skipped: live_web (z)", "e f: imported as e-f",
                                            "5 tasks: 2 imported, 3 skipped (live_web 2, login 1)"]




def test_an_id_two_domains_use_keys_each_task_by_its_domain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """OSWorld has different tasks sharing an id in chrome/ and thunderbird/: both are imported, keyed
    <domain>-<id>; the same id twice in one domain stays a duplicate."""
    ex = tmp_path / "examples"
    tid = "bb5e4c0d-f964-439c-97b6-bdb9747de3f4"
    write_task(ex / "chrome", task(id=tid, instruction="Make Bing the search engine.", related_apps=["chrome"]))
    write_task(ex / "thunderbird", task(id=tid, instruction="Remove the account.", related_apps=["thunderbird"]))
    write_task(ex / "thunderbird", task(id=tid), name="zz-copy")
    code, out, _ = run(capsys, str(ex), "--out", str(tmp_path / "c.yaml"))
    assert code == 0
    assert out.splitlines()[:3] == [
        f"{tid}: imported as chrome-{tid}", f"{tid}: imported as thunderbird-{tid}",
        f"{tid}: skipped: duplicate_id ({ex / 'thunderbird' / 'zz-copy.json'}: its key thunderbird-{tid} is the key "
        "of an earlier task)"]
    cases = load_case_file(tmp_path / "c.yaml").cases
    assert [(c["key"], c["metadata"]["osworld_id"]) for c in cases] == [(f"chrome-{tid}", tid),
                                                                        (f"thunderbird-{tid}", tid)]
