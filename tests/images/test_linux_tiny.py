"""The linux-tiny image as built: valid, small, and (booted with plain QEMU and its guest agent
socket, as the build does) it runs scripts, draws a console, takes keys and absolute pointer events.
The boot through libvirt is the provider's test; this one needs no libvirt."""

from __future__ import annotations

import gzip
import itertools
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from imagebuilder.pipeline import INPUTS_FILE, up_to_date
from imagebuilder.vm import BuildVM, Drive, MachineSpec

from providers.manifest import DirectKernelBoot, load_manifest, sha256_file

from .test_units import parse_newc

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "image-builder" / "build"


def test_the_built_image_is_valid_and_small(images_dir: Path) -> None:
    d = images_dir / "linux-tiny"
    m = load_manifest(d)
    assert (m.os, m.shell, m.machine, m.video) == ("linux", "sh", "pc", "vga")
    assert m.guest_channels == ["qemu-ga", "gh-execd"]
    assert m.tablet == "virtio" and 128 <= m.memory_mib <= 512 and m.vcpus == 1
    assert isinstance(m.boot, DirectKernelBoot)
    assert "root=/dev/vda" in m.boot.cmdline and "console=tty1" in m.boot.cmdline and "console=ttyS0" in m.boot.cmdline
    assert sha256_file(d / m.boot.kernel) == m.boot.kernel_sha256
    assert sha256_file(d / m.boot.initrd) == m.boot.initrd_sha256
    total = sum((d / f).stat().st_size for f in (m.boot.kernel, m.boot.initrd, m.disk.file))
    assert total < 40 * 1024 * 1024, f"{total / 2**20:.1f} MiB"
    info = subprocess.run(["qemu-img", "info", "--output=json", str(d / m.disk.file)],
                          capture_output=True, timeout=30, check=True)
    qi = json.loads(info.stdout)
    assert qi["format"] == "qcow2" and qi["virtual-size"] == m.disk.virtual_size
    assert "backing-filename" not in qi  # a standalone base for overlays

    raw = (d / m.boot.initrd).read_bytes()
    initrd = parse_newc(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    assert {"init", "bin/busybox", "dev/console", "lib/modules/modules.load"} <= set(initrd)
    order = [Path(p).name for p in initrd["lib/modules/modules.load"][1].decode().split()]
    chain = ["virtio_ring.ko", "virtio.ko", "virtio_pci_modern_dev.ko", "virtio_pci_legacy_dev.ko",
             "virtio_pci.ko", "virtio_blk.ko"]
    assert [x for x in order if x in chain] == chain
    for p in initrd["lib/modules/modules.load"][1].decode().split():
        assert initrd[f"lib/modules/{p}"][1][:4] == b"\x7fELF", f"{p} is not an uncompressed module"

    record = json.loads((d / INPUTS_FILE).read_text())
    assert len(record["digest"]) == 64 and m.version == record["digest"][:16]
    pkgs = " ".join(record["inputs"]["packages"])
    for needed in ("linux-image-", "busybox-static_", "qemu-guest-agent_", "libglib2.0-0_", "libc6_"):
        assert needed in pkgs


@pytest.fixture
def booted(images_dir: Path, scratch: Path) -> Iterator[BuildVM]:
    d = images_dir / "linux-tiny"
    m = load_manifest(d, verify_checksum=False)
    assert isinstance(m.boot, DirectKernelBoot)
    overlay = scratch / "overlay.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(d / m.disk.file), "-F", "qcow2",
                    str(overlay)], check=True, timeout=30)
    spec = MachineSpec(
        name="imgtest", machine=m.machine, memory_mib=m.memory_mib, vcpus=m.vcpus, video=m.video,
        kernel=d / m.boot.kernel, initrd=d / m.boot.initrd, cmdline=m.boot.cmdline,
        drives=[Drive(overlay, "qcow2")], tablet=m.tablet,
    )
    with BuildVM(spec, "tcg", scratch) as vm:
        vm.qga.wait_ready(90)
        yield vm


def _until(pred: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.mark.slow
def test_booted_image_runs_scripts_and_takes_keys_and_pointer(booted: BuildVM, images_dir: Path) -> None:
    vm = booted
    version = load_manifest(images_dir / "linux-tiny", verify_checksum=False).version
    r = vm.qga.run_script("/bin/sh", "cat /etc/gh-image-version; echo oops >&2; exit 3\n")
    assert (r.exit_code, r.stdout.strip(), r.stderr.strip()) == (3, version, "oops")
    big = "echo " + "x" * 20000 + " | wc -c\n"  # scripts go on stdin: no argv length limit
    assert vm.qga.run_script("/bin/sh", big).stdout.strip() == "20001"
    # gh-reseed, which a restored machine's first script runs: the kernel takes host bytes and
    # reseeds (exit 0); anything but hex is refused (exit 2).
    assert vm.qga.run_script("/bin/sh", "/usr/sbin/gh-reseed " + "5a" * 32).exit_code == 0
    assert [vm.qga.run_script("/bin/sh", f"/usr/sbin/gh-reseed {a}").exit_code for a in ("xyz", "abc", "")] == [2] * 3
    # gh-execd, started by init, waits for its port, which the build's machine does not have:
    # asleep, not spinning (providers/qemu/execd.py; test_execd.py runs scripts through it).
    state = vm.qga.run_script("/bin/sh", 'p=$(pidof gh-execd) && cut -d" " -f3 "/proc/$p/stat"\n')
    assert (state.exit_code, state.stdout.strip()) == (0, "S")

    # The console: a shell on tty1 that takes keys, seen through the guest agent.
    vm.wait_screen_text(30)
    _until(lambda: vm.qga.run_script("/bin/sh", "ls -l /proc/[0-9]*/fd/0 2>/dev/null | grep -q tty1").exit_code == 0,
           60, "a shell on tty1")
    vm.type_text("echo Typed-123 >/run/typed\n")
    _until(lambda: vm.qga.run_script("/bin/sh", "cat /run/typed 2>/dev/null").stdout == "Typed-123\n", 30,
           "typed text to reach the shell")

    # The absolute pointer: an input-send-event reaches the tablet's /dev/input node.
    start = (
        "ev=$(grep -A5 Tablet /proc/bus/input/devices | grep -o 'event[0-9]*' | head -n 1)\n"
        "test -n \"$ev\" || exit 1\n"
        "dd if=/dev/input/$ev of=/run/ev bs=24 count=1 </dev/null >/dev/null 2>&1 &\n"
    )
    assert vm.qga.run_script("/bin/sh", start).exit_code == 0

    # dd may not have opened the node yet, and events before that are lost: send until one lands. Each time
    # to another place: the kernel drops an absolute event that repeats the axis's last value, so the same
    # point sent again after a first one came before dd never reaches it.
    sent = itertools.count()

    def moved() -> bool:
        n = next(sent)
        vm.qmp.execute("input-send-event", {"events": [
            {"type": "abs", "data": {"axis": "x", "value": 12345 + n}},
            {"type": "abs", "data": {"axis": "y", "value": 23456 + n}},
        ]})
        return vm.qga.run_script("/bin/sh", "test -s /run/ev").exit_code == 0
    _until(moved, 30, "an absolute pointer event in /dev/input")


def test_a_tampered_image_is_not_up_to_date(images_dir: Path, scratch: Path) -> None:
    copy = scratch / "linux-tiny"
    shutil.copytree(images_dir / "linux-tiny", copy)
    digest = json.loads((copy / INPUTS_FILE).read_text())["digest"]
    assert up_to_date(copy, digest) is not None
    assert up_to_date(copy, "0" * 64) is None
    with (copy / "disk.qcow2").open("ab") as f:
        f.write(b"\0")
    assert up_to_date(copy, digest) is None


@pytest.mark.slow
def test_build_from_scratch_then_a_second_build_is_instant(scratch: Path) -> None:
    out = scratch / "images"
    py = REPO / ".venv" / "bin" / "python"
    first = subprocess.run([str(py), str(BUILD), "linux-tiny", "--out", str(out)],
                           capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "VGA console shows a shell and takes keyboard input" in first.stderr
    m = load_manifest(out / "linux-tiny")
    assert sorted(p.name for p in out.iterdir()) == [".linux-tiny.lock", "linux-tiny"]  # no staging left
    t = time.monotonic()
    second = subprocess.run([str(py), str(BUILD), "linux-tiny", "--out", str(out)],
                            capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t
    assert second.returncode == 0 and "is up to date" in second.stderr, second.stderr
    assert took < 10, f"second build took {took:.1f} s"
    assert load_manifest(out / "linux-tiny") == m


def test_bad_arguments_are_refused_clearly(scratch: Path) -> None:
    py = REPO / ".venv" / "bin" / "python"
    r = subprocess.run([str(py), str(BUILD), "no-such-image", "--out", str(scratch)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "invalid choice: 'no-such-image'" in r.stderr
    r = subprocess.run([str(py), str(BUILD), "linux-tiny"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--out" in r.stderr
