"""Importing for osworld-desktop: the check hands the evaluator to gh_osworld in the guest (its spec, the files
fetched at import and embedded), what the target carries (wmctrl, the file store), and VS Code's absence.

The generated scripts run with the host's dash and bash; `python3 -m gh_osworld` is first a stand-in that
keeps what the check handed it (the spec and the check's directory), then the real package from this
repository on the host's /usr/bin/python3, as the guest runs it."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from osworld_guest.kit import guest_env

from gh_local.osworld import check
from gh_local.osworld.fetch import Fetcher
from gh_local.osworld.skips import Skip, SkipReason

from .conftest import SHELLS, Served, case_of, run_script, task

OSWORLD_DESKTOP = "osworld-desktop"


def check_of(evaluator: dict[str, Any], fetcher: Fetcher, start_state: str = OSWORLD_DESKTOP,
             **fields: Any) -> str:
    return str(case_of(task(evaluator=evaluator, **fields), fetcher, start_state)["success"]["check_script"])


def guest_stand_in(bin_dir: Path, kept: Path, verdict: str = "True", code: int = 0) -> Path:
    """A python3 that, run as `python3 -m gh_osworld SPEC`, keeps the spec and the check's directory, and
    answers `verdict` with exit `code`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    stand_in = bin_dir / "python3"
    stand_in.write_text(f'#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = gh_osworld ]; then\n'
                        f'  mkdir -p {kept}; cp -r "$(dirname "$3")" {kept}/w; echo "$(dirname "$3")" > {kept}/dir\n'
                        f'  echo {verdict}; exit {code}\nfi\nexec /usr/bin/python3 "$@"\n')
    stand_in.chmod(0o755)
    return bin_dir


def kept_spec(kept: Path) -> tuple[dict[str, Any], str]:
    return json.loads((kept / "w" / "spec.json").read_text()), (kept / "dir").read_text().strip()


@pytest.mark.parametrize("shell", SHELLS)
def test_the_check_hands_the_evaluator_to_gh_osworld_with_the_expected_file_embedded(
        fetcher: Fetcher, home: Path, served: Served, tmp_path: Path, shell: str) -> None:
    served.files["/gold.xlsx"] = b"PK\x03\x04 the gold workbook"
    evaluator = {"func": "compare_text_file", "result": {"type": "vm_file", "path": "/home/user/a.xlsx", "dest": "a"},
                 "expected": {"type": "cloud_file", "path": served.url + "/gold.xlsx", "dest": "gold.xlsx"},
                 "options": {"ignore_case": True}}
    script = check_of(evaluator, fetcher)
    assert 'python3 -m gh_osworld "$gh_w/spec.json"' in script
    kept = tmp_path / "kept"
    ran = run_script(script, home, shell=shell, path_prefix=guest_stand_in(tmp_path / "bin", kept))
    assert (ran.code, ran.verdict) == (0, "True"), ran.err
    spec, w = kept_spec(kept)
    assert spec == {"conj": "and", "metrics": [{
        "func": "compare_text_file", "result": {"type": "vm_file", "path": "/home/user/a.xlsx", "dest": "a"},
        "expected": {"type": "embedded_file", "path": f"{w}/e1.xlsx"}, "options": {"ignore_case": True}}]}
    # named with its dest's extension, as OSWorld keeps it: openpyxl opens no workbook by another name
    assert (kept / "w" / "e1.xlsx").read_bytes() == b"PK\x03\x04 the gold workbook"
    assert not Path(w).exists()  # the check's directory is gone when it ends


def test_no_verdict_from_gh_osworld_is_no_verdict_of_the_check(fetcher: Fetcher, home: Path, tmp_path: Path) -> None:
    script = check_of(task()["evaluator"], fetcher)
    ran = run_script(script, home, path_prefix=guest_stand_in(tmp_path / "bin", tmp_path / "k", "", code=1))
    assert ran.code == 1 and "True" not in ran.out and "False" not in ran.out


def test_the_real_gh_osworld_answers_the_check_as_the_guest_runs_it(fetcher: Fetcher, home: Path,
                                                                     served: Served, tmp_path: Path) -> None:
    """`python3` here is the host's /usr/bin/python3 with Debian's modules, as in the guest."""
    served.files["/gold.txt"] = b"one\ntwo\n"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to("/usr/bin/python3")
    evaluator = {"func": ["exact_match", "compare_text_file"], "conj": "and",
                 "result": [{"type": "vm_command_line", "command": "echo hi", "shell": True},
                            {"type": "vm_file", "path": str(home / "out.txt")}],
                 "expected": [{"type": "rule", "rules": {"expected": "hi\n"}},
                              {"type": "cloud_file", "path": served.url + "/gold.txt", "dest": "gold.txt"}]}
    script = check_of(evaluator, fetcher)
    env = {"PYTHONPATH": guest_env()["PYTHONPATH"]}  # the repository and the guest's pinned PyPI modules
    ran = run_script(script, home, path_prefix=bin_dir, env=env)
    assert (ran.code, ran.verdict) == (0, "False"), ran.err  # no out.txt yet: the agent's failure
    (home / "out.txt").write_text("one\ntwo\n")
    for phase in ("before", "after"):
        ran = run_script(script, home, phase=phase, path_prefix=bin_dir, env=env)
        assert (ran.code, ran.verdict) == (0, "True"), ran.err


def test_multi_cloud_files_give_the_files_osworld_gives(fetcher: Fetcher, home: Path, served: Served,
                                                        tmp_path: Path) -> None:
    served.files["/a.csv"], served.files["/b.csv"] = b"a\n", b"b\n"
    evaluator = {"func": "compare_text_file", "result": {"type": "vm_file", "path": "/x"},
                 "expected": {"type": "cloud_file", "multi": True, "gives": [0, 1],
                              "path": [served.url + "/a.csv", served.url + "/b.csv"], "dest": ["a.csv", "b.csv"]}}
    kept = tmp_path / "kept"
    assert run_script(check_of(evaluator, fetcher), home, path_prefix=guest_stand_in(tmp_path / "bin", kept)).code == 0
    spec, w = kept_spec(kept)
    assert spec["metrics"][0]["expected"] == {"type": "embedded_file", "paths": [f"{w}/e1/a.csv", f"{w}/e1/b.csv"],
                                              "multi": True}
    assert [(kept / "w" / "e1" / n).read_bytes() for n in ("a.csv", "b.csv")] == [b"a\n", b"b\n"]


def test_a_cache_file_is_the_postconfig_output_the_check_kept(fetcher: Fetcher, home: Path, tmp_path: Path) -> None:
    evaluator = {"func": "check_list", "result": {"type": "cache_file", "path": "accounts.csv"},
                 "expected": {"type": "rule", "rules": {"expect": ["x"]}},
                 "postconfig": [{"type": "execute", "parameters": {"command": ["echo", "user,x"],
                                                                    "stdout": "accounts.csv"}}]}
    kept = tmp_path / "kept"
    script = check_of(evaluator, fetcher)
    assert run_script(script, home, path_prefix=guest_stand_in(tmp_path / "bin", kept)).code == 0
    spec, w = kept_spec(kept)
    assert spec["metrics"][0]["result"] == {"type": "vm_file", "path": f"{w}/cache/accounts.csv"}
    assert (kept / "w" / "cache" / "accounts.csv").read_text() == "user,x\n"
    shutil.rmtree(kept)
    assert run_script(script, home, phase="before", path_prefix=guest_stand_in(tmp_path / "bin", kept)).code == 0
    assert not (kept / "w" / "cache" / "accounts.csv").exists()  # postconfig runs after only: missing, a failure


def test_names_gh_osworld_lacks_are_skipped_and_names_it_has_are_handed_over(
        fetcher: Fetcher, monkeypatch: pytest.MonkeyPatch) -> None:
    table = {"func": "compare_future", "result": {"type": "vm_file", "path": "/a.xlsx"},
             "expected": {"type": "vm_file", "path": "/b.xlsx"}}
    with pytest.raises(Skip) as e:
        check_of(table, fetcher)
    assert (e.value.reason, e.value.detail) == (SkipReason.UNSUPPORTED_METRIC, "evaluator: compare_future")
    # names.py is read at import time: a metric the guest gains is handed over at once.
    monkeypatch.setattr(check.guest_names, "METRICS", check.guest_names.METRICS | {"compare_future"})
    assert 'python3 -m gh_osworld "$gh_w/spec.json"' in check_of(table, fetcher)
    future = {"func": "compare_future", "result": {"type": "future_state", "dest": "x"},
              "expected": {"type": "rule", "rules": {}}}
    with pytest.raises(Skip) as e:
        check_of(future, fetcher)
    assert (e.value.reason, e.value.detail) == (SkipReason.UNSUPPORTED_GETTER, "evaluator.result: future_state")
    live = {"func": "compare_future", "result": {"type": "pdf_from_url", "path": "https://example.com/x"}}
    with pytest.raises(Skip) as e:
        check_of(live, fetcher)
    assert e.value.reason is SkipReason.LIVE_WEB


def test_vs_code_is_missing_with_its_reason(fetcher: Fetcher) -> None:
    with pytest.raises(Skip) as e:
        case_of(task(related_apps=["vs_code"]), fetcher, OSWORLD_DESKTOP)
    assert (e.value.reason, e.value.detail) == (
        SkipReason.APP_MISSING, "needs vs_code (VS Code is not in Debian), which osworld-desktop does not have")
    case = case_of(task(related_apps=["libreoffice_calc", "gimp", "vlc", "thunderbird", "chrome"]), fetcher,
                   OSWORLD_DESKTOP)
    assert case["start_state"] == OSWORLD_DESKTOP


@pytest.mark.parametrize(("params", "argv"), [
    ({"window_name": "Untitled 1 - LibreOffice Calc"}, "wmctrl -c Untitled 1 - LibreOffice Calc"),
    ({"window_name": "gimp", "by_class": True}, "wmctrl -xc gimp"),
    ({"window_name": "Terminal", "strict": True}, "wmctrl -Fc Terminal"),
])
def test_close_window_is_wmctrl_where_the_target_has_it(fetcher: Fetcher, home: Path, tmp_path: Path,
                                                        params: dict[str, Any], argv: str) -> None:
    log = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "wmctrl").write_text(f'#!/bin/sh\necho "wmctrl $*" >> {log}\n')
    (bin_dir / "wmctrl").chmod(0o755)
    config = [{"type": "close_window", "parameters": params}]
    script = str(case_of(task(config=config), fetcher, OSWORLD_DESKTOP)["setup_script"])
    assert run_script(script, home, path_prefix=bin_dir).code == 0
    assert log.read_text() == argv + "\n"
    with pytest.raises(Skip) as e:
        case_of(task(config=config, evaluator={"func": "infeasible"}), fetcher, "linux-desktop")
    assert (e.value.reason, e.value.detail) == (
        SkipReason.UNSUPPORTED_CONFIG, "config[0]: close_window needs wmctrl, which linux-desktop does not have")


def test_local_tabs_open_in_the_running_chrome(fetcher: Fetcher, home: Path, tmp_path: Path) -> None:
    config = [{"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["file:///home/user/a.html"]}}]
    script = str(case_of(task(config=config), fetcher, OSWORLD_DESKTOP)["setup_script"])
    assert "setsid google-chrome file:///home/user/a.html" in script


@pytest.mark.parametrize("shell", SHELLS)
def test_a_file_too_large_to_embed_is_placed_from_the_file_store(fetcher: Fetcher, home: Path, served: Served,
                                                                 tmp_path: Path, shell: str) -> None:
    big = random.Random(2).randbytes(200_000)  # gzip cannot shrink it
    served.files["/big.mp4"] = big
    config = [{"type": "download", "parameters": {"files": [{"url": served.url + "/big.mp4",
                                                              "path": str(home / "Videos/big.mp4")}]}}]
    store: dict[str, int] = {}
    from gh_local.osworld.importer import task_to_case
    from gh_local.osworld.target import Target
    from gh_local.osworld.task import LoadedTask, Task
    case = task_to_case(LoadedTask(Task.model_validate(task(config=config)), Path("t.json"), "os"),
                        Target.named(OSWORLD_DESKTOP), fetcher, store)
    script = str(case["setup_script"])
    digest = next(iter(store))
    assert store == {digest: 200_000} and f"gh_osworld_place {digest} " in script and len(script) < 10_000
    # The store is the Fetcher's layout: --files-dir is what the image builds it from.
    files_store = tmp_path / "files"
    assert (files_store / "sha256" / digest).read_bytes() == big
    ran = run_script(script, home, shell=shell, env={"GH_OSWORLD_FILE_STORE": str(files_store)})
    assert ran.code == 0, ran.err
    assert (home / "Videos/big.mp4").read_bytes() == big
    ran = run_script(script, home, shell=shell, env={"GH_OSWORLD_FILE_STORE": str(tmp_path / "empty")})
    assert ran.code == 1
    assert (f"the file sha256:{digest} is not in this start state's file store (image-builder/build "
            "osworld-desktop --files-dir DIR)") in ran.err
    damaged = tmp_path / "damaged"
    (damaged / "sha256").mkdir(parents=True)
    (damaged / "sha256" / digest).write_bytes(b"not it")
    ran = run_script(script, home, shell=shell, env={"GH_OSWORLD_FILE_STORE": str(damaged)})
    assert ran.code == 1 and "is damaged" in ran.err
    with pytest.raises(Skip) as e:  # no file store there
        case_of(task(config=config, evaluator={"func": "infeasible"}), fetcher, "linux-desktop")
    assert e.value.reason is SkipReason.DOWNLOAD_TOO_LARGE and "linux-desktop has no file store" in e.value.detail


def test_files_that_each_fit_but_together_pass_the_script_limit_all_come_from_the_file_store(
        fetcher: Fetcher, home: Path, served: Served, tmp_path: Path) -> None:
    # Three files of about 53,000 characters each once encoded: each fits a script, the three do not.
    files = {f"/part{i}.bin": random.Random(10 + i).randbytes(40_000) for i in range(3)}
    served.files.update(files)
    config = [{"type": "download", "parameters": {"files": [
        {"url": served.url + name, "path": str(home / "Documents" / name.strip("/"))} for name in files]}}]
    store: dict[str, int] = {}
    from gh_local.osworld.importer import task_to_case
    from gh_local.osworld.target import Target
    from gh_local.osworld.task import LoadedTask, Task
    case = task_to_case(LoadedTask(Task.model_validate(task(config=config)), Path("t.json"), "os"),
                        Target.named(OSWORLD_DESKTOP), fetcher, store)
    script = str(case["setup_script"])
    assert sorted(store.values()) == [40_000] * 3 and script.count("gh_osworld_place ") >= 3, script[:2000]
    assert len(script) < 20_000
    ran = run_script(script, home, env={"GH_OSWORLD_FILE_STORE": str(tmp_path / "files")})
    assert ran.code == 0, ran.err
    assert {n: (home / "Documents" / n.strip("/")).read_bytes() for n in files} == files
    with pytest.raises(Skip) as e:  # no file store there: the sum is too large for a script
        case_of(task(config=config, evaluator={"func": "infeasible"}), fetcher, "linux-desktop")
    assert e.value.reason is SkipReason.SCRIPT_TOO_LARGE


def test_compare_table_rules_gh_osworld_lacks_are_skipped(fetcher: Fetcher, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(check.guest_names, "METRICS", check.guest_names.METRICS | {"compare_table"})
    monkeypatch.setattr(check.guest_names, "TABLE_RULES", frozenset({"sheet_data"}), raising=False)
    rules: list[dict[str, Any]] = [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]
    table = {"func": "compare_table", "result": {"type": "vm_file", "path": "/a.xlsx"},
             "expected": {"type": "vm_file", "path": "/b.xlsx"}, "options": {"rules": rules}}
    assert "gh_osworld" in check_of(table, fetcher)
    rules.append({"type": "style", "sheet_idx0": 0, "sheet_idx1": "EI0"})
    with pytest.raises(Skip) as e:
        check_of(table, fetcher)
    assert (e.value.reason, e.value.detail) == (SkipReason.UNSUPPORTED_OPTION,
                                                "evaluator: compare_table rule of type style")


def test_the_import_says_which_files_the_store_must_hold_and_how_to_build_it(
        tmp_path: Path, served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    from gh_local.cli import main
    big = random.Random(3).randbytes(150_000)
    served.files["/big.bin"] = big
    ex = tmp_path / "examples" / "vlc"
    ex.mkdir(parents=True)
    config = [{"type": "download", "parameters": {"files": [{"url": served.url + "/big.bin",
                                                               "path": "/home/user/big.bin"}]}}]
    (ex / "v.json").write_text(json.dumps(task(id="v", related_apps=["vlc"], config=config)))
    files = tmp_path / "files"
    code = main(["import", "osworld", str(ex), "--out", str(tmp_path / "c.yaml"), "--files-dir", str(files)])
    out = capsys.readouterr().out
    assert code == 0
    digest = hashlib.sha256(big).hexdigest()
    assert out.splitlines()[-3:-1] == [
        "1 files (150,000 bytes) are too large to embed and are placed from the start state's file store; it must "
        f"hold sha256/{digest}",
        f"build it with: image-builder/build osworld-desktop --files-dir {files}"]


def test_a_start_state_of_your_own_can_be_like_osworld_desktop(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from gh_local.cli import main
    ex = tmp_path / "examples" / "os"
    ex.mkdir(parents=True)
    (ex / "t.json").write_text(json.dumps(task(id="t")))
    out = tmp_path / "c.yaml"
    # A name of its own: a plain desktop without gh_osworld, where no metric runs.
    assert main(["import", "osworld", str(ex), "--out", str(out), "--start-state", "mine"]) == 1
    assert "t: skipped: needs_gh_osworld" in capsys.readouterr().out
    assert main(["import", "osworld", str(ex), "--out", str(out), "--start-state", "mine",
                 "--like", "osworld-desktop"]) == 0
    (case,) = yaml.safe_load(out.read_text())["cases"]
    assert case["start_state"] == "mine" and "python3 -m gh_osworld" in case["success"]["check_script"]
    capsys.readouterr()
    assert main(["import", "osworld", str(ex), "--out", str(out), "--like", "ubuntu"]) == 2
    assert "--like ubuntu: not a start state the importer knows" in capsys.readouterr().err


def test_an_expected_file_too_large_to_embed_comes_from_the_file_store(
        fetcher: Fetcher, home: Path, served: Served, tmp_path: Path) -> None:
    big = random.Random(4).randbytes(120_000)
    served.files["/gold.bin"] = big
    evaluator = {"func": "compare_text_file", "result": {"type": "vm_file", "path": "/x"},
                 "expected": {"type": "cloud_file", "path": served.url + "/gold.bin", "dest": "gold.bin"}}
    script = check_of(evaluator, fetcher)
    assert f"gh_osworld_place {hashlib.sha256(big).hexdigest()} \"$gh_w/e1.bin\"" in script
    kept = tmp_path / "kept"
    ran = run_script(script, home, path_prefix=guest_stand_in(tmp_path / "bin", kept),
                     env={"GH_OSWORLD_FILE_STORE": str(tmp_path / "files")})
    assert (ran.code, ran.verdict) == (0, "True"), ran.err
    assert (kept / "w" / "e1.bin").read_bytes() == big
    ran = run_script(script, home, path_prefix=guest_stand_in(tmp_path / "bin", tmp_path / "k2"),
                     env={"GH_OSWORLD_FILE_STORE": str(tmp_path / "nothing")})
    assert ran.code == 1 and "is not in this start state's file store" in ran.err and "True" not in ran.out
