"""The first run on a fresh host: a /dev/kvm nothing set up, libvirt started the host's way, and the
one plain warning when the hypervisor answers slowly.

The /dev/kvm test changes the real device (as a host without udev leaves it) and restores it as it
found it; the libvirt-up tests run the real script with `systemctl`, `libvirtd` and `virtlogd`
replaced on PATH by recorders: the script's contract is which of them it calls, and systemd as PID 1
does not exist on this host (it never met a real systemd here; the units are what Debian 12 ships).
"""

from __future__ import annotations

import asyncio
import grp
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from kit.scratch import traversable_tmpdir

from providers.base import HostCheck, MachineSource
from providers.qemu import hostcheck, hostchecks
from providers.qemu.errors import in_thread
from providers.qemu.hostcheck import SlowCall, SlowHypervisorNotice
from providers.qemu.provider import QemuProvider

REPO = Path(__file__).resolve().parents[2]
KVM = Path("/dev/kvm")


@pytest.fixture
def bin_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="gh-fresh-bin-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _recorder(bin_dir: Path, name: str, exit_code: int = 0, body: str = "") -> Path:
    """A stand-in for `name` that appends its argv to NAME.calls, runs `body`, exits with `exit_code`."""
    calls = bin_dir / f"{name}.calls"
    tool = bin_dir / name
    tool.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n{body}\nexit {exit_code}\n')
    tool.chmod(0o755)
    return calls


def _libvirt_up(bin_dir: Path, systemd_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GH_SYSTEMD_RUN_DIR": str(systemd_dir)}
    return subprocess.run(["bash", str(REPO / "scripts" / "libvirt-up.sh")], capture_output=True, text=True,
                          timeout=120, env=env, check=False)


def _calls(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.libvirt
def test_libvirt_up_uses_the_system_units_where_systemd_is_pid1(bin_dir: Path, tmp_path: Path) -> None:
    systemd_dir = tmp_path / "run-systemd-system"
    systemd_dir.mkdir()
    # Nothing active yet: `is-active` answers 3 ("inactive", as systemctl does), enable succeeds.
    systemctl = _recorder(bin_dir, "systemctl", body='[ "$1" = is-active ] && exit 3')
    libvirtd, virtlogd = _recorder(bin_dir, "libvirtd"), _recorder(bin_dir, "virtlogd")
    r = _libvirt_up(bin_dir, systemd_dir)
    assert r.returncode == 0, r.stderr
    assert _calls(systemctl) == [
        "is-active --quiet virtlogd.service", "is-active --quiet virtlogd.socket", "enable --now virtlogd.socket",
        "is-active --quiet libvirtd.service", "is-active --quiet libvirtd.socket", "enable --now libvirtd.socket",
    ], r.stderr
    assert _calls(libvirtd) == [] and _calls(virtlogd) == [], "started an unmanaged daemon beside systemd's"
    assert "enabling libvirtd.socket" in r.stderr
    systemctl.unlink()
    _recorder(bin_dir, "systemctl", exit_code=0)  # every unit active: nothing to enable, libvirt answers
    r = _libvirt_up(bin_dir, systemd_dir)
    assert r.returncode == 0, r.stderr
    assert _calls(bin_dir / "systemctl.calls") == ["is-active --quiet virtlogd.service",
                                                   "is-active --quiet libvirtd.service"]
    assert _calls(libvirtd) == [] and _calls(virtlogd) == []
    assert "starting" not in r.stderr


@pytest.mark.libvirt
def test_libvirt_up_starts_its_own_daemons_only_without_systemd(bin_dir: Path, tmp_path: Path) -> None:
    _recorder(bin_dir, "pgrep", exit_code=1)  # "not running"
    systemctl = _recorder(bin_dir, "systemctl")
    libvirtd = _recorder(bin_dir, "libvirtd", body=f'echo "$PATH" > {bin_dir}/libvirtd.path')
    virtlogd = _recorder(bin_dir, "virtlogd")
    r = _libvirt_up(bin_dir, tmp_path / "no-such-dir")
    assert r.returncode == 0, r.stderr  # the real libvirtd answers virsh
    assert _calls(virtlogd) == ["-d"] and _calls(libvirtd) == ["-d"]
    # Started with the system's PATH, not the caller's: libvirtd would take a test's fake QEMU for its own.
    assert str(bin_dir) not in (bin_dir / "libvirtd.path").read_text()
    assert _calls(systemctl) == []
    assert "starting libvirtd (no systemd here)" in r.stderr


async def test_a_slow_hypervisor_is_named_once_with_the_kvm_cause(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    if hostcheck.user_ids() is None:
        pytest.skip("no libvirt-qemu user on this host")
    device = tmp_path / "kvm"
    device.touch()
    device.chmod(0o600)  # root:root 0600, as a host without udev leaves /dev/kvm
    notice = SlowHypervisorNotice(device=device)
    monkeypatch.setattr("providers.qemu.errors.slow_hypervisor", notice)
    monkeypatch.setitem(hostcheck.SLOW_BOUNDS_S, SlowCall.STATE, 0.05)
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            await in_thread("reading machine state", time.sleep, 0.1, timeout=10, slow=SlowCall.STATE)
        await in_thread("reading machine state", time.sleep, 0.0, timeout=10, slow=SlowCall.STATE)
    said = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert len(said) == 1, said  # once, not once per call
    assert said[0].startswith("the hypervisor answers slowly: reading machine state took 0.1 s")
    assert f"{device} is root:root 0600: libvirt-qemu (the user QEMU runs as) cannot open it" in said[0]
    assert "fix: chgrp kvm /dev/kvm && chmod 0660 /dev/kvm" in said[0]


def _quick_doctor(images_dir: Path, state_dir: Path) -> dict[str, HostCheck]:
    """The checks a fresh host fails (libvirt, the device as QEMU's user, capability probing)."""
    cfg = hostchecks.HostContext("qemu:///system", images_dir)
    out = {}
    for check in (hostchecks.check_libvirt, hostchecks.check_kvm_device, hostchecks.check_capabilities):
        c = check(cfg)
        out[c.name] = c
    if cfg.conn is not None:
        cfg.conn.close()
    return out


class _Cfg:
    def __init__(self, images_dir: Path, state_dir: Path) -> None:
        self.images_dir, self.state_dir = images_dir, state_dir
        self.server, self.token, self.token_file, self.slots = None, None, None, 1
        self.libvirt_uri = "qemu:///system"


@pytest.fixture
def kvm_as_found() -> Iterator[os.stat_result]:
    """/dev/kvm's owner and mode, put back after the test whatever it did."""
    if os.geteuid() != 0 or not KVM.exists():
        pytest.skip("needs root and /dev/kvm")
    if Path("/run/udev/control").exists():
        pytest.skip("udev manages /dev/kvm here: setup leaves it alone")
    st = KVM.stat()
    try:
        yield st
    finally:
        os.chown(KVM, st.st_uid, st.st_gid)
        KVM.chmod(stat.S_IMODE(st.st_mode))


@pytest.mark.libvirt
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fresh_host_kvm_mode_doctor_names_it_and_setup_fixes_it(kvm_as_found: os.stat_result, images_dir: Path,
                                                                tmp_path: Path) -> None:
    state = traversable_tmpdir("gh-fresh-host-")
    try:
        os.chown(KVM, 0, 0)
        KVM.chmod(0o600)
        found = _quick_doctor(images_dir, state)
        assert found["libvirt"].status == "OK", found
        kvmdev, caps = found["kvmdev"], found["caps"]
        assert kvmdev.status == "FAIL" and "/dev/kvm is root:root 0600: libvirt-qemu" in kvmdev.detail, kvmdev
        assert kvmdev.fix is not None and kvmdev.fix.startswith("chgrp kvm /dev/kvm && chmod 0660 /dev/kvm")
        assert caps.status == "FAIL" and "capability probing storm" in caps.detail, caps
        assert "rewrote libvirt's capability cache" in caps.detail and "cause: /dev/kvm" in caps.detail

        r = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], capture_output=True, text=True,
                           timeout=600, cwd=REPO, env={**os.environ, "GH_IMAGES_DIR": str(images_dir)}, check=False)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "/dev/kvm was root:root 600: setting root:kvm 0660, as udev would" in r.stderr
        st = KVM.stat()
        assert (grp.getgrgid(st.st_gid).gr_name, stat.S_IMODE(st.st_mode)) == ("kvm", 0o660)
        again = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], capture_output=True, text=True,
                               timeout=600, cwd=REPO, env={**os.environ, "GH_IMAGES_DIR": str(images_dir)})
        assert again.returncode == 0 and "/dev/kvm was" not in again.stderr  # idempotent: nothing to change

        fixed = _quick_doctor(images_dir, state)
        assert [fixed[n].status for n in ("libvirt", "kvmdev", "caps")] == ["OK", "OK", "OK"], fixed

        # A machine starts, and the provider found nothing slow to warn about.
        notice = SlowHypervisorNotice()
        asyncio.run(_start_one(images_dir, state, notice))
        assert notice.said is None, notice.said
    finally:
        shutil.rmtree(state, ignore_errors=True)


async def _start_one(images_dir: Path, state: Path, notice: SlowHypervisorNotice) -> None:
    import providers.qemu.errors as errors

    saved, errors.slow_hypervisor = errors.slow_hypervisor, notice  # type: ignore[attr-defined]
    provider = QemuProvider(images_dir, state, f"fresh{os.getpid()}")
    try:
        machine = await provider.create_machine("m1", MachineSource(image="linux-tiny"), timeout=120)
        try:
            await machine.wait_ready(180)
            r = await machine.run_script("echo ready", timeout=60)
            assert r.stdout == "ready\n"
        finally:
            await machine.destroy()
    finally:
        errors.slow_hypervisor = saved  # type: ignore[attr-defined]
        await provider.close()
