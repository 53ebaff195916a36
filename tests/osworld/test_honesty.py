"""What makes an imported check honest: the checkers a postconfig downloads are the check's own, in both
phases; the check runs in OSWorld's locale and reads text as OSWorld does; the setup establishes the
snapshot's state a check depends on; the import warns of a check that may pass untouched; and a lab without
network imports from --files-dir alone. Scripts run with the host's dash and bash."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from osworld_guest.kit import guest_env

from gh_local.cli import main
from gh_local.osworld.fetch import Fetcher
from gh_osworld.names import VIDEO_TYPES

from .conftest import SHELLS, Served, case_of, run_script, task, write_task


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["import", "osworld", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def eval_sh_task(url: str) -> dict[str, Any]:
    """OSWorld's shape: the checker arrives in postconfig and the check runs it."""
    return task(evaluator={
        "func": "check_include_exclude",
        "result": {"type": "vm_command_line", "command": "./eval.sh", "shell": True},
        "expected": {"type": "rule", "rules": {"include": ["Success"], "exclude": []}},
        "postconfig": [{"type": "download", "parameters": {"files": [{"url": url, "path": "eval.sh"}]}},
                       {"type": "execute", "parameters": {"command": "chmod +x eval.sh", "shell": True}}]})


@pytest.mark.parametrize("shell", SHELLS)
def test_a_postconfig_checker_is_written_by_the_check_in_both_phases(
        fetcher: Fetcher, home: Path, served: Served, shell: str) -> None:
    served.files["/eval.sh"] = b'#!/bin/sh\n[ -f "$HOME/done" ] && echo Success || echo "Not yet"\n'
    script = case_of(eval_sh_task(served.url + "/eval.sh"), fetcher)["success"]["check_script"]
    before = run_script(script, home, shell=shell, phase="before")
    # Before: the checker ran and said no (not False because it was missing), and it is gone again, so the
    # agent never sees it.
    assert (before.code, before.verdict) == (0, "False")
    assert not (home / "eval.sh").exists()
    (home / "eval.sh").write_text("#!/bin/sh\necho Success\n")  # an agent's forgery: overwritten by the check
    assert run_script(script, home, shell=shell, phase="after").verdict == "False"
    (home / "done").write_text("")
    assert run_script(script, home, shell=shell, phase="before").verdict == "True"  # it proves something before
    assert run_script(script, home, shell=shell, phase="after").verdict == "True"


def test_a_checker_path_the_start_already_has_is_kept_after_the_check_before(
        fetcher: Fetcher, home: Path, served: Served) -> None:
    served.files["/eval.sh"] = b"#!/bin/sh\necho Success\n"
    data = eval_sh_task(served.url + "/eval.sh")
    data["evaluator"]["postconfig"][0]["parameters"]["files"][0]["path"] = "my checks/eval.sh"
    data["evaluator"]["result"]["command"] = "'./my checks/eval.sh'"
    data["evaluator"]["postconfig"][1]["parameters"] = {"command": ["chmod", "+x", "my checks/eval.sh"]}
    script = case_of(data, fetcher)["success"]["check_script"]
    assert run_script(script, home, phase="before").verdict == "True"
    assert not (home / "my checks" / "eval.sh").exists()  # a path with a blank, quoted, written and removed
    (home / "my checks" / "eval.sh").write_text("the start state's own\n")
    assert run_script(script, home, phase="before").verdict == "True"
    assert (home / "my checks" / "eval.sh").is_file()  # the start state had a file there: it stays


@pytest.mark.parametrize("shell", SHELLS)
def test_the_check_runs_in_osworlds_locale_where_the_guest_has_it(fetcher: Fetcher, home: Path, tmp_path: Path,
                                                                  shell: str) -> None:
    evaluator = {"func": "exact_match", "result": {"type": "vm_command_line", "command": "echo $LC_ALL/$LANG",
                                                   "shell": True},
                 "expected": {"type": "rule", "rules": {"expected": "en_US.UTF-8/en_US.UTF-8\n"}}}
    script = case_of(task(evaluator=evaluator), fetcher)["success"]["check_script"]
    assert run_script(script, home, shell=shell).verdict == "False"  # this host has no en_US.UTF-8
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "locale").write_text("#!/bin/sh\nprintf 'C\\nC.utf8\\nen_US.utf8\\nPOSIX\\n'\n")
    (bin_dir / "locale").chmod(0o755)
    assert run_script(script, home, shell=shell, path_prefix=bin_dir).verdict == "True"


@pytest.mark.parametrize("shell", SHELLS)
def test_command_output_is_read_with_universal_newlines(fetcher: Fetcher, home: Path, shell: str) -> None:
    rules = {"expected": "a\nb\nc\n"}
    evaluator = {"func": "exact_match",
                 "result": {"type": "vm_command_line", "command": "printf 'a\\r\\nb\\rc\\r\\n'", "shell": True},
                 "expected": {"type": "rule", "rules": rules}}
    script = case_of(task(evaluator=evaluator), fetcher)["success"]["check_script"]
    assert run_script(script, home, shell=shell).verdict == "True"
    rules["expected"] = "a\nb\nc"  # a trailing newline still counts, as in OSWorld
    script = case_of(task(evaluator=evaluator), fetcher)["success"]["check_script"]
    assert run_script(script, home, shell=shell).verdict == "False"


def test_compare_text_file_reads_both_files_as_text(fetcher: Fetcher, home: Path, served: Served) -> None:
    served.files["/gold.txt"] = b"one\ntwo\n"
    (home / "out.txt").write_bytes(b"one\r\ntwo\r\n")
    evaluator = {"func": "compare_text_file", "result": {"type": "vm_file", "path": str(home / "out.txt")},
                 "expected": {"type": "cloud_file", "path": served.url + "/gold.txt"}}
    script = case_of(task(evaluator=evaluator), fetcher)["success"]["check_script"]
    assert run_script(script, home).verdict == "True"
    (home / "out.txt").write_bytes(b"one\r\ntwo\r\nthree\n")
    assert run_script(script, home).verdict == "False"


VOLUME = task(id="volume", instruction="The volume is too small. Turn it up to the max.", evaluator={
    "func": "exact_match",
    "result": {"type": "vm_command_line", "shell": True,
               "command": "pulseaudio --start\npactl list sinks | grep '^[[:space:]]Volume:' | head -n 1 | "
                          "awk '{print $5}' | sed 's/%//g'"},
    "expected": {"type": "rule", "rules": {"expected": "100\n"}}})


def test_the_setup_establishes_the_snapshots_volume(fetcher: Fetcher, home: Path, tmp_path: Path) -> None:
    """A sink at 100% (linux-desktop's) would make the check pass untouched: the setup lowers it first."""
    volume = tmp_path / "volume"
    volume.write_text("100")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pulseaudio").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "pactl").write_text(
        f'#!/bin/sh\ncase "$1" in\n  set-sink-volume) echo "$3" | tr -d % > {volume} ;;\n'
        f'  list) printf "Sink #0\\n\\tVolume: front-left: 65536 /  $(cat {volume})%% / 0.00 dB\\n" ;;\nesac\n')
    for tool in ("pulseaudio", "pactl"):
        (bin_dir / tool).chmod(0o755)
    case = case_of(VOLUME, fetcher)
    check = case["success"]["check_script"]
    assert run_script(check, home, path_prefix=bin_dir).verdict == "True"  # the untouched start without it
    assert "OSWorld's snapshot: the sink below 100%" in case["setup_script"]
    assert run_script(case["setup_script"], home, path_prefix=bin_dir).code == 0
    assert volume.read_text().strip() == "50"
    assert run_script(check, home, path_prefix=bin_dir).verdict == "False"


UTC = task(id="utc", instruction="I want to set my current time zone to UTC+0.", evaluator={
    "func": "is_utc_0", "result": {"type": "vm_command_line", "command": "timedatectl status", "shell": True}})


def test_the_setup_leaves_utc_for_a_task_that_asks_for_it(fetcher: Fetcher, home: Path, tmp_path: Path) -> None:
    """Our images run in UTC: the check of "set the time zone to UTC+0" printed True on osworld-desktop before
    the agent acted. The setup moves the zone away first, through sudo as the session's user has it."""
    zone = tmp_path / "zone"
    zone.write_text("Etc/UTC (UTC, +0000)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sudo").write_text('#!/bin/sh\n[ "$1" = -n ] && shift\nexec "$@"\n')
    (bin_dir / "timedatectl").write_text(
        f'#!/bin/sh\ncase "$1" in\n  set-timezone) [ "$2" = America/Los_Angeles ] && '
        f'echo "America/Los_Angeles (PST, -0800)" > {zone} ;;\n'
        f'  status) printf "Local time: x\\nUniversal time: x\\nRTC time: x\\nTime zone: %s\\n" "$(cat {zone})" ;;\n'
        f'esac\n')
    for tool in ("sudo", "timedatectl"):
        (bin_dir / tool).chmod(0o755)
    case = case_of(UTC, fetcher, "osworld-desktop")
    assert "OSWorld's snapshot: a time zone other than UTC" in case["setup_script"]
    assert run_script(case["setup_script"], home, path_prefix=bin_dir).code == 0
    assert zone.read_text() == "America/Los_Angeles (PST, -0800)\n"


VLC = task(id="vlc", instruction="Could you help me set the default video player as VLC?", evaluator={
    "func": "check_include_exclude", "result": {"type": "default_video_player"},
    "expected": {"type": "rule", "rules": {"include": ["vlc.desktop"]}}})


def test_the_setup_makes_a_player_other_than_vlc_the_default(fetcher: Fetcher, home: Path, tmp_path: Path) -> None:
    """With VLC osworld-desktop's only player, xdg-mime answered vlc.desktop and "make VLC the default"
    printed True before the agent acted (multi_apps 937087b6). The setup makes Ubuntu's player, Totem (in
    the image), the default first."""
    defaults = tmp_path / "defaults"
    defaults.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # xdg-mime as it behaves: `default APP TYPE...` records APP; `query default TYPE` names the recorded
    # application, or with none recorded the one the system lists (VLC)
    (bin_dir / "xdg-mime").write_text(
        f'#!/bin/sh\nd={defaults}\ncase "$1" in\n'
        f'  default) app=$2; shift 2; for t; do echo "$app" > "$d/$(echo "$t" | tr / _)"; done ;;\n'
        f'  query) f="$d/$(echo "$3" | tr / _)"; if [ -f "$f" ]; then cat "$f"; else echo vlc.desktop; fi ;;\n'
        f'esac\nexit 0\n')
    (bin_dir / "xdg-mime").chmod(0o755)
    (bin_dir / "python3").symlink_to("/usr/bin/python3")  # gh_osworld on the guest's Python, as there
    env = {"PYTHONPATH": guest_env()["PYTHONPATH"]}
    case = case_of(VLC, fetcher, "osworld-desktop")
    check = case["success"]["check_script"]
    assert run_script(check, home, path_prefix=bin_dir, env=env).verdict == "True"  # untouched, without it
    assert "OSWorld's snapshot: GNOME's Videos (Totem) as the default video player" in case["setup_script"]
    assert run_script(case["setup_script"], home, path_prefix=bin_dir).code == 0
    assert (defaults / "video_mp4").read_text() == "org.gnome.Totem.desktop\n"
    assert run_script(check, home, path_prefix=bin_dir, env=env).verdict == "False"
    subprocess.run([str(bin_dir / "xdg-mime"), "default", "vlc.desktop", *(f"video/{t}" for t in VIDEO_TYPES)],
                   check=True)  # the agent's fix
    assert run_script(check, home, path_prefix=bin_dir, env=env).verdict == "True"


def test_a_trash_that_fails_fails_the_setup(fetcher: Fetcher, home: Path, tmp_path: Path) -> None:
    poster = home / "Desktop" / "poster.webp"
    poster.parent.mkdir()
    poster.write_text("x")
    config = [{"type": "execute", "parameters": {"command": f"gio trash {poster}", "shell": True}}]
    script = case_of(task(config=config), fetcher)["setup_script"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gio").write_text("#!/bin/sh\necho 'gio: command failed' >&2; exit 1\n")
    (bin_dir / "gio").chmod(0o755)
    ran = run_script(script, home, path_prefix=bin_dir)
    assert ran.code == 1 and "could not put" in ran.err and "in the trash" in ran.err
    (bin_dir / "gio").write_text('#!/bin/sh\nmkdir -p "$HOME/.local/share/Trash/files"; mv "$2" '
                                 '"$HOME/.local/share/Trash/files/"\n')
    assert run_script(script, home, path_prefix=bin_dir).code == 0
    assert not poster.exists()


def test_import_warns_of_checks_that_may_pass_untouched(tmp_path: Path, served: Served,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    served.files["/f.txt"] = b"original\n"
    ex = tmp_path / "examples" / "os"
    write_task(ex, task(id="exclude-only", evaluator={
        "func": "check_include_exclude", "result": {"type": "vm_command_line", "command": "ls", "shell": True},
        "expected": {"type": "rule", "rules": {"include": [], "exclude": ["secret.txt"]}}}))
    write_task(ex, task(id="same-file", config=[{"type": "download", "parameters": {"files": [
        {"url": served.url + "/f.txt", "path": "/home/user/f.txt"}]}}], evaluator={
        "func": "compare_text_file", "result": {"type": "vm_file", "path": "/home/user/f.txt"},
        "expected": {"type": "cloud_file", "path": served.url + "/f.txt"}}))
    write_task(ex, task(id="fine"))
    code, out, err = run(capsys, str(ex), "--out", str(tmp_path / "c.yaml"), "--files-dir", str(tmp_path / "f"))
    assert code == 0, err
    lines = out.splitlines()
    assert ("exclude-only: warning: its check may print True on the untouched start (check_include_exclude with "
            "only exclude rules); `gh-runner validate` proves whether it does") in lines
    assert ("same-file: warning: its check may print True on the untouched start (compare_text_file compares "
            "/home/user/f.txt with the file the setup put there); `gh-runner validate` proves whether it does") in lines
    assert not any(line.startswith("fine: warning") for line in lines)
    assert "3 tasks: 3 imported, 0 skipped, 2 warned (may pass untouched)" in lines


def test_fetch_only_then_an_offline_import_never_reaches_the_network(
        tmp_path: Path, served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    served.files["/notes.txt"] = b"milk\n"
    served.files["/gold.txt"] = b"gold\n"
    ex = tmp_path / "examples"
    write_task(ex / "vlc", task(id="dl", related_apps=["vlc"], config=[{"type": "download", "parameters": {
        "files": [{"url": served.url + "/notes.txt", "path": "/home/user/notes.txt"}]}}]))
    write_task(ex / "os", task(id="gold", evaluator={
        "func": "compare_text_file", "result": {"type": "vm_file", "path": "/home/user/x"},
        "expected": {"type": "cloud_file", "path": served.url + "/gold.txt"}}))
    write_task(ex / "os", task(id="gone", config=[{"type": "download", "parameters": {
        "files": [{"url": served.url + "/gone", "path": "/home/user/gone"}]}}]))
    files = tmp_path / "lab-files"
    code, out, _ = run(capsys, str(ex), "--fetch-only", "--files-dir", str(files), "--out", str(tmp_path / "c.yaml"))
    assert code == 1  # one failed
    assert out.splitlines() == ["gone: download_failed (gone: 127.0.0.1: HTTP 404)",
                                f"3 tasks need 3 files: 2 in {files}, 1 failed; no cases written"]
    assert not (tmp_path / "c.yaml").exists()
    assert json.loads((files / "urls.json").read_text()).keys() == {served.url + "/notes.txt", served.url + "/gold.txt"}
    hits = dict(served.hits)
    # The lab: --files-dir copied over, no network.
    code, out, err = run(capsys, str(ex), "--offline", "--files-dir", str(files), "--out", str(tmp_path / "c.yaml"),
                         "--start-state", "ubuntu-osworld", "--like", "osworld-desktop")
    assert code == 0, err
    assert served.hits == hits
    assert "dl: imported" in out and "gold: imported" in out
    code, _, err = run(capsys, str(ex), "--offline", "--fetch-only", "--files-dir", str(files))
    assert code == 2 and "--fetch-only fetches; it cannot be --offline" in err
    assert ("gone: skipped: download_failed (config[0]: 127.0.0.1: not in --files-dir (run --fetch-only where "
            "there is network))") in out


def test_a_metric_that_compares_with_the_original_on_purpose_is_not_warned(served: Served) -> None:
    from gh_local.osworld.task import Task
    from gh_local.osworld.untouched import may_pass_untouched
    url = served.url + "/deck.pptx"
    data = task(config=[{"type": "download", "parameters": {"files": [{"url": url, "path": "/home/user/d.pptx"}]}}],
                evaluator={"func": "check_image_stretch_and_center",
                           "result": {"type": "vm_file", "path": "/home/user/d.pptx"},
                           "expected": {"type": "cloud_file", "path": url}})
    assert may_pass_untouched(Task.model_validate(data)) is None
    data["evaluator"]["func"] = "compare_pptx_files"
    assert may_pass_untouched(Task.model_validate(data)) == (
        "compare_pptx_files compares /home/user/d.pptx with the file the setup put there")
