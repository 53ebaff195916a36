"""The one accelerator decision (providers/qemu/accel.py) on hosts whose KVM runs firmware but never
a Linux kernel, starts a kernel and hangs it, or works (tests/fakekvm.py), and the one /dev/kvm
check, which names the user it judged for."""

from __future__ import annotations

import grp
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakekvm import FakeKvmHost, KvmFault, on_path

from providers.qemu import accel
from providers.qemu.accel import Accelerator, Basis, decide
from providers.qemu.hostcheck import QEMU_USER, KvmAccessStatus, kvm_device_access, user_ids

from .conftest import ensure_libvirtd, make_provider

# A boot sector that writes to isa-debug-exit: QEMU exits 99 only if the guest's code ran.
_EXITING_BOOT_SECTOR = bytes([0xB0, 0x31, 0xE6, 0xF4, 0xF4, 0xEB, 0xFD]).ljust(510, b"\0") + b"\x55\xaa"


@pytest.fixture
def fake_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKvmHost]:
    yield on_path(tmp_path / "fake", monkeypatch)


def test_the_fake_host_runs_firmware_under_kvm(fake_host: FakeKvmHost, tmp_path: Path) -> None:
    """What a firmware-level probe sees on such a host: guest code runs under "KVM"."""
    disk = tmp_path / "sector.img"
    disk.write_bytes(_EXITING_BOOT_SECTOR)
    r = subprocess.run([str(fake_host.qemu), "-machine", "pc,accel=kvm", "-cpu", "host", "-m", "16", "-nodefaults",
                        "-display", "none", "-drive", f"file={disk},format=raw,if=ide",
                        "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"], capture_output=True, timeout=60)
    assert r.returncode == 99, r.stderr


def test_kvm_that_runs_firmware_but_not_a_kernel_means_tcg(fake_host: FakeKvmHost, images_dir: Path,
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = images_dir / "linux-tiny" / "vmlinuz"
    kept = tmp_path / "accelerator.json"
    d = decide(kernel, kept)
    assert (d.accelerator, d.basis, d.cached) == (Accelerator.TCG, Basis.KERNEL_SILENT, False), d
    assert "a Linux kernel booted under KVM never printed" in str(d) and str(kernel) in d.reason, d
    assert fake_host.calls() == ["kvm kernel=1"]  # one boot, of that kernel, under KVM

    # Kept for this boot of the host: in memory, and in the file for the next process.
    assert decide(kernel, kept) == decide(None, kept)
    assert decide(None, kept).cached and fake_host.calls() == ["kvm kernel=1"]
    monkeypatch.setattr(accel, "_kept", {})
    again = decide(None, kept)
    assert (again.accelerator, again.basis, again.cached) == (Accelerator.TCG, Basis.KERNEL_SILENT, True)
    assert fake_host.calls() == ["kvm kernel=1"]


def test_kvm_that_starts_a_kernel_but_hangs_it_means_tcg(tmp_path: Path, images_dir: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's first line is not proof: the host of issue 52 chose KVM on it, and its 2-vCPU
    desktop never finished booting."""
    fake = on_path(tmp_path / "fake", monkeypatch, KvmFault.KERNEL_HANGS)
    kernel = images_dir / "linux-tiny" / "vmlinuz"
    kept = tmp_path / "accelerator.json"
    d = decide(kernel, kept)
    assert (d.accelerator, d.basis) == (Accelerator.TCG, Basis.KERNEL_HUNG), d
    assert str(d).startswith("tcg: a Linux kernel started under KVM but never finished starting"), d
    assert "printed its first line" in d.detail and str(kernel) in d.detail, d
    assert fake.calls() == ["kvm kernel=1"]
    monkeypatch.setattr(accel, "_kept", {})
    assert decide(None, kept).basis is Basis.KERNEL_HUNG and fake.calls() == ["kvm kernel=1"]  # kept


def test_working_kvm_boots_the_kernel_to_the_end_of_its_start(tmp_path: Path, images_dir: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Under KVM that works the probe sees linux-tiny's kernel finish its start on two virtual CPUs
    (faked with TCG, so the bound is TCG's)."""
    fake = on_path(tmp_path / "fake", monkeypatch, KvmFault.WORKS)
    kernel = images_dir / "linux-tiny" / "vmlinuz"
    d = decide(kernel, tmp_path / "accelerator.json", deadline_s=120)
    assert (d.accelerator, d.basis) == (Accelerator.KVM, Basis.BOOTED), d
    assert f"{kernel} started on {min(2, os.cpu_count() or 1)} virtual CPUs" in d.detail, d
    assert fake.calls() == ["kvm kernel=1"]


def test_a_verdict_kept_by_an_older_probe_is_not_trusted(fake_host: FakeKvmHost, images_dir: Path,
                                                         tmp_path: Path) -> None:
    kept = tmp_path / "accelerator.json"
    qemu = accel.qemu_binary()
    kept.write_text(json.dumps({f"{accel.boot_id()}:{qemu}": {"accelerator": "kvm", "basis": "booted",
                                                              "detail": "printed its first line"}}))
    d = decide(images_dir / "linux-tiny" / "vmlinuz", kept)
    assert (d.accelerator, d.cached) == (Accelerator.TCG, False), d
    assert fake_host.calls() == ["kvm kernel=1"]


async def test_the_provider_starts_with_the_decision(fake_host: FakeKvmHost, images_dir: Path, state_root: Path,
                                                     runner_name: str) -> None:
    ensure_libvirtd()
    p = make_provider(images_dir, state_root, runner_name, "fake-kvm")
    await p.start()
    try:
        assert p.accelerator == "tcg", p.accelerator_reason
        assert p.accelerator_reason.startswith("a Linux kernel booted under KVM never printed"), p.accelerator_reason
        assert fake_host.calls() == ["kvm kernel=1"]
    finally:
        await p.close()


def test_no_kernel_is_unproven_and_not_kept(fake_host: FakeKvmHost, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accel, "host_kernel", lambda: None)
    kept = tmp_path / "accelerator.json"
    d = decide(None, kept)
    assert (d.accelerator, d.basis) == (Accelerator.KVM, Basis.UNPROVEN) and "unproven" in str(d), d
    assert fake_host.calls() == ["kvm kernel=0"]  # QEMU started under KVM, paused: no guest ran
    assert not kept.exists() and decide(None, kept) == d and len(fake_host.calls()) == 2  # not kept


def test_the_kvm_device_check_names_the_user_it_judged_for(tmp_path: Path) -> None:
    if os.geteuid() != 0 or user_ids(QEMU_USER) is None:
        pytest.skip(f"needs root (to chown) and a {QEMU_USER} user")
    device = tmp_path / "kvm"
    device.touch()
    os.chown(device, 0, 0)
    device.chmod(0o600)  # as a host without udev leaves /dev/kvm

    me = kvm_device_access(None, device)
    assert (me.user, me.status) == ("root", KvmAccessStatus.OPENS)
    assert str(me) == (f"{device} is root:root 0600: root can open it "
                       f"(root always can: that proves nothing for {QEMU_USER})")
    qemu = kvm_device_access(QEMU_USER, device)
    assert (qemu.user, qemu.status, qemu.problem) == (QEMU_USER, KvmAccessStatus.DENIED, True)
    assert str(qemu).startswith(f"{device} is root:root 0600: {QEMU_USER} (the user QEMU runs as) cannot open it")

    ids = user_ids(QEMU_USER)
    kvm_gid = grp.getgrnam("kvm").gr_gid
    if ids is None or kvm_gid not in ids.gids:
        pytest.skip(f"{QEMU_USER} is not in group kvm here")
    os.chown(device, 0, kvm_gid)
    device.chmod(0o660)  # what udev's rule leaves
    fixed = kvm_device_access(QEMU_USER, device)
    assert fixed.opens and str(fixed) == f"{device} is root:kvm 0660: {QEMU_USER} (the user QEMU runs as) can open it"
    assert kvm_device_access(QEMU_USER, tmp_path / "none").status is KvmAccessStatus.MISSING
