"""Live views: key press to changed pixels at the viewer, beside the screenshot API; bytes per second at the
viewer for an idle screen and a moving one.

    .venv/bin/python bench/live_view.py [--images-dir DIR] [--presses 50] [--idle-s 20] [--moving-s 20] [--desktop]

A real gh-server and gh-runner in this process (tests/startstates/conftest.py's Stack), one open start state
on linux-tiny (with --desktop, or when GH_DESKTOP_IMAGES_DIR holds linux-desktop, on that too), and the
viewer of tests/kit/rfb.py on the WebSocket a page opens (`POST /v1/start_states/{id}/view`, `/v1/live/...`):

  view:   a key pressed at the viewer (down and up) to the first framebuffer update that changes a pixel,
          read as noVNC does (an incremental request after each update). p50/p90 over --presses presses,
          alternating a letter and BackSpace. The text cursor is hidden first, so only the key changes pixels.
  api:    the same key through `POST .../input`, then `GET .../screen` polled as fast as it goes until the
          PNG differs; and the poll's own rate (screens per second).
  idle:   bytes per second at the viewer over --idle-s seconds of an idle console (cursor shown, blinking),
          incremental requests after each update; raw encoding at 32 bits per pixel and no WebSocket
          compression: an upper bound (noVNC asks for tight/zrle and browsers deflate).
  moving: the same over --moving-s seconds for each of MOVERS, which keep the screen changing: on
          linux-tiny (VGA text mode, where QEMU sends only the character cells that changed) a console
          printing `date` in a loop (a scroll that moves lines mostly equal to their neighbours) and one
          printing random hex (every cell changes at each scroll); on linux-desktop a window (python3-tk,
          in the image for its tests) moved 8 px every 50 ms across the desktop.

  takeover: an attempt of a command agent that only looks (tests/startstates/look_agent.py: a screen through
          the machine API, then 0.2 s, again) taken over and handed back --takeovers times, 1 s held each:
          from the press of "Take over" (the POST) to the agent stopped (its last request before the
          hold answered: none is served after it until the hand-back), and from the press of "Hand back"
          to the agent's next action (its waiting screen request answered, a fresh screen).

Targets (docs/protocol.md, "Live views"): key to pixels <= 100 ms p50 on loopback; idle <= 5 KB/s per viewer;
(docs/server-api.md, "Takeovers") take over to the agent stopped, hand back to its next action, <= 1 s each.
Everything is removed at the end (the stack's temp dir, its machines).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO), str(REPO / "bench")]

from kit.rfb import Viewer  # noqa: E402
from movers import MOVERS, start_script, stop_script  # noqa: E402
from startstates.conftest import Stack  # noqa: E402
from startstates.test_start_states import check_after  # noqa: E402

BACKSPACE = 0xFF08


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(values: list[float]) -> str:
    return f"p50 {pct(values, 0.5) * 1000:.0f} ms  p90 {pct(values, 0.9) * 1000:.0f} ms  (n={len(values)})"


class Bench:
    def __init__(self, stack: Stack, image: str) -> None:
        self.stack = stack
        self.image = image
        self.http = httpx.Client(base_url=stack.base_url, timeout=120,
                                 headers={"Authorization": f"Bearer {stack.admin_key}"})
        ss = self.http.post("/v1/start_states", json={"from": image, "name": f"bench live view {image}"}).json()
        self.ssid = str(ss["start_state_id"])

    def viewer(self) -> Viewer:
        t = self.http.post(f"/v1/start_states/{self.ssid}/view").json()
        v = Viewer(self.stack.base_url.replace("http://", "ws://") + t["url"])
        v.handshake()
        v.update(incremental=False)
        return v

    def cursor(self, shown: bool) -> None:
        """linux-tiny: hide tty1's blinking cursor, so only a key changes pixels. linux-desktop: a key
        needs a window that takes it: a terminal (its cursor does not blink), opened and focused."""
        if self.image == "linux-tiny":
            self.stack.guest_exec(self.ssid, f"printf '\\033[?25{'h' if shown else 'l'}' > /dev/tty1")
        elif shown:
            self.stack.guest_exec(self.ssid, "pkill -x xfce4-terminal; true")
        else:
            self.stack.guest_exec(self.ssid, "setsid xfce4-terminal </dev/null >/dev/null 2>&1 &")
            deadline = time.monotonic() + 120
            while self.stack.guest_exec(self.ssid, "xdotool getactivewindow getwindowname | grep -qi terminal"
                                        ).exit_code != 0:
                if time.monotonic() > deadline:
                    raise TimeoutError("the terminal did not take the focus within 120 s")
                time.sleep(1)

    def view_presses(self, presses: int) -> list[float]:
        self.cursor(False)
        out = []
        with self.viewer() as v:
            for i in range(presses):
                self._settle(v)
                before = bytes(v.fb)
                sym = ord("x") if i % 2 == 0 else BACKSPACE
                t0 = time.monotonic()
                v.press(sym)
                while bytes(v.fb) == before:
                    v.update(incremental=True, timeout=30)
                out.append(time.monotonic() - t0)
        self.cursor(True)
        return out

    @staticmethod
    def _settle(v: Viewer) -> None:
        """Read updates until none comes for 0.3 s (the last key's echo has all arrived)."""
        while True:
            v.request(incremental=True)
            try:
                while v.read_message(0.3) != "update":
                    pass
            except TimeoutError:
                return

    def api_presses(self, presses: int) -> tuple[list[float], float]:
        self.cursor(False)
        out = []
        polls, polled_s = 0, 0.0
        screen = f"/v1/start_states/{self.ssid}/screen"
        for i in range(presses):
            time.sleep(0.3)
            before = self.http.get(screen).content
            key = "x" if i % 2 == 0 else "BACKSPACE"
            t0 = time.monotonic()
            self.http.post(f"/v1/start_states/{self.ssid}/input", json={"events": [{"type": "key", "keys": [key]}]})
            while True:
                p0 = time.monotonic()
                png = self.http.get(screen).content
                polls, polled_s = polls + 1, polled_s + time.monotonic() - p0
                if png != before:
                    break
            out.append(time.monotonic() - t0)
        self.cursor(True)
        return out, polls / polled_s if polled_s else 0.0

    def idle(self, seconds: float) -> float:
        return self._rate(seconds, settle=True)

    def moving(self, seconds: float) -> dict[str, float]:
        return {what: self._moving(script, seconds) for what, script in MOVERS[self.image].items()}

    def _moving(self, script: str, seconds: float) -> float:
        started = self.stack.guest_exec(self.ssid, start_script(script))
        assert started.exit_code == 0, started
        try:
            return self._rate(seconds, settle=False)  # a screen that keeps changing never settles
        finally:
            self.stack.guest_exec(self.ssid, stop_script())

    def _rate(self, seconds: float, settle: bool) -> float:
        """Bytes per second at a viewer that asks for an incremental update after each one, as noVNC does."""
        with self.viewer() as v:
            if settle:
                self._settle(v)
            start, t0 = v.received, time.monotonic()
            while time.monotonic() - t0 < seconds:
                v.request(incremental=True)
                try:
                    while v.read_message(max(0.05, seconds - (time.monotonic() - t0))) != "update":
                        pass
                except TimeoutError:
                    break
            return (v.received - start) / (time.monotonic() - t0)

    def wait_for_session(self, timeout: float = 1800.0) -> None:
        """A desktop's signed-in session (its first boot under TCG, and the runner's warm snapshot of it, take
        minutes: longer than a view waits for a machine still being made), as a person opens the page."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.stack.guest_exec(self.ssid, "xdotool search --onlyvisible --class xfdesktop >/dev/null"
                                         ).exit_code == 0:
                    return
            except Exception:  # the machine is still being made: ask again
                pass
            ss = self.http.get(f"/v1/start_states/{self.ssid}").json()
            if ss["status"] == "failed":  # e.g. the session not up within the runner's bound on a loaded host
                raise RuntimeError(f"the start state did not open: {ss.get('error')}")
            time.sleep(5)
        raise TimeoutError(f"no signed-in session on {self.image} within {timeout:.0f} s")

    def close(self) -> None:
        self.http.post(f"/v1/start_states/{self.ssid}/close")
        self.http.close()


def run(images_dir: Path, image: str, presses: int, idle_s: float, moving_s: float) -> dict[str, Any]:
    stack = Stack(images_dir)
    if image != "linux-tiny":
        shutil.copytree(images_dir / image, stack.images_dir / image, copy_function=shutil.copyfile)
        (stack.images_dir / image).chmod(0o755)
    stack.start()
    try:
        b = Bench(stack, image)
        try:
            if image != "linux-tiny":
                b.wait_for_session()
            with b.viewer():  # the machine is up and its screen answers
                pass
            view = b.view_presses(presses)
            api, rate = b.api_presses(max(10, presses // 2))
            idle = b.idle(idle_s)
            moving = b.moving(moving_s)
        finally:
            b.close()
    finally:
        stack.stop()
    return {"view": view, "api": api, "api_rate": rate, "idle": idle, "moving": moving}


def looks(path: Path) -> list[tuple[float, float]]:
    """The looker's screens so far: (asked, answered), wall-clock."""
    if not path.exists():
        return []
    return [(float(a), float(b)) for a, b in (ln.split() for ln in path.read_text().splitlines() if ln.strip())]


def wait_for(what: str, fn: Any, timeout: float = 900.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := fn()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.05)
    return got


def run_takeovers(images_dir: Path, n: int) -> dict[str, list[float]]:
    stack = Stack(images_dir)
    stack.start()
    out: dict[str, list[float]] = {"post": [], "stopped": [], "resumed": []}
    try:
        gh = stack.sdk()
        http = httpx.Client(base_url=stack.base_url, timeout=120,
                            headers={"Authorization": f"Bearer {stack.admin_key}"})
        case = gh.test_cases.create("bench takeover", "Look at the screen.", "linux-tiny",  # type: ignore[arg-type]
                                    check_after("true"), limits={"minutes": 60})
        run = gh.test_runs.create(test_case_ids=[case["test_case_id"]], agents=["looker"])
        token = wait_for("the looker's task", lambda: list(stack.gate_dir.glob("*.token")))
        aid = token[0].name.removesuffix(".token")
        screens = stack.gate_dir / f"{aid}.screens"
        wait_for("the looker's first screen", lambda: looks(screens), timeout=300)
        try:
            for _ in range(n):
                time.sleep(1.0)  # the agent looking freely between holds
                pressed = time.time()
                took = http.post(f"/v1/attempts/{aid}/takeover")
                assert took.status_code == 200, took.text
                out["post"].append(time.time() - pressed)
                time.sleep(1.0)  # held: the agent's next screen waits
                back_pressed = time.time()
                served = looks(screens)
                # Stopped: the last request answered before the hand-back (one in flight at the press ends).
                stopped = max(answered for _asked, answered in served)
                assert http.post(f"/v1/attempts/{aid}/handback").status_code == 200
                resumed = wait_for("the agent's next screen", lambda bp=back_pressed: [
                    answered for _asked, answered in looks(screens) if answered > bp], timeout=60)
                out["stopped"].append(max(0.0, stopped - pressed))
                out["resumed"].append(min(resumed) - back_pressed)
        finally:
            (stack.gate_dir / f"{aid}.done").write_text("1")
            gh.test_runs.wait(run["test_run_id"], timeout=900, poll_interval=1)
            gh.test_cases.delete(case["test_case_id"])
            http.close()
    finally:
        stack.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images-dir", type=Path,
                    default=Path(os.environ.get("GH_IMAGES_DIR", "/var/tmp/gh-runner/images")))
    ap.add_argument("--presses", type=int, default=50)
    ap.add_argument("--idle-s", type=float, default=20.0)
    ap.add_argument("--moving-s", type=float, default=20.0)
    ap.add_argument("--desktop", action="store_true", help="linux-desktop too (from GH_DESKTOP_IMAGES_DIR)")
    ap.add_argument("--takeovers", type=int, default=10, help="takeovers timed on linux-tiny (0: none)")
    ap.add_argument("--takeovers-only", action="store_true", help="only the takeovers")
    args = ap.parse_args()
    if args.takeovers:
        t = run_takeovers(args.images_dir, args.takeovers)
        print("takeovers (linux-tiny, a command agent looking every 0.2 s):")
        print(f"  take over, the request answered:  {ms(t['post'])}")
        print(f"  take over to the agent stopped:   {ms(t['stopped'])}")
        print(f"  hand back to its next action:     {ms(t['resumed'])}")
        if args.takeovers_only:
            return 0
    runs = [(args.images_dir, "linux-tiny")]
    desktop_dir = Path(os.environ.get("GH_DESKTOP_IMAGES_DIR", "/var/tmp/gh-runner/desktop-images"))
    if args.desktop or os.environ.get("GH_DESKTOP_IMAGES_DIR"):
        if (desktop_dir / "linux-desktop").is_dir():
            runs.append((desktop_dir, "linux-desktop"))
        else:
            print(f"no linux-desktop under {desktop_dir}: linux-tiny only")
    for images_dir, image in runs:
        r = run(images_dir, image, args.presses, args.idle_s, args.moving_s)
        print(f"{image}:")
        print(f"  key to pixels, live view:        {ms(r['view'])}")
        print(f"  key to pixels, input + screen:   {ms(r['api'])}  (screen polled at {r['api_rate']:.1f}/s)")
        print(f"  idle screen at the viewer:       {r['idle'] / 1024:.2f} KiB/s (raw encoding, no deflate)")
        for what, rate in r["moving"].items():
            print(f"  moving screen at the viewer:     {rate / 1024:.2f} KiB/s ({what}; raw, no deflate)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
