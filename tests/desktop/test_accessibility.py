"""The accessibility tree of the signed-in desktop (GET {machine.url}/accessibility; the runner's
server of it, gh_runner/machine_requests.py, on a real linux-desktop): an application a script opens
is in it, with its window, its text and where they are on the screen, and the model's linearized
text shows it (docs/desktop-guests.md)."""

from __future__ import annotations

import re
import time
import uuid
import xml.etree.ElementTree as ET

import pytest

from gh_runner.config import Timeouts
from gh_runner.machine_requests import MachineRequests
from gh_server.agents.model import a11y
from gh_wire.protocol import MachineRequest
from providers.qemu import QemuMachine
from providers.qemu.atspi_tree import NS

from .conftest import DESKTOP_TEST_TIMEOUT_S
from .gui import sh

# In the smoke: about 30 s once the machine is up (two reads under TCG while Mousepad starts).
pytestmark = [pytest.mark.desktop, pytest.mark.desktop_smoke, pytest.mark.libvirt, pytest.mark.slow,
              pytest.mark.timeout(DESKTOP_TEST_TIMEOUT_S), pytest.mark.asyncio(loop_scope="session")]

WINDOW_S = 180.0  # Mousepad's first start under TCG on a loaded host
CP = f"{{{NS['cp']}}}"


async def test_an_open_editor_is_in_the_tree_with_its_window_and_text(desktop: QemuMachine) -> None:
    words = f"find me {uuid.uuid4().hex[:8]}"
    await sh(desktop, f"printf '{words}\\n' > /tmp/gh-a11y.txt; setsid mousepad /tmp/gh-a11y.txt >/dev/null 2>&1 &")
    requests = MachineRequests(desktop, Timeouts())
    try:
        deadline = time.monotonic() + WINDOW_S
        xml = ""
        while words not in xml:
            assert time.monotonic() < deadline, f"Mousepad's text never came into the tree; last read:\n{xml[-2000:]}"
            resp = await requests.serve(MachineRequest(request_id=uuid.uuid4().hex, op="accessibility", timeout=60))
            assert resp.ok, resp.error
            xml = resp.xml or ""
        root = ET.fromstring(xml)
        assert root.tag == "desktop-frame"
        frames = [f for f in root.iter("frame") if "gh-a11y.txt" in f.get("name", "")]
        assert frames, [f.get("name") for f in root.iter("frame")]
        x, y = (int(v) for v in re.findall(r"-?\d+", frames[0].get(CP + "screencoord", "")))
        w, h = (int(v) for v in re.findall(r"-?\d+", frames[0].get(CP + "size", "")))
        assert 0 <= x < 1280 and 0 <= y < 800 and w > 100 and h > 100
        text = next(n for n in root.iter() if (n.text or "").startswith(words))
        assert text.tag in ("text", "paragraph"), text.tag
        lines = a11y.linearize(xml).split("\n")
        assert any(line.split("\t")[2].startswith(words) for line in lines[1:]), lines
    finally:
        await sh(desktop, "pkill -x mousepad; rm -f /tmp/gh-a11y.txt; true")
