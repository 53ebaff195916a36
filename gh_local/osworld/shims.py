"""What OSWorld's commands assume of the guest, shipped in the generated scripts when a task needs it.

OSWorld's tasks say `python` (meaning python3), `import pyautogui` in their GUI steps, and
`echo password | sudo -S ...`. The preamble puts, in a per-user directory first on PATH/PYTHONPATH:
- `python` running python3 (Debian has no `python`);
- `pyautogui.py`, our xdotool-backed module (pyautogui_shim.py), unless the real one is importable:
  the guest has xdotool and no network to install pyautogui from, and a shim runs the task's own code,
  where a translation at import time would have to understand arbitrary Python;
- `sudo` running the command as is, only where there is no sudo and the script already runs as root
  (linux-tiny). On linux-desktop sudo asks no password, so `echo password | sudo -S` works unchanged.
The directory stays after the setup: a program the setup launched may still start `python` from it.
"""

from __future__ import annotations

from importlib import resources

from gh_local.osworld.script import Piece, embed_bytes
from gh_local.osworld.target import FILE_STORE_BUILD, FILE_STORE_DIR, Need

SHIM_DIR = '"${TMPDIR:-/tmp}/gh-osworld-$(id -u)"'

_SUDO = """#!/bin/sh
# gh-runner's stand-in on a guest without sudo whose scripts already run as root: drop sudo's options.
while [ $# -gt 0 ]; do
  case "$1" in
    -u|-g|-p|-C|-U|-D|-r|-t) shift 2 ;;
    --) shift; break ;;
    -*) shift ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] && exec "$@"
exit 0
"""


def pyautogui_source() -> bytes:
    return resources.files("gh_local.osworld").joinpath("pyautogui_shim.py").read_bytes()


def preamble(text: str) -> Piece:
    """The shims the script `text` (everything after the preamble) uses, or nothing when it uses none."""
    uses_python = "python" in text
    uses_pyautogui = "pyautogui" in text
    uses_sudo = "sudo" in text
    place = PLACE_FUNCTION if "gh_osworld_place " in text else []
    if not (uses_python or uses_sudo):
        return Piece(list(place))
    lines = [*place, f"gh_shims={SHIM_DIR}", 'mkdir -p "$gh_shims/bin" "$gh_shims/lib"']
    if uses_python:
        lines += ["if command -v python3 >/dev/null 2>&1; then",
                  "  printf '#!/bin/sh\\nexec python3 \"$@\"\\n' > \"$gh_shims/bin/python\"",
                  '  chmod 0755 "$gh_shims/bin/python"',
                  "fi"]
    if uses_pyautogui:
        lines += ["if ! python3 -c 'import pyautogui' >/dev/null 2>&1; then",
                  *embed_bytes(pyautogui_source(), '"$gh_shims/lib/pyautogui.py"'),
                  "fi"]
    if uses_sudo:
        lines += ['if ! command -v sudo >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then',
                  *embed_bytes(_SUDO.encode(), '"$gh_shims/bin/sudo"', compress=False),
                  '  chmod 0755 "$gh_shims/bin/sudo"',
                  "fi"]
    lines += ['PATH="$gh_shims/bin:$PATH"',
              'PYTHONPATH="$gh_shims/lib${PYTHONPATH:+:$PYTHONPATH}"',
              "export PATH PYTHONPATH"]
    return Piece(lines=lines, needs={Need.PYTHON3, Need.SESSION} if uses_pyautogui else set())


# gh_osworld_place HEX DEST: a file too large to embed, copied from the start state's file store (filled at
# image build: image-builder/build osworld-desktop --files-dir DIR) and checked. A missing or damaged copy is
# the start state's fault (exit 1: an error of the case, never a verdict against the agent).
# GH_OSWORLD_FILE_STORE moves the store for the tests on the host; the guest's scripts never set it.
PLACE_FUNCTION = f"""gh_osworld_place() {{
  gh_src="${{GH_OSWORLD_FILE_STORE:-{FILE_STORE_DIR.removesuffix('/sha256')}}}/sha256/$1"
  if [ ! -f "$gh_src" ]; then
    echo "the file sha256:$1 is not in this start state's file store ({FILE_STORE_BUILD})" >&2; exit 1
  fi
  cp "$gh_src" "$2" || {{ echo "gh-runner import osworld: cannot write $2" >&2; exit 1; }}
  [ "$(sha256sum "$2" | cut -d ' ' -f 1)" = "$1" ] || {{
    echo "the file sha256:$1 in this start state's file store is damaged ({FILE_STORE_BUILD})" >&2; exit 1; }}
}}""".splitlines()
