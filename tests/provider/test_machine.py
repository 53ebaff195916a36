"""One shared linux-tiny machine through real libvirt: scripts, screen, input."""

from __future__ import annotations

import asyncio
import io
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import libvirt
import pytest
from kit.libvirt import LIBVIRT_URI, ensure_libvirtd
from PIL import Image

from gh_wire.input import ClickEvent, KeyEvent, MoveEvent, ScrollEvent, TypeEvent
from providers.errors import InputNotSupported, ProviderError
from providers.qemu import QemuMachine, QemuProvider
from providers.qemu.connection import Connection
from providers.qemu.screen import SCREENDUMP_DIR

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


async def test_script_exit_code_streams_and_env(shared_machine: QemuMachine) -> None:
    r = await shared_machine.run_script(
        'echo "out $GH_CHECK_PHASE $WITH_SPACE"; echo err >&2; id -u; exit 7',
        env={"GH_CHECK_PHASE": "before", "WITH_SPACE": "a b 'c'"}, timeout=60)
    assert r.exit_code == 7 and not r.timed_out
    assert r.stdout == "out before a b 'c'\n0\n"
    assert r.stderr == "err\n"
    assert not r.stdout_truncated and not r.stderr_truncated


async def test_script_that_never_returns_is_stopped_at_its_timeout(shared_machine: QemuMachine) -> None:
    started = time.monotonic()
    r = await shared_machine.run_script("echo started; sleep 1000 & sleep 999; echo never", timeout=3)
    took = time.monotonic() - started
    assert r.timed_out and r.exit_code is None
    assert 3 <= took < 30
    assert r.stdout == "started\n"  # partial output survives the kill
    # The whole session went, including the background child.
    ps = await shared_machine.run_script("ps -o args | grep -c '^sleep 99[09]' || true", timeout=30)
    assert ps.stdout.strip() == "0"


async def test_script_of_100k_characters_runs(shared_machine: QemuMachine) -> None:
    lines = [f"v{i}=$(( {i} * 2 ))" for i in range(4000)]
    script = "\n".join(lines) + "\necho $v3999\n"
    script += "# " + "x" * (100_000 - len(script) - 3) + "\n"
    assert len(script) == 100_000
    r = await shared_machine.run_script(script, timeout=120)
    assert r.exit_code == 0 and r.stdout == "7998\n", r.stderr[:500]


async def test_5mb_output_is_truncated_and_flagged(shared_machine: QemuMachine) -> None:
    r = await shared_machine.run_script(
        "head -c 5000000 /dev/zero | tr '\\0' a; head -c 3000000 /dev/zero | tr '\\0' b >&2", timeout=120)
    assert r.exit_code == 0
    assert r.stdout_truncated and len(r.stdout) == 1024 * 1024 and set(r.stdout) == {"a"}
    assert r.stderr_truncated and len(r.stderr) == 1024 * 1024 and set(r.stderr) == {"b"}


async def test_output_cap_above_one_reply_is_fetched_in_pieces(shared_machine: QemuMachine) -> None:
    script = "i=0; while [ $i -lt 50000 ]; do printf '%07d\\n' $i; i=$((i+1)); done"  # 400,000 bytes, ordered
    full = await shared_machine.run_script(script, timeout=180, output_cap=3 * 1024 * 1024)
    assert not full.stdout_truncated and len(full.stdout) == 400_000
    assert full.stdout.splitlines()[-1] == "0049999" and full.stdout.splitlines()[12345] == "0012345"
    small = await shared_machine.run_script(script, timeout=180, output_cap=1000)
    assert small.stdout_truncated and small.stdout == full.stdout[:1000]


async def test_non_utf8_output_is_decoded_with_replacement(shared_machine: QemuMachine) -> None:
    r = await shared_machine.run_script("printf 'ok \\377\\376 caf\\303\\251\\n'; printf '\\200' >&2", timeout=60)
    assert r.exit_code == 0
    assert r.stdout == "ok \ufffd\ufffd caf\u00e9\n" and r.stderr == "\ufffd"


async def test_screenshot_has_guest_resolution_and_correct_colours(shared_machine: QemuMachine,
                                                                   provider: QemuProvider) -> None:
    # Paint the text console red (ANSI background 41): VGA text mode draws it as (170, 0, 0).
    r = await shared_machine.run_script("printf '\\033[41m\\033[2J\\033[H' > /dev/tty1", timeout=60)
    assert r.exit_code == 0
    mode = await shared_machine.run_script("cat /sys/class/graphics/fb0/virtual_size 2>/dev/null || true", timeout=30)
    # A framebuffer console reports its size, and the screenshot must match it; else VGA text mode
    # 80x25 with 9x16 glyphs.
    size = tuple(int(v) for v in mode.stdout.strip().split(",")) if mode.stdout.strip() else (720, 400)

    def assert_red_screen(png: bytes) -> None:
        img = Image.open(io.BytesIO(png)).convert("RGB")
        assert img.size == size
        colours: list[tuple[int, tuple[int, int, int]]] = img.getcolors(maxcolors=1 << 16) or []  # type: ignore[assignment]
        count, (red, green, blue) = max(colours)
        assert count > img.size[0] * img.size[1] // 2
        assert red > 120 and blue < 60 and green < 60, (red, green, blue)

    try:
        assert_red_screen(await shared_machine.screenshot())  # QEMU's PPM dump, through QMP
        # libvirt's screenshot (the fallback): a red screen is enough for the provider to learn
        # whether this QEMU swaps PNG channels.
        shared_machine._ppm_dumps = False
        assert_red_screen(await shared_machine.screenshot())
        assert provider.calibration.png_swapped is not None
    finally:
        shared_machine._ppm_dumps = True
        await shared_machine.run_script("printf '\\033[0m\\033[2J\\033[H' > /dev/tty1", timeout=60)


async def test_screenshots_at_once_each_get_a_whole_screen_from_the_dump_and_leave_nothing(
        shared_machine: QemuMachine) -> None:
    # The agent's screenshot and the replay's may be taken at the same moment: each dump has its own file.
    shots = await asyncio.gather(*(shared_machine.screenshot() for _ in range(4)))
    sizes = set()
    for png in shots:
        img = Image.open(io.BytesIO(png))
        img.load()
        sizes.add(img.size)
    assert len(sizes) == 1
    assert shared_machine._ppm_dumps  # QEMU wrote its dumps: libvirt's slower path was not needed
    dumps = shared_machine.dir / SCREENDUMP_DIR
    assert dumps.is_dir() and list(dumps.iterdir()) == []


async def test_typing_on_the_console_reaches_the_shell(shared_machine: QemuMachine) -> None:
    await shared_machine.run_script("rm -f /tmp/typed", timeout=30)
    before = await shared_machine.screenshot()
    await shared_machine.send_input([TypeEvent(text="echo 'Hi!' > /tmp/typed"), KeyEvent(keys=["ENTER"])])
    deadline = time.monotonic() + 60
    content = ""
    while time.monotonic() < deadline:
        r = await shared_machine.run_script("cat /tmp/typed 2>/dev/null", timeout=30)
        if r.exit_code == 0:
            content = r.stdout
            break
        await asyncio.sleep(0.5)
    assert content == "Hi!\n"
    assert await shared_machine.screenshot() != before


async def test_untypable_text_sends_nothing(shared_machine: QemuMachine) -> None:
    with pytest.raises(InputNotSupported, match="cannot type"):
        await shared_machine.send_input([TypeEvent(text="rm -rf /tmp/x\u00e9"), KeyEvent(keys=["ENTER"])])
    with pytest.raises(InputNotSupported, match="unknown key"):
        await shared_machine.send_input([KeyEvent(keys=["CTRL", "NOPE"])])


async def test_absolute_mouse_events_reach_the_tablet(shared_machine: QemuMachine) -> None:
    # The tablet's driver may load after the guest agent is up: wait for the tablet to appear.
    dev = ""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not dev.startswith("event"):
        find = await shared_machine.run_script(
            "awk '/^N:/{n=$0} /^H:/{ if (n ~ /Tablet/) print $0 }' /proc/bus/input/devices "
            "| grep -o 'event[0-9]*'", timeout=30)
        dev = find.stdout.strip()
        if not dev:
            await asyncio.sleep(0.5)
    if not dev.startswith("event"):
        devices = await shared_machine.run_script("cat /proc/bus/input/devices; lsmod", timeout=30)
        pytest.fail(f"no tablet in /proc/bus/input/devices:\n{devices.stdout}")
    start = await shared_machine.run_script(
        f"rm -f /tmp/ev; (cat /dev/input/{dev} > /tmp/ev &) ; sleep 0.5; echo ok", timeout=30)
    assert start.stdout == "ok\n"
    try:
        await shared_machine.send_input([MoveEvent(x=10, y=10), MoveEvent(x=600, y=300),
                                         ClickEvent(x=100, y=100, button="left"), ScrollEvent(x=5, y=5, dy=2)])
        deadline = time.monotonic() + 30
        size = 0
        while time.monotonic() < deadline:
            r = await shared_machine.run_script("wc -c < /tmp/ev", timeout=30)
            size = int(r.stdout.strip() or 0)
            if size > 0:
                break
            await asyncio.sleep(0.3)
        # struct input_event is 24 bytes on x86_64; moves, two buttons and wheel notches each make several.
        assert size >= 24 * 8 and size % 24 == 0, size
    finally:
        await shared_machine.run_script(f"pkill -f 'cat /dev/input/{dev}' || killall cat || true", timeout=30)


async def test_ready_machine_answers_again_quickly(shared_machine: QemuMachine) -> None:
    started = time.monotonic()
    await shared_machine.wait_ready(30)
    assert time.monotonic() - started < 10


async def test_a_dropped_libvirt_connection_is_reopened(shared_machine: QemuMachine) -> None:
    # What a libvirtd restart leaves behind: a connection object that no longer works.
    conn = shared_machine.domain.conn.get()
    conn.close()
    r = await shared_machine.run_script("echo still-here", timeout=60)
    assert r.stdout == "still-here\n"
    assert shared_machine.domain.conn.get() is not conn


def _closes_its_connection_once() -> tuple[list[int], Callable[[libvirt.virConnect], int]]:
    calls: list[int] = []

    def fn(c: libvirt.virConnect) -> int:
        calls.append(1)
        if len(calls) == 1:
            c.close()  # the connection breaks while the call is in flight
        return int(c.getVersion())

    return calls, fn


async def test_a_call_that_must_not_run_twice_is_not_retried_after_the_connection_broke() -> None:
    ensure_libvirtd()
    conn = Connection(LIBVIRT_URI)
    try:
        calls, fn = _closes_its_connection_once()
        with pytest.raises(libvirt.libvirtError):
            conn.call(fn, retry=False)
        assert len(calls) == 1
        assert conn.get().getVersion() > 0  # and the next call reconnects
        calls, fn = _closes_its_connection_once()
        assert conn.call(fn) > 0
        assert len(calls) == 2
    finally:
        conn.close()


async def test_an_error_on_a_live_connection_is_raised_not_retried() -> None:
    ensure_libvirtd()
    conn = Connection(LIBVIRT_URI)
    try:
        first = conn.get()
        calls: list[int] = []

        def fn(c: libvirt.virConnect) -> None:
            calls.append(1)
            c.lookupByName("gh-no-such-domain-anywhere")

        with pytest.raises(libvirt.libvirtError):
            conn.call(fn)
        assert len(calls) == 1 and conn.get() is first
    finally:
        conn.close()


SYSTEMD_PID1 = Path("/run/systemd/system").is_dir()


def _libvirtd_pids() -> set[str]:
    out = subprocess.run(["pgrep", "-x", "libvirtd"], capture_output=True, text=True, timeout=10)
    return set(out.stdout.split())


async def _poll(what: str, ok: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {seconds:g} s")
        await asyncio.sleep(0.2)


async def test_a_real_libvirtd_restart_while_the_machine_runs(shared_machine: QemuMachine) -> None:
    if LIBVIRT_URI != "qemu:///system":
        pytest.skip("restarts the host's libvirtd: only meaningful against qemu:///system")
    old = _libvirtd_pids()
    assert old, "libvirtd is not running as a process this test can restart"
    await shared_machine.run_script("echo before > /tmp/restart-mark", timeout=60)
    if SYSTEMD_PID1:  # systemd owns the daemon: restart it its way
        await asyncio.to_thread(subprocess.run, ["systemctl", "restart", "libvirtd.service"], timeout=60, check=True)
    else:
        await asyncio.to_thread(subprocess.run, ["pkill", "-TERM", "-x", "libvirtd"], timeout=10, check=True)
        try:
            await _poll("libvirtd did not stop", lambda: not (_libvirtd_pids() & old), 60)
        finally:
            if not _libvirtd_pids():
                await asyncio.to_thread(ensure_libvirtd)  # started the host's way, with the system's PATH
    await _poll("libvirtd did not answer again", lambda: subprocess.run(
        ["virsh", "-c", LIBVIRT_URI, "version"], capture_output=True, timeout=10).returncode == 0, 60)
    # The guest kept running through the restart; the provider reconnects on its next call. libvirtd
    # reconnects the guest agent's channel on its own, a moment after it answers again (seconds on a
    # loaded host): until then the agent is "not connected", an answer, not a broken connection.
    deadline = time.monotonic() + 60
    while True:
        try:
            r = await shared_machine.run_script("cat /tmp/restart-mark", timeout=60)
            break
        except ProviderError as e:
            if "not connected" not in str(e) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    assert r.exit_code == 0 and r.stdout == "before\n"
    assert len(await shared_machine.screenshot()) > 100
