"""gh_osworld's VLC, GIMP, Thunderbird and VS Code checks on the guest's Python, against the files those
applications write (vlcrc, gimprc, prefs.js, msgFilterRules.dat, mbox folders, keybindings.json) made here
in their formats, read through the getters a check uses."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.net import free_port

from .kit import check, embedded, metric, rule, verdict, vm_file


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))  # the check's subprocess runs with this HOME
    return h


def judge(tmp: Path, func: str, result: dict[str, Any] | None, expected: dict[str, Any] | None) -> bool:
    return verdict(check(metric(func, result, expected)), tmp)


VLCRC = """\
[qt] # Qt interface
# Show background cone (boolean)
{bgcone}qt-bgcone=0
# Maximum volume (integer)
#qt-max-volume=125
# Volume slider colours (string)
#qt-slider-colours=153;210;153;20;210;20;255;199;15;245;39;29
[core]
# Record directory (string)
{record}input-record-path=/home/user/Desktop
# Play/Pause (string)
{key}global-key-play-pause=Ctrl+Space
#key-play-pause=Space
# Use only one instance when started from file manager (boolean)
{one}one-instance-when-started-from-file=0
"""


def test_vlcrc_settings(home: Path, tmp_path: Path) -> None:
    rc = home / ".config" / "vlc" / "vlcrc"
    config = {"type": "vlc_config", "dest": "vlcrc"}
    cases = [("check_qt_bgcone", rule(expected_qt_bgcone=0)),
             ("is_vlc_recordings_folder", rule(recording_file_path="/home/user/Desktop")),
             ("check_global_key_play_pause", rule(expected_global_key_play_pause=1)),
             ("check_one_instance_when_started_from_file", rule(expected_one_instance_when_started_from_file=0))]
    for func, want in cases:  # VLC never saved its preferences
        assert not judge(tmp_path, func, config, want), func
    rc.parent.mkdir(parents=True)
    rc.write_text(VLCRC.format(bgcone="#", record="#", key="#", one="#"))  # untouched: every option VLC's default
    for func, want in cases:
        assert not judge(tmp_path, func, config, want), func
    assert judge(tmp_path, "check_qt_max_volume", config, rule(expected_qt_max_volume=125))
    assert judge(tmp_path, "check_qt_slider_colours", config,
                 rule(type="match", expected_qt_slider_colours="153;210;153;20;210;20;255;199;15;245;39;29"))
    assert not judge(tmp_path, "check_qt_slider_colours", config, rule(type="blackish"))
    rc.write_text(VLCRC.format(bgcone="", record="", key="", one="")
                  .replace("#qt-max-volume=125", "qt-max-volume=200")
                  .replace("#qt-slider-colours=153;210;153;20;210;20;255;199;15;245;39;29",
                           "qt-slider-colours=0;0;0;20;20;20;10;10;10;99;99;99"))
    for func, want in cases:
        assert judge(tmp_path, func, config, want), func
    assert judge(tmp_path, "check_qt_max_volume", config, rule(expected_qt_max_volume=200))
    assert judge(tmp_path, "check_qt_slider_colours", config, rule(type="blackish"))
    assert not judge(tmp_path, "check_qt_minimal_view", config, rule(expected_qt_minimal_view=1))


class _Status(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != "Basic OnBhc3N3b3Jk":  # ":password"
            self.send_response(401)
            self.end_headers()
            return
        self.send_response(200)
        self.end_headers()
        self.wfile.write(type(self).body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def vlc_http() -> Iterator[tuple[int, type[_Status]]]:
    handler = type("Status", (_Status,), {})
    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield port, handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


STATUS = """<?xml version="1.0" encoding="utf-8" standalone="yes" ?><root><state>{state}</state><information>
<category name="meta"><info name='filename'>Never Gonna Give You Up.mp4</info></category></information></root>"""


def test_vlc_playing(vlc_http: tuple[int, type[_Status]], tmp_path: Path) -> None:
    port, handler = vlc_http
    status = {"type": "vlc_playing_info", "dest": "status.xml", "port": port}
    want = rule(type="file_name", file_name="Never Gonna Give You Up.mp4")
    handler.body = STATUS.format(state="playing").encode()
    assert judge(tmp_path, "is_vlc_playing", status, want)
    assert not judge(tmp_path, "is_vlc_playing", status, rule(type="file_name", file_name="Other.mp4"))
    handler.body = STATUS.format(state="paused").encode()
    assert not judge(tmp_path, "is_vlc_playing", status, want)
    handler.body = b"<html>not status"
    assert not judge(tmp_path, "is_vlc_playing", status, want)
    assert not judge(tmp_path, "is_vlc_playing", {**status, "port": free_port()}, want)


def test_vlc_fullscreen(tmp_path: Path) -> None:
    screen = {"type": "rule", "rules": {"width": 1920, "height": 1080}}
    assert judge(tmp_path, "is_vlc_fullscreen", {"type": "rule", "rules": {"width": 1920, "height": 1080}}, screen)
    assert not judge(tmp_path, "is_vlc_fullscreen", {"type": "rule", "rules": {"width": 800, "height": 600}}, screen)
    # no VLC window (the window getter gives None)
    assert not judge(tmp_path, "is_vlc_fullscreen", {"type": "time_diff_range"}, screen)


def test_gimp_config(home: Path, tmp_path: Path) -> None:
    rc = home / ".config" / "GIMP" / "2.10"
    rc.mkdir(parents=True)
    (rc / "gimprc").write_text('# GIMP gimprc\n\n(undo-levels 100)\n(theme "Light")\n')
    (rc / "action-history").write_text('(history-item "filters-vignette" 1)\n(history-item "other" 2)\n')
    gimprc = {"type": "gimp_config_file", "file_name": "gimprc", "dest": "gimprc"}
    history = {"type": "gimp_config_file", "file_name": "action-history", "dest": "action-history"}
    assert judge(tmp_path, "check_config_status", gimprc, rule(key="undo-levels", value="100"))
    assert judge(tmp_path, "check_config_status", gimprc, rule(key="theme", value='"Light"'))
    assert not judge(tmp_path, "check_config_status", gimprc, rule(key="undo-levels", value="5"))
    assert judge(tmp_path, "check_config_status", history, rule(key=["history-item", '"filters-vignette"'], value="1"))
    assert not judge(tmp_path, "check_config_status", history, rule(key=["history-item", '"other"'], value="1"))
    sessionrc = {"type": "gimp_config_file", "file_name": "sessionrc", "dest": "sessionrc"}
    assert not judge(tmp_path, "check_config_status", sessionrc, rule(key="hide-docks", value="yes"))


def test_thunderbird_prefs(tmp_path: Path) -> None:
    prefs = tmp_path / "prefs.js"
    prefs.write_text('// Mozilla User Preferences\nuser_pref("mail.identity.id1.htmlSigText", "Anonym\\nXYZ Lab");\n'
                     'user_pref("mail.identity.id1.auto_quote", false);\nuser_pref("extensions.activeThemeID", '
                     '"thunderbird-compact-dark@mozilla.org");\n')
    r = vm_file(prefs)
    assert judge(tmp_path, "check_thunderbird_prefs", r,
                 rule(expect={"mail.identity.id1.htmlSigText": {"method": "re.S", "ref": "Anonym.+XYZ Lab"}}))
    assert judge(tmp_path, "check_thunderbird_prefs", r,
                 rule(expect={"mail.identity.id1.auto_quote": {"method": "eq", "ref": False},
                              "extensions.activeThemeID": {"method": "re", "ref": "dark"}}))
    assert not judge(tmp_path, "check_thunderbird_prefs", r,
                     rule(expect={"mail.identity.id1.auto_quote": {"method": "eq", "ref": True}}))
    assert not judge(tmp_path, "check_thunderbird_prefs", r,
                     rule(expect={"mail.server.default.applyIncomingFilters": {"method": "eq", "ref": True}}))
    assert not judge(tmp_path, "check_thunderbird_prefs", r,
                     rule(unexpect={"extensions.activeThemeID": {"method": "re", "ref": "dark"}}))
    assert not judge(tmp_path, "check_thunderbird_prefs", vm_file(tmp_path / "none.js"), rule(expect={}))


FILTERS = """version="9"
logging="no"
name="Forward"
enabled="yes"
type="17"
action="Forward"
actionValue="anonym-x2024@gmail.com"
condition="OR (subject,contains,\\"the lab\\") OR (from,contains,boss)"
name="Old"
enabled="no"
type="17"
action="Move to folder"
actionValue="mailbox://nobody@Local%20Folders/Old"
condition="ALL"
"""


def test_thunderbird_filter(tmp_path: Path) -> None:
    (tmp_path / "msgFilterRules.dat").write_text(FILTERS)
    r = vm_file(tmp_path / "msgFilterRules.dat")
    assert judge(tmp_path, "check_thunderbird_filter", r, rule(expect=[
        {"enabled": "yes", "action": "Forward", "actionValue": "anonym-x2024@gmail.com",
         "condition": ['OR (subject,contains,"the lab")', "OR (from,contains,boss)"]}]))
    assert judge(tmp_path, "check_thunderbird_filter", r, rule(expect=[{"name": "Old", "condition": ["ALL"]}]))
    assert not judge(tmp_path, "check_thunderbird_filter", r, rule(expect=[{"name": "Forward", "enabled": "no"}]))
    assert not judge(tmp_path, "check_thunderbird_filter", r, rule(unexpect=[{"name": "Old"}]))
    assert not judge(tmp_path, "check_thunderbird_filter", vm_file(tmp_path / "none.dat"), rule(expect=[]))


MBOX = """From - Mon Jan 01 00:00:00 2024
X-Mozilla-Status: {status}
Subject: {subject}

Body of {subject}
"""


def test_thunderbird_folder_scores_as_osworld_does(tmp_path: Path) -> None:
    """desktop-env 1.0.2 compares only the blank parts of a folder split at "FROM - " (thunderbird.py
    osworld_messages): any two folders with mail score 1, a folder with mail against an empty one 0."""
    gold = tmp_path / "gold"
    gold.write_text(MBOX.format(status="0001", subject="Invoice") + MBOX.format(status="0001", subject="Receipt"))
    same = tmp_path / "Bills"
    same.write_text(MBOX.format(status="0000", subject="Receipt") + MBOX.format(status="0000", subject="Invoice")
                    + MBOX.format(status="0009", subject="Deleted"))
    fewer = tmp_path / "Fewer"
    fewer.write_text(MBOX.format(status="0001", subject="Invoice"))
    empty = tmp_path / "Empty"
    empty.write_text("")
    assert verdict(check(metric("check_thunderbird_folder", vm_file(same), embedded(gold), ignore_status=True)),
                   tmp_path)
    assert verdict(check(metric("check_thunderbird_folder", vm_file(fewer), embedded(gold))), tmp_path)
    assert not verdict(check(metric("check_thunderbird_folder", vm_file(empty), embedded(gold))), tmp_path)
    assert verdict(check(metric("check_thunderbird_folder", vm_file(empty), embedded(empty))), tmp_path)
    assert not verdict(check(metric("check_thunderbird_folder", vm_file(tmp_path / "none"), embedded(gold))),
                       tmp_path)


def test_vscode_extensions_and_keybindings(tmp_path: Path) -> None:
    listing = {"type": "vm_command_line", "command": ["printf", "ms-python.python\nmattn.lisp\n"]}
    assert judge(tmp_path, "is_extension_installed", listing, rule(type="contain", expected="mattn.lisp"))
    assert not judge(tmp_path, "is_extension_installed", listing, rule(type="contain", expected="njpwerner.x"))
    assert not judge(tmp_path, "is_extension_installed", listing, rule(type="not_contain", expected="mattn.lisp"))
    # `code` missing from the machine: no output, the check fails
    missing = {"type": "vm_command_line", "command": ["/no/such/code", "--list-extensions"]}
    assert not judge(tmp_path, "is_extension_installed", missing, rule(type="contain", expected="mattn.lisp"))

    keys = tmp_path / "keybindings.json"
    binding = {"key": "ctrl+j", "command": "workbench.action.focusActiveEditorGroup", "when": "terminalFocus"}
    keys.write_text("// Place your key bindings in this file to override the defaults\n" + json.dumps([binding]))
    assert judge(tmp_path, "check_json_keybindings", vm_file(keys), rule(expected=binding))
    assert not judge(tmp_path, "check_json_keybindings", vm_file(keys), rule(expected={**binding, "key": "ctrl+k"}))
    keys.write_text(json.dumps({"not": "a list"}))
    assert not judge(tmp_path, "check_json_keybindings", vm_file(keys), rule(expected=binding))
