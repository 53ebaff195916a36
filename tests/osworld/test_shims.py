"""The pyautogui shim (the calls OSWorld's setups make, done with xdotool) run by a real python3 with a
stand-in xdotool that records its argv: the boundary is xdotool's command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gh_local.osworld.shims import pyautogui_source


def run_shim(tmp_path: Path, program: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    lib, bin_dir, log = tmp_path / "lib", tmp_path / "bin", tmp_path / "xdotool.log"
    lib.mkdir()
    bin_dir.mkdir()
    (lib / "pyautogui.py").write_bytes(pyautogui_source())
    xdotool = bin_dir / "xdotool"
    xdotool.write_text(f"""#!/bin/sh
echo "$*" >> {log}
case "$1" in
  getdisplaygeometry) echo "1280 800" ;;
  getmouselocation) printf 'X=12\\nY=34\\nSCREEN=0\\nWINDOW=5\\n' ;;
esac
""")
    xdotool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(lib)}
    proc = subprocess.run([sys.executable, "-c", "import pyautogui\npyautogui.PAUSE = 0\n" + program], env=env,
                          capture_output=True, text=True, timeout=60)
    return proc, log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize(("program", "calls"), [
    ("pyautogui.hotkey('ctrl', 'shift', 'Esc')", ["key -- ctrl+shift+Escape"]),
    ("pyautogui.hotkey(['alt', 'f4'])", ["key -- alt+F4"]),
    ("pyautogui.press('enter'); pyautogui.press(['tab', 'a', ','], presses=1)",
     ["key -- Return", "key -- Tab", "key -- a", "key -- comma"]),
    ("pyautogui.press('down', presses=2)", ["key -- Down", "key -- Down"]),
    ("pyautogui.typewrite('Hello, world!', interval=0.05)", ["type --delay 50 -- Hello, world!"]),
    ("pyautogui.write(['left', 'backspace'])", ["key -- Left", "key -- BackSpace"]),
    ("pyautogui.click((100, 200))", ["mousemove --sync 100 200", "click --repeat 1 --delay 1 1"]),
    ("pyautogui.doubleClick(5, 6)", ["mousemove --sync 5 6", "click --repeat 2 --delay 1 1"]),
    ("pyautogui.rightClick()", ["click --repeat 1 --delay 1 3"]),
    ("pyautogui.moveTo(7, 8, duration=0.5)", ["mousemove --sync 7 8"]),
    ("pyautogui.dragTo(30, 40)", ["mousedown 1", "mousemove --sync 30 40", "mouseup 1"]),
    ("pyautogui.scroll(-3)", ["click --repeat 3 --delay 20 5"]),
    ("pyautogui.keyDown('shift'); pyautogui.keyUp('shift')", ["keydown -- shift", "keyup -- shift"]),
])
def test_calls_become_xdotool(tmp_path: Path, program: str, calls: list[str]) -> None:
    proc, log = run_shim(tmp_path, program)
    assert proc.returncode == 0, proc.stderr
    assert log == calls


def test_size_and_position_read_xdotool(tmp_path: Path) -> None:
    proc, _ = run_shim(tmp_path, "print(pyautogui.size(), pyautogui.position())")
    assert proc.stdout.strip() == "(1280, 800) (12, 34)"


def test_what_it_does_not_offer_fails_loudly(tmp_path: Path) -> None:
    proc, log = run_shim(tmp_path, "pyautogui.locateOnScreen('button.png')")
    assert proc.returncode == 1 and log == []
    assert "NotImplementedError: pyautogui.locateOnScreen is not offered by gh-runner's pyautogui shim" in proc.stderr


def test_a_key_that_is_not_a_name_is_refused(tmp_path: Path) -> None:
    proc, log = run_shim(tmp_path, "try:\n    pyautogui.press(None)\nexcept ValueError as e:\n    print(e)")
    assert proc.stdout.strip() == "pyautogui shim: None is not a key name" and log == []
