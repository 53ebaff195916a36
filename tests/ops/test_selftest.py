"""`gh-runner selftest` on linux-tiny, for real (libvirt, QEMU, the guest), and with one step broken
on purpose at the provider boundary."""

from __future__ import annotations

import io
import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.libvirt import LIBVIRT_URI, domains
from kit.scratch import scratch_dir

from gh_runner.selftest import Step, run_selftest
from providers.base import Machine, MachineSource
from providers.qemu import QemuProvider

GH_RUNNER = Path(sys.executable).parent / "gh-runner"
STEPS = [str(s) for s in Step if s is not Step.KEY_CHORD]  # a console has no window manager to chord


@pytest.fixture
def state_dir() -> Iterator[Path]:
    with scratch_dir("gh-selftest-test-") as d:
        yield d


def _domains(runner: str) -> list[str]:
    return domains(f"gh-{runner}-selftest-")


def test_selftest_on_linux_tiny_passes_every_step_and_writes_the_json_report(
        images_dir: Path, state_dir: Path) -> None:
    name = f"st{secrets.token_hex(3)}"
    report = state_dir / "r.json"
    p = subprocess.run(
        [str(GH_RUNNER), "selftest", "--image", "linux-tiny", "--json", str(report), "--name", name,
         "--images-dir", str(images_dir), "--state-dir", str(state_dir / "state"), "--libvirt-uri", LIBVIRT_URI],
        capture_output=True, text=True, timeout=900, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    entries = json.loads(report.read_text())
    assert [e["step"] for e in entries] == STEPS
    for e in entries:
        assert set(e) == {"image", "step", "ok", "seconds", "detail"} and e["image"] == "linux-tiny"
        assert e["ok"] is True and e["seconds"] >= 0, e
    by_step = {e["step"]: e["detail"] for e in entries}
    assert "warm start ready in" in by_step["warm_start"]
    assert "all 9 steps passed" in p.stdout
    assert _domains(name) == []
    assert not any((state_dir / "state" / "selftest" / "states").iterdir())


class BlankScreenProvider(QemuProvider):
    """A real provider whose machines' screenshots come back black: the display is 'broken'."""

    async def create_machine(self, machine_id: str, source: MachineSource, *, timeout: float) -> Machine:
        from PIL import Image

        m = await super().create_machine(machine_id, source, timeout=timeout)
        buf = io.BytesIO()
        Image.new("RGB", (720, 400)).save(buf, "PNG")

        async def blank() -> bytes:
            return buf.getvalue()

        m.screenshot = blank  # type: ignore[method-assign]
        return m


async def test_a_broken_step_fails_the_selftest_naming_the_step_and_the_machines_still_go(
        images_dir: Path, state_dir: Path) -> None:
    name = f"st{secrets.token_hex(3)}"
    provider = BlankScreenProvider(images_dir, state_dir, f"{name}-selftest", LIBVIRT_URI)
    out = io.StringIO()
    try:
        code, results = await run_selftest(provider, ["linux-tiny"], out=out)
    finally:
        await provider.close()
    assert code == 1, out.getvalue()
    failed = [r for r in results if not r.ok]
    assert [r.step for r in failed] == [Step.SCREENSHOT, Step.CLICK], out.getvalue()
    assert "is blank" in failed[0].detail and "fix:" in failed[0].detail
    assert "screenshot step failed" in failed[1].detail  # the click needs the screen's size
    assert "step(s) failed: linux-tiny screenshot, linux-tiny click" in out.getvalue()
    assert {r.step for r in results if r.ok} == set(STEPS) - {Step.SCREENSHOT, Step.CLICK}
    assert _domains(name) == []


async def test_an_unknown_image_is_refused_naming_what_is_usable(images_dir: Path, state_dir: Path) -> None:
    provider = QemuProvider(images_dir, state_dir, "stunknown-selftest", LIBVIRT_URI)
    out = io.StringIO()
    code, results = await run_selftest(provider, ["win10-22h2-nope"], out=out)
    assert code == 2 and results == []
    assert "no usable image named win10-22h2-nope" in out.getvalue() and "linux-tiny" in out.getvalue()
