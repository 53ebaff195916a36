"""The image builder picks its accelerator with the one decision (providers/qemu/accel.py): on a host
whose KVM runs firmware but never a Linux kernel (tests/fakekvm.py) it builds under TCG at once,
without a build VM under KVM that waits out its ready timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakekvm import FakeKvmHost, on_path
from imagebuilder.accel import build_accelerator

from providers.manifest import load_manifest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "image-builder" / "build"
NEVER_PRINTED = "accelerator tcg: a Linux kernel booted under KVM never printed"


@pytest.fixture
def fake_host(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKvmHost]:
    monkeypatch.delenv("GH_BUILD_ACCEL", raising=False)
    yield on_path(scratch / "fake", monkeypatch)


def test_the_builders_choice_is_the_decision(fake_host: FakeKvmHost, images_dir: Path, scratch: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert build_accelerator(images_dir / "linux-tiny" / "vmlinuz", scratch / "cache") == "tcg"
    assert NEVER_PRINTED in capsys.readouterr().err
    assert fake_host.calls() == ["kvm kernel=1"]
    assert (scratch / "cache" / "accelerator.json").is_file()  # kept for the next build this boot


@pytest.mark.slow
def test_linux_tiny_builds_under_tcg_at_once(fake_host: FakeKvmHost, scratch: Path) -> None:
    out = scratch / "images"
    r = subprocess.run([sys.executable, str(BUILD), "linux-tiny", "--out", str(out)],
                       capture_output=True, text=True, timeout=900, env=os.environ.copy())
    assert r.returncode == 0, r.stderr[-3000:]
    assert NEVER_PRINTED in r.stderr, r.stderr[-3000:]
    # The decision's one kernel boot under KVM, then the build VM under TCG: no build VM under KVM.
    calls = fake_host.calls()
    assert calls[0] == "kvm kernel=1" and calls[1:] == ["tcg kernel=1"], calls
    assert load_manifest(out / "linux-tiny").name == "linux-tiny"


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("GH_TEST_DESKTOP") != "1", reason="a desktop build: set GH_TEST_DESKTOP=1")
def test_linux_desktop_builds_under_tcg_at_once(fake_host: FakeKvmHost, scratch: Path) -> None:
    """The desktop build has no KVM-then-TCG retry and a 600 s ready timeout: under KVM on such a
    host it failed. Now it decides TCG before its build VM starts."""
    if os.geteuid() != 0:
        pytest.skip("building linux-desktop needs root (mmdebstrap)")
    out = scratch / "images"
    r = subprocess.run([sys.executable, str(BUILD), "linux-desktop", "--out", str(out)],
                       capture_output=True, text=True, timeout=3600, env=os.environ.copy())
    assert r.returncode == 0, r.stderr[-3000:]
    assert NEVER_PRINTED in r.stderr, r.stderr[-3000:]
    calls = fake_host.calls()
    assert calls[0] == "kvm kernel=1" and calls[1:] == ["tcg kernel=1"], calls
    assert load_manifest(out / "linux-desktop").name == "linux-desktop"
