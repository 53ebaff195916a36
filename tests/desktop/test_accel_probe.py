"""linux-desktop's kernel, the one our 2-vCPU desktops boot, finishes its start under the accelerator
probe (providers/qemu/accel.py) where KVM works (faked with TCG: tests/fakekvm.py). A probe that
waited for a mark this kernel never prints would send every lab host to TCG."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fakekvm import KvmFault, on_path

from providers.qemu.accel import Accelerator, Basis, decide

pytestmark = [pytest.mark.desktop, pytest.mark.desktop_smoke]


def test_the_desktops_kernel_finishes_its_start_under_the_probe(desktop_images_dir: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    fake = on_path(tmp_path / "fake", monkeypatch, KvmFault.WORKS)
    kernel = desktop_images_dir / "linux-desktop" / "vmlinuz"
    d = decide(kernel, tmp_path / "accelerator.json", deadline_s=120)
    assert (d.accelerator, d.basis) == (Accelerator.KVM, Basis.BOOTED), d
    assert f"{kernel} started on {min(2, os.cpu_count() or 1)} virtual CPUs" in d.detail, d
    assert fake.calls() == ["kvm kernel=1"]
