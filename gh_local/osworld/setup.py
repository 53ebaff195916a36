"""A task's `config` (and its evaluator's `postconfig`) as sh lines, step by step.

| step | becomes |
|---|---|
| execute, command | the command, waited for up to 120 s (then ended, as OSWorld's own server ends it); a non-zero exit
  or an end at 120 s does not stop the setup (OSWorld goes on too) |
| launch | the command started in its own session, left running (in the user's desktop on linux-desktop) |
| open | `xdg-open PATH` (or `exo-open`), then a wait (bounded) for a window named after the file |
| activate_window | `xdotool search` for the window (by name or class, strict or not), activated; a wait, bounded |
| sleep | `sleep SECONDS` |
| execute with until | the command again every 0.3 s until its exit code or output says so; 60 s, then the setup fails |
| download | the file fetched now (fetch.py) and written by the script from an embedded copy, or, too large to
  embed, placed from the start state's file store (`gh_osworld_place`, where the target carries one) |
| close_window | `wmctrl -c NAME` (`-x` by class, `-F` strict), where the target carries wmctrl |
| chrome_open_tabs (local or file URLs only) | `google-chrome URL...`: the running Chrome opens them as tabs |

`chrome_open_tabs` with web pages is `live_web`; `googledrive` is `google_drive`; `login` is `login`;
any other type is `unsupported_config`.
"""

from __future__ import annotations

import re
from typing import Any

from gh_local.osworld.fetch import Blob, Fetcher
from gh_local.osworld.script import Piece, command_text, embed_bytes, quote
from gh_local.osworld.skips import Skip, SkipReason
from gh_local.osworld.target import Carry, Need, Target
from gh_local.osworld.task import ConfigStep
from gh_server.api.schemas import SCRIPT_MAX

# What one embedded file may take of a script (SCRIPT_MAX characters, the API's limit), leaving room for
# the rest of the script; a setup with several files may still pass the limit: the importer checks the total.
EMBED_MAX = SCRIPT_MAX - 10_000
_GIO_TRASH = re.compile(r"^\s*gio trash (/[^\s'\"$`;&|<>]+)\s*$")
UNTIL_WAIT = 60  # seconds an `execute` with `until` is retried before the setup fails
WINDOW_WAIT = 30  # seconds a step waits for a window to appear, as OSWorld's own setup does
# OSWorld's server runs an `execute` with subprocess.run(timeout=120): a command still running then (an
# `xdg-open` whose viewer stays in the foreground) is ended and the setup goes on. Unbounded here, such a step
# held the whole setup until its 600 s bound, an error for a step OSWorld gets past.
EXECUTE_WAIT = 120


def _seconds(value: Any, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: seconds {value!r} is not a number")
    return str(int(value)) if float(value).is_integer() else f"{float(value):g}"


def _wait_for_window(search: str) -> list[str]:
    # A poll with a deadline: the window appears when the application has started, which takes as long as it takes.
    return [f"gh_n=0; until {search} >/dev/null 2>&1 || [ $gh_n -ge {WINDOW_WAIT * 2} ]; do "
            "sleep 0.5; gh_n=$((gh_n + 1)); done"]


def place_file(blob: Blob, dest: str, target: Target, what: str, where: str) -> Piece:
    """Lines that write `blob` to the sh word `dest`: embedded when it fits, else from the target's file store;
    raise Skip (download_too_large) when neither can carry it."""
    embedded = embed_bytes(blob.data, dest)
    encoded = sum(len(line) + 1 for line in embedded)
    if encoded <= EMBED_MAX and not target.store_every_file:
        return Piece(embedded)
    if target.carries(Carry.FILE_STORE):
        return Piece([f"gh_osworld_place {blob.sha256} {dest}"], store={blob.sha256: len(blob.data)})
    raise Skip(SkipReason.DOWNLOAD_TOO_LARGE,
               f"{where}: {what[:200]} is {len(blob.data):,} bytes, {encoded:,} characters compressed and "
               f"encoded; a script carries up to {EMBED_MAX:,} (the API's script limit is {SCRIPT_MAX:,}), and "
               f"{target.start_state} has no file store")


def _until(cmd: str, until: Any, where: str) -> list[str]:
    """OSWorld runs the command again, 0.3 s apart, until its exit code is `returncode` or its output holds
    `stdout` (or its errors `stderr`). OSWorld would try for ever; here UNTIL_WAIT seconds, then the setup
    fails (the start the task assumes did not come about: an error of the case, not the agent's)."""
    if not isinstance(until, dict) or not until or set(until) - {"returncode", "stdout", "stderr"}:
        raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: until {until!r}"[:300])
    tests = []
    if "returncode" in until:
        rc = until["returncode"]
        if isinstance(rc, bool) or not isinstance(rc, int):
            raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: until returncode {rc!r}"[:300])
        tests.append(f'[ "$gh_rc" = {rc} ]')
    for stream, file in (("stdout", '"$gh_uo"'), ("stderr", '"$gh_ue"')):
        if stream in until:
            text = until[stream]
            if not isinstance(text, str):
                raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: until {stream} {text!r}"[:300])
            tests.append(f"LC_ALL=C grep -qF -e {quote(text)} {file}" if text else "true")
    tries = int(UNTIL_WAIT / 0.3)
    return ['gh_uo=$(mktemp) && gh_ue=$(mktemp) || { echo "gh-runner import osworld: cannot make a temporary file" '
            '>&2; exit 1; }',
            "gh_n=0",
            f"while :; do {cmd} > \"$gh_uo\" 2> \"$gh_ue\" </dev/null; gh_rc=$?",
            f"  if {' || '.join(tests)}; then break; fi",
            f'  gh_n=$((gh_n + 1)); if [ $gh_n -ge {tries} ]; then rm -f "$gh_uo" "$gh_ue"; '
            f'echo "gh-runner import osworld: {where}: the command did not reach its until in {UNTIL_WAIT} s" >&2; '
            "exit 1; fi",
            "  sleep 0.3", "done", 'rm -f "$gh_uo" "$gh_ue"']


def translate_step(step: ConfigStep, fetcher: Fetcher, target: Target, where: str) -> Piece:
    p = step.parameters
    kind = step.type
    if kind in ("execute", "command"):
        cmd, needs = command_text(p.get("command"), p.get("shell", False), where)
        if p.get("until"):
            if p.get("stdout") or p.get("stderr"):
                raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: {kind} with `until` and kept output")
            return Piece(_until(cmd, p["until"], where), needs)
        redirects = ""
        for stream, fd in (("stdout", 1), ("stderr", 2)):
            name = p.get(stream)
            if not name:
                continue
            # OSWorld keeps the output in its cache directory, which a cache_file getter reads: only a check
            # has one ($gh_w/cache), so only a postconfig may keep output.
            if not where.startswith("evaluator.") or not isinstance(name, str) or "/" in name or name in (".", ".."):
                raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: {kind} with {stream} {name!r}"[:300])
            redirects += f' {fd}> "$gh_w/cache/"{quote(name)}'
        # `timeout -k` in GNU's coreutils and in BusyBox (linux-tiny) alike. When it ended the command, GNU's exits
        # 124 (137 after the KILL), BusyBox's with the signal's 143.
        bounded = f"timeout -k 5 {EXECUTE_WAIT} {cmd}{redirects}"
        ended = (f'{{ case $? in 124|137|143) echo "gh-runner import osworld: {where}: still running after '
                 f'{EXECUTE_WAIT} s, ended as OSWorld ends it; the setup goes on" >&2 ;; esac; }}')
        trashed = _GIO_TRASH.match(p["command"]) if isinstance(p.get("command"), str) else None
        if trashed and not redirects:
            # The file in the trash is what the task starts from: a trash that failed leaves it where the check
            # looks for it, and the check would pass untouched. The setup fails instead (the case's error).
            trash = quote(trashed.group(1))
            return Piece([f"{bounded} || {ended}",
                          f"if [ -e {trash} ]; then echo \"gh-runner import osworld: the setup could "
                          f"not put {trash} in the trash\" >&2; exit 1; fi"], needs)
        return Piece([f"{bounded} || {ended}"], needs)
    if kind == "launch":
        cmd, needs = command_text(p.get("command"), p.get("shell", False), where)
        return Piece([f"setsid {cmd} >/dev/null 2>&1 </dev/null &"], needs | {Need.SESSION})
    if kind == "open":
        path = p.get("path")
        if not isinstance(path, str) or not path:
            raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: open without a path")
        name = path.rstrip("/").rsplit("/", 1)[-1]
        # xdg-open where xdg-utils is installed, else XFCE's own opener (exo-open): both use the default app.
        return Piece(["gh_open=$(command -v xdg-open || command -v exo-open || echo xdg-open)",
                      f'setsid "$gh_open" {quote(path)} >/dev/null 2>&1 </dev/null &',
                      *_wait_for_window(f"xdotool search --name {quote(re.escape(name))}")], {Need.SESSION})
    if kind == "activate_window":
        window = p.get("window_name")
        if not isinstance(window, str) or not window:
            raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: activate_window without a window_name")
        pattern = f"^{re.escape(window)}$" if p.get("strict") else re.escape(window)
        search = f"xdotool search {'--class' if p.get('by_class') else '--name'} {quote(pattern)}"
        return Piece([*_wait_for_window(search), f"{search} windowactivate --sync >/dev/null 2>&1 || :"],
                     {Need.SESSION})
    if kind == "sleep":
        return Piece([f"sleep {_seconds(p.get('seconds'), where)}"])
    if kind == "download":
        return _download(p, fetcher, target, where)
    if kind == "close_window":
        window = p.get("window_name")
        if not isinstance(window, str) or not window:
            raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: close_window without a window_name")
        if not target.carries(Carry.WMCTRL):
            raise Skip(SkipReason.UNSUPPORTED_CONFIG,
                       f"{where}: close_window needs wmctrl, which {target.start_state} does not have")
        # OSWorld's own server runs `wmctrl -{x}{F}c NAME`: -x matches the class, -F the whole name exactly.
        flags = ("x" if p.get("by_class") else "") + ("F" if p.get("strict") else "")
        return Piece([f"wmctrl -{flags}c {quote(window)} >/dev/null 2>&1 || :"], {Need.SESSION})
    if kind == "chrome_open_tabs":
        urls = p.get("urls_to_open") or []
        if not isinstance(urls, list) or not urls or not all(isinstance(u, str) and u for u in urls):
            raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: chrome_open_tabs without urls_to_open")
        web = [u for u in urls if not u.startswith(("file:", "/", "about:", "chrome:"))]
        if web:
            raise Skip(SkipReason.LIVE_WEB, f"{where}: chrome_open_tabs opens {web[0][:200]}")
        # Chrome hands URLs given on its command line to the instance already running, as new tabs.
        return Piece([f"setsid google-chrome {' '.join(quote(u) for u in urls)} >/dev/null 2>&1 </dev/null &",
                      "sleep 2"], {Need.SESSION})
    if kind == "googledrive":
        raise Skip(SkipReason.GOOGLE_DRIVE, f"{where}: googledrive")
    if kind == "login":
        raise Skip(SkipReason.LOGIN, f"{where}: login to {str(p.get('platform') or 'an online service')[:100]}")
    raise Skip(SkipReason.UNSUPPORTED_CONFIG, f"{where}: {kind[:100]}")


def _download(p: dict[str, Any], fetcher: Fetcher, target: Target, where: str) -> Piece:
    files = p.get("files")
    if not isinstance(files, list) or not files:
        raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: download without files")
    out = Piece()
    for f in files:
        if not (isinstance(f, dict) and isinstance(f.get("url"), str) and isinstance(f.get("path"), str)):
            raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: a download file needs a url and a path")
        blob = fetcher.blob(f["url"], where)
        dest = quote(f["path"])
        out.lines.append(f'mkdir -p "$(dirname {dest})"')
        out.add(place_file(blob, dest, target, f["path"], where))
    return out


def translate_steps(steps: list[ConfigStep], fetcher: Fetcher, target: Target, where: str) -> Piece:
    out = Piece()
    for i, step in enumerate(steps):
        out.add(translate_step(step, fetcher, target, f"{where}[{i}]"))
    return out
