"""A task's `config` (and its evaluator's `postconfig`) as sh lines, step by step.

| step | becomes |
|---|---|
| execute, command | the command, waited for; a non-zero exit does not stop the setup (OSWorld goes on too) |
| launch | the command started in its own session, left running (in the user's desktop on linux-desktop) |
| open | `xdg-open PATH` (or `exo-open`), then a wait (bounded) for a window named after the file |
| activate_window | `xdotool search` for the window (by name or class, strict or not), activated; a wait, bounded |
| sleep | `sleep SECONDS` |
| download | the file fetched now (fetch.py) and written by the script from an embedded copy |

`chrome_open_tabs` with web pages is `live_web`; `googledrive` is `google_drive`; `login` is `login`;
any other type is `unsupported_config`.
"""

from __future__ import annotations

import re
from typing import Any

from gh_local.osworld.fetch import Fetcher
from gh_local.osworld.script import Piece, command_text, embed_bytes, quote
from gh_local.osworld.skips import Skip, SkipReason
from gh_local.osworld.target import Need
from gh_local.osworld.task import ConfigStep
from gh_server.api.schemas import SCRIPT_MAX

# What one embedded file may take of a script (SCRIPT_MAX characters, the API's limit), leaving room for
# the rest of the script; a setup with several files may still pass the limit: the importer checks the total.
EMBED_MAX = SCRIPT_MAX - 10_000
WINDOW_WAIT = 30  # seconds a step waits for a window to appear, as OSWorld's own setup does


def _seconds(value: Any, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: seconds {value!r} is not a number")
    return str(int(value)) if float(value).is_integer() else f"{float(value):g}"


def _wait_for_window(search: str) -> list[str]:
    # A poll with a deadline: the window appears when the application has started, which takes as long as it takes.
    return [f"gh_n=0; until {search} >/dev/null 2>&1 || [ $gh_n -ge {WINDOW_WAIT * 2} ]; do "
            "sleep 0.5; gh_n=$((gh_n + 1)); done"]


def translate_step(step: ConfigStep, fetcher: Fetcher, where: str) -> Piece:
    p = step.parameters
    kind = step.type
    if kind in ("execute", "command"):
        if p.get("until"):
            raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: {kind} with `until` (a retry on the output)")
        cmd, needs = command_text(p.get("command"), p.get("shell", False), where)
        return Piece([f"{cmd} || :"], needs)
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
        return _download(p, fetcher, where)
    if kind == "chrome_open_tabs":
        urls = p.get("urls_to_open") or []
        web = [u for u in urls if isinstance(u, str) and u.startswith(("http://", "https://"))]
        if web:
            raise Skip(SkipReason.LIVE_WEB, f"{where}: chrome_open_tabs opens {web[0][:200]}")
        raise Skip(SkipReason.UNSUPPORTED_CONFIG, f"{where}: chrome_open_tabs (Chrome's debugging port)")
    if kind == "googledrive":
        raise Skip(SkipReason.GOOGLE_DRIVE, f"{where}: googledrive")
    if kind == "login":
        raise Skip(SkipReason.LOGIN, f"{where}: login to {str(p.get('platform') or 'an online service')[:100]}")
    raise Skip(SkipReason.UNSUPPORTED_CONFIG, f"{where}: {kind[:100]}")


def _download(p: dict[str, Any], fetcher: Fetcher, where: str) -> Piece:
    files = p.get("files")
    if not isinstance(files, list) or not files:
        raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: download without files")
    lines: list[str] = []
    for f in files:
        if not (isinstance(f, dict) and isinstance(f.get("url"), str) and isinstance(f.get("path"), str)):
            raise Skip(SkipReason.UNSUPPORTED_OPTION, f"{where}: a download file needs a url and a path")
        data = fetcher.get(f["url"], where)
        dest = quote(f["path"])
        embedded = embed_bytes(data, dest)
        encoded = sum(len(line) + 1 for line in embedded)
        if encoded > EMBED_MAX:
            raise Skip(SkipReason.DOWNLOAD_TOO_LARGE,
                       f"{where}: {f['path'][:200]} is {len(data):,} bytes, {encoded:,} characters compressed and "
                       f"encoded; a script carries up to {EMBED_MAX:,} (the API's script limit is {SCRIPT_MAX:,})")
        lines += [f'mkdir -p "$(dirname {dest})"', *embedded]
    return Piece(lines)


def translate_steps(steps: list[ConfigStep], fetcher: Fetcher, where: str) -> Piece:
    out = Piece()
    for i, step in enumerate(steps):
        out.add(translate_step(step, fetcher, f"{where}[{i}]"))
    return out
