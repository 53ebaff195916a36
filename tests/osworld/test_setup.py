"""The config as a setup script: each step type, run with the host's dash (the X tools faked at their
command line, where the guest has xdotool and xdg-open), downloads from a real local server, and the
step types that are skipped, with their reasons."""

from __future__ import annotations

import hashlib
import random
import time
from pathlib import Path
from typing import Any

import pytest

from gh_local.osworld.fetch import Fetcher
from gh_local.osworld.skips import Skip, SkipReason

from .conftest import SHELLS, Served, case_of, run_script, task


def setup_of(config: list[dict[str, Any]], fetcher: Fetcher, start_state: str = "linux-desktop") -> str:
    # An `infeasible` evaluator: the one a start state without gh_osworld (linux-tiny) imports.
    return str(case_of(task(config=config, evaluator={"func": "infeasible"}), fetcher, start_state)["setup_script"])


def step(kind: str, **parameters: Any) -> dict[str, Any]:
    return {"type": kind, "parameters": parameters}


def fake_tools(bin_dir: Path, log: Path, *names: str) -> Path:
    """Stand-ins for the guest's X tools that record their argv, one call a line."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n')
        tool.chmod(0o755)
    return bin_dir


def wait_for(path: Path, seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("shell", SHELLS)
def test_execute_and_command_run_in_order_and_go_on_after_a_failure(fetcher: Fetcher, home: Path, shell: str) -> None:
    script = setup_of([step("execute", command=["sh", "-c", "echo one > ~/log"]),
                       step("command", command="false", shell=True),
                       step("execute", command="echo two >> ~/log", shell=True)], fetcher, "linux-tiny")
    ran = run_script(script, home, shell=shell)
    assert ran.code == 0, ran.err
    assert (home / "log").read_text() == "one\ntwo\n"


def test_sudo_and_python_as_osworld_says_them(fetcher: Fetcher, home: Path) -> None:
    # The host runs this as root without sudo, like linux-tiny: the shim runs the command.
    script = setup_of([step("execute", command="echo password | sudo -S sh -c 'id -u > ~/who'", shell=True)],
                      fetcher, "linux-tiny")
    assert run_script(script, home).code == 0
    assert (home / "who").read_text() == "0\n"
    program = "import sys, pathlib; pathlib.Path('py').write_text(sys.version[:1])"
    script = setup_of([step("execute", command=["python", "-c", program])], fetcher)
    assert run_script(script, home).code == 0
    assert (home / "py").read_text() == "3"


def test_launch_leaves_the_program_running(fetcher: Fetcher, home: Path) -> None:
    # The program waits (bounded) for a file the test writes only once the setup has returned: a setup
    # that waited for it would never return (run_script's timeout).
    program = "n=0; until [ -f ~/go ] || [ $n -ge 600 ]; do sleep 0.05; n=$((n+1)); done; echo up > ~/launched"
    script = setup_of([step("launch", command=["sh", "-c", program])], fetcher)
    assert run_script(script, home).code == 0
    (home / "go").write_text("")
    assert wait_for(home / "launched")
    with pytest.raises(Skip) as e:
        setup_of([step("launch", command="mousepad")], fetcher, "linux-tiny")
    assert (e.value.reason, e.value.detail) == (SkipReason.NEEDS_DESKTOP,
                                                "needs a desktop session, which linux-tiny does not have")


def test_open_activate_window_and_sleep(fetcher: Fetcher, home: Path, tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    bin_dir = fake_tools(tmp_path / "bin", log, "xdg-open", "xdotool")
    script = setup_of([step("open", path="/home/user/Report (final).docx"), step("sleep", seconds=0.2),
                       step("activate_window", window_name="Report.docx - LibreOffice", strict=True),
                       step("activate_window", window_name="Mousepad", by_class=True)], fetcher)
    assert run_script(script, home, path_prefix=bin_dir).code == 0
    assert wait_for(log)
    lines = log.read_text().splitlines()
    assert "xdg-open /home/user/Report (final).docx" in lines
    assert r"xdotool search --name Report\ \(final\)\.docx" in lines  # waits for the file's window
    assert r"xdotool search --name ^Report\.docx\ \-\ LibreOffice$ windowactivate --sync" in lines
    assert "xdotool search --class Mousepad windowactivate --sync" in lines
    assert "sleep 0.2" in script


def test_pyautogui_in_a_setup_ships_the_shim(fetcher: Fetcher, home: Path, tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    bin_dir = fake_tools(tmp_path / "bin", log, "xdotool")
    script = setup_of([step("execute", command=["python", "-c", "import pyautogui, time; pyautogui.click(10, 20); "
                                                "pyautogui.typewrite('hi there'); pyautogui.hotkey('ctrl', 's'); "
                                                "pyautogui.press('enter')"])], fetcher)
    ran = run_script(script, home, path_prefix=bin_dir)
    assert ran.code == 0, ran.err
    assert log.read_text().splitlines() == ["xdotool mousemove --sync 10 20", "xdotool click --repeat 1 --delay 1 1",
                                            "xdotool type --delay 12 -- hi there", "xdotool key -- ctrl+s",
                                            "xdotool key -- Return"]


@pytest.mark.parametrize("shell", SHELLS)
def test_download_places_the_file_and_keeps_it_by_content(fetcher: Fetcher, home: Path, served: Served,
                                                          tmp_path: Path, shell: str) -> None:
    blob = bytes(range(256)) * 40
    served.files["/data/sheet.xlsx"] = blob
    config = [step("download", files=[{"url": served.url + "/data/sheet.xlsx", "path": str(home / "Desktop/s.xlsx")}])]
    script = setup_of(config, fetcher, "linux-tiny")
    assert run_script(script, home, shell=shell).code == 0
    assert (home / "Desktop/s.xlsx").read_bytes() == blob
    assert (tmp_path / "files" / "sha256" / hashlib.sha256(blob).hexdigest()).read_bytes() == blob
    again = Fetcher(tmp_path / "files")  # a second import: from --files-dir, not the network
    assert setup_of(config, again, "linux-tiny") == script
    assert served.hits == {"/data/sheet.xlsx": 1}


def test_a_download_that_cannot_be_fetched_or_carried_is_skipped(fetcher: Fetcher, served: Served) -> None:
    with pytest.raises(Skip) as e:
        setup_of([step("download", files=[{"url": served.url + "/missing", "path": "/tmp/x"}])], fetcher)
    assert (e.value.reason, e.value.detail) == (SkipReason.DOWNLOAD_FAILED, "config[0]: 127.0.0.1: HTTP 404")
    with pytest.raises(Skip) as e:
        setup_of([step("download", files=[{"url": "http://127.0.0.1:9/x", "path": "/tmp/x"}])], fetcher)
    assert e.value.reason is SkipReason.DOWNLOAD_FAILED
    assert e.value.detail.startswith("config[0]: 127.0.0.1: ConnectError")
    served.files["/big.bin"] = random.Random(1).randbytes(200_000)  # gzip cannot shrink it
    with pytest.raises(Skip) as e:
        setup_of([step("download", files=[{"url": served.url + "/big.bin", "path": "/tmp/big.bin"}])], fetcher)
    assert e.value.reason is SkipReason.DOWNLOAD_TOO_LARGE
    assert "/tmp/big.bin is 200,000 bytes" in e.value.detail and "a script carries up to 90,000" in e.value.detail


@pytest.mark.parametrize(("config", "reason", "detail"), [
    (step("chrome_open_tabs", urls_to_open=["https://www.example.com/"]), SkipReason.LIVE_WEB,
     "config[0]: chrome_open_tabs opens https://www.example.com/"),
    (step("googledrive", settings_file="x.json", operation=["delete"]), SkipReason.GOOGLE_DRIVE,
     "config[0]: googledrive"),
    (step("login", platform="googledrive"), SkipReason.LOGIN, "config[0]: login to googledrive"),
    (step("update_browse_history", history=[]), SkipReason.UNSUPPORTED_CONFIG, "config[0]: update_browse_history"),
    (step("execute", command=["a"], until={"returns": 0}), SkipReason.UNSUPPORTED_OPTION,
     "config[0]: until {'returns': 0}"),
    (step("execute", command=3), SkipReason.UNSUPPORTED_OPTION, "config[0]: command 3 is not"),
])
def test_unsupported_steps_are_skipped_with_the_reason(fetcher: Fetcher, config: dict[str, Any], reason: SkipReason,
                                                       detail: str) -> None:
    with pytest.raises(Skip) as e:
        setup_of([config], fetcher)
    assert e.value.reason is reason
    assert e.value.detail.startswith(detail)


def test_a_download_that_cannot_be_placed_fails_the_setup(fetcher: Fetcher, home: Path, served: Served) -> None:
    served.files["/f"] = b"data"
    script = setup_of([step("download", files=[{"url": served.url + "/f", "path": "/proc/no/such/dir/f"}]),
                       step("execute", command="echo after > ~/after", shell=True)], fetcher, "linux-tiny")
    ran = run_script(script, home)
    assert ran.code == 1 and "cannot write /proc/no/such/dir/f" in ran.err
    assert not (home / "after").exists()  # it stops there: a setup that did not happen is an error, ours


@pytest.mark.parametrize("shell", SHELLS)
def test_execute_until_retries_until_the_output_says_so(fetcher: Fetcher, home: Path, shell: str) -> None:
    # Counts its runs in ~/n and says "ready" on the third.
    counting = 'n=$(cat ~/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > ~/n; [ $n -ge 3 ] && echo ready || echo wait'
    for until in ({"stdout": "ready"}, {"returncode": 0}):
        (home / "n").unlink(missing_ok=True)
        command = counting if "stdout" in until else counting + "; [ $n -ge 3 ]"
        script = setup_of([step("execute", command=command, shell=True, until=until),
                           step("execute", command="echo after > ~/after", shell=True)], fetcher, "linux-tiny")
        assert run_script(script, home, shell=shell).code == 0
        assert (home / "n").read_text().strip() == "3" and (home / "after").is_file()


@pytest.mark.parametrize("shell", SHELLS)
def test_an_execute_still_running_is_ended_as_osworld_ends_it_and_the_setup_goes_on(
        fetcher: Fetcher, home: Path, shell: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """OSWorld's server gives an execute 120 s (an xdg-open whose viewer stays in the foreground never
    returns): then it is ended, and the steps after it run."""
    from gh_local.osworld import setup
    monkeypatch.setattr(setup, "EXECUTE_WAIT", 1)
    script = setup_of([step("execute", command="echo started > ~/first; exec sleep 300", shell=True),
                       step("execute", command="echo after > ~/after", shell=True)], fetcher, "linux-tiny")
    ran = run_script(script, home, shell=shell)
    assert ran.code == 0, ran.err
    assert (home / "first").read_text() == "started\n" and (home / "after").read_text() == "after\n"
    assert "config[0]: still running after 1 s, ended as OSWorld ends it; the setup goes on" in ran.err


def test_execute_until_that_never_comes_fails_the_setup(fetcher: Fetcher, home: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from gh_local.osworld import setup
    monkeypatch.setattr(setup, "UNTIL_WAIT", 1)
    script = setup_of([step("execute", command=["false"], until={"returncode": 0}),
                       step("execute", command="echo after > ~/after", shell=True)], fetcher, "linux-tiny")
    ran = run_script(script, home)
    assert ran.code == 1 and "config[0]: the command did not reach its until in 1 s" in ran.err
    assert not (home / "after").exists()
