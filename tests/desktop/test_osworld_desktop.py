"""osworld-desktop through the provider (image-builder/imagebuilder/osworld_desktop.py, docs/desktop-guests.md):
a script as the signed-in user finds what OSWorld's setups and checks rely on: the Python modules and
gh_osworld judging a spec, the session's locale, and Chromium's DevTools port on the guest's loopback
both as the image starts it and as OSWorld's chrome tasks start it (their own port, socat to 9222).

The image is not built here (a fresh build is half an hour: scripts/osworld-image.sh); without it in
GH_OSWORLD_IMAGES_DIR the module is skipped."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from kit.libvirt import LIBVIRT_URI, ensure_libvirtd, started

from providers.base import MachineSource
from providers.qemu import QemuMachine, QemuProvider

from .conftest import BOOT_TIMEOUT, DESKTOP_TEST_TIMEOUT_S, RUNNER_NAME
from .gui import sh, until

pytestmark = [pytest.mark.desktop, pytest.mark.libvirt, pytest.mark.slow, pytest.mark.timeout(DESKTOP_TEST_TIMEOUT_S),
              pytest.mark.asyncio(loop_scope="session")]

IMAGES_DIR = Path(os.environ.get("GH_OSWORLD_IMAGES_DIR", "/var/tmp/gh-runner/osworld-images"))
IMAGE = "osworld-desktop"
CHROME_TIMEOUT = 300.0  # Chromium's first start under TCG on a loaded host
DEVTOOLS = "curl -sf --max-time 5 http://127.0.0.1:9222/json/version | grep -q '\"Browser\"'"


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def osworld(desktop_state: Path) -> AsyncIterator[QemuMachine]:
    if not (IMAGES_DIR / IMAGE / "image.yaml").is_file():
        pytest.skip(f"no {IMAGE} in {IMAGES_DIR} (scripts/osworld-image.sh builds it)")
    ensure_libvirtd()
    # A cold boot: one machine, so no warm snapshot (a 4 GiB memory save) is worth making.
    async with started(QemuProvider(IMAGES_DIR, desktop_state / "osworld", RUNNER_NAME, LIBVIRT_URI,
                                    warm_snapshots=False)) as p:
        m = await p.create_machine(f"at_{secrets.token_hex(4)}", MachineSource(image=IMAGE), timeout=BOOT_TIMEOUT)
        assert isinstance(m, QemuMachine)
        try:
            await m.wait_ready(BOOT_TIMEOUT)
            yield m
        finally:
            await m.destroy()


async def test_the_checks_modules_import_and_gh_osworld_judges_a_spec(osworld: QemuMachine) -> None:
    await sh(osworld, 'python3 -c "import openpyxl, docx, pptx, pandas, PIL, lxml, numpy, xlsxwriter, pyatspi, '
                      'gh_osworld.evaluate"', timeout=180)

    def spec(expected: str) -> str:
        return json.dumps({"conj": "and", "metrics": [{
            "func": "exact_match", "result": {"type": "vm_command_line", "command": ["printf", "hello"]},
            "expected": {"type": "rule", "rules": {"expected": expected}}}]})

    await sh(osworld, f"cat > /tmp/gh-spec-right.json <<'JSON'\n{spec('hello')}\nJSON\n"
                      f"cat > /tmp/gh-spec-wrong.json <<'JSON'\n{spec('bye')}\nJSON\n")
    try:
        # Each run must give a verdict (exit 0): `sh` shows gh_osworld's message when it gives none.
        right = await sh(osworld, "python3 -m gh_osworld /tmp/gh-spec-right.json", timeout=180)
        wrong = await sh(osworld, "python3 -m gh_osworld /tmp/gh-spec-wrong.json", timeout=180)
    finally:
        await sh(osworld, "rm -f /tmp/gh-spec-right.json /tmp/gh-spec-wrong.json")
    assert (right.strip(), wrong.strip()) == ("True", "False")


async def test_scripts_and_the_session_run_in_en_us_utf8(osworld: QemuMachine) -> None:
    out = await sh(osworld, 'echo "$LANG $(locale charmap)"\n'
                            "tr '\\0' '\\n' < /proc/$(pgrep -u user -x xfce4-session)/environ | grep '^LANG='\n"
                            "printf 'b\\nB\\na\\n' | sort | tr '\\n' ' '\n")
    script, session, order = out.strip().splitlines()
    assert script == "en_US.UTF-8 UTF-8"
    assert session == "LANG=en_US.UTF-8"
    assert order.split() == ["a", "b", "B"]  # en_US collation; C would put B first


async def test_a_setups_startup_page_edit_of_the_seeded_profile_holds_once_chrome_starts(
        osworld: QemuMachine) -> None:
    # OSWorld's snapshot has a Chrome profile before Chrome's first start, and its chrome setups edit
    # its Preferences with jq, then start Chrome. With no profile the edit failed and the startup-page
    # check (chrome 3299584d) printed True on the untouched start.
    prefs = "~/.config/google-chrome/Default/Preferences"
    assert (await sh(osworld, f"cat {prefs}")).strip() == "{}"
    spec = json.dumps({"conj": "and", "metrics": [{
        "func": "exact_match", "result": {"type": "new_startup_page"},
        "expected": {"type": "rule", "rules": {"expected": "true"}}}]})
    await sh(osworld, f"cat > /tmp/gh-spec-startup.json <<'JSON'\n{spec}\nJSON\n"
                      "cd ~/.config/google-chrome/Default && jq '. + {\"session\":{\"restore_on_startup\":4, "
                      "\"startup_urls\":[\"http://funbrain.com/\"]}}' Preferences > temp && mv temp Preferences\n"
                      "setsid google-chrome --remote-debugging-port=1337 >/dev/null 2>&1 &")
    try:
        await until(osworld, "curl -sf --max-time 5 http://127.0.0.1:1337/json/version >/dev/null", CHROME_TIMEOUT,
                    "Chromium on the task's own port")
        verdict = await sh(osworld, "python3 -m gh_osworld /tmp/gh-spec-startup.json", timeout=180)
    finally:
        await sh(osworld, "rm -f /tmp/gh-spec-startup.json")
        await _stop_chromium(osworld)
    assert verdict.strip() == "False"


async def test_google_chrome_answers_on_the_devtools_port_with_osworlds_profile(osworld: QemuMachine) -> None:
    await sh(osworld, "setsid google-chrome about:blank >/dev/null 2>&1 &")
    try:
        await until(osworld, DEVTOOLS, CHROME_TIMEOUT, "Chromium answering on 127.0.0.1:9222")
        await until(osworld, "test -f ~/.config/google-chrome/Local\\ State", 60,
                    "the profile at ~/.config/google-chrome")
        # Bound to the loopback only.
        out = await sh(osworld, "ss -Hltn 'sport = :9222' | awk '{print $4}'")
        assert out.split() == ["127.0.0.1:9222"]
    finally:
        await _stop_chromium(osworld)


async def test_osworlds_own_chrome_launch_with_socat_reaches_the_same_port(osworld: QemuMachine) -> None:
    # What OSWorld's chrome tasks run: their own port, forwarded from 9222.
    await sh(osworld, "setsid google-chrome --remote-debugging-port=1337 >/dev/null 2>&1 &\n"
                      "setsid socat tcp-listen:9222,fork tcp:localhost:1337 >/dev/null 2>&1 &")
    try:
        await until(osworld, DEVTOOLS, CHROME_TIMEOUT, "Chromium answering through socat on 127.0.0.1:9222")
        await until(osworld, "curl -sf --max-time 5 http://127.0.0.1:1337/json/version >/dev/null", 30,
                    "Chromium on the task's own port")
    finally:
        await sh(osworld, "pkill -x socat; true")
        await _stop_chromium(osworld)


async def _stop_chromium(m: QemuMachine) -> None:
    await sh(m, "pkill -f /usr/lib/chromium/chromium; true")
    await until(m, "! pgrep -f /usr/lib/chromium/chromium >/dev/null", 60, "Chromium stopping")
    # Back to the image's profile (customize.sh's seed), for the next test's first start.
    await sh(m, "rm -rf ~/.config/google-chrome && mkdir -p ~/.config/google-chrome/Default && "
                "echo '{}' > ~/.config/google-chrome/Default/Preferences")
