"""Unit tests of the builder's pieces, each at a clear boundary (bytes in, bytes out; a socketpair
standing in for QEMU's socket)."""

from __future__ import annotations

import gzip
import json
import socket
import stat
import threading
import time
from pathlib import Path

import pytest
from imagebuilder import cpio
from imagebuilder.errors import BuildError
from imagebuilder.jsonsock import JsonSocket
from imagebuilder.kmod import ModuleTree
from imagebuilder.vm import Drive, MachineSpec, _qcodes


def parse_newc(data: bytes) -> dict[str, tuple[int, bytes, tuple[int, int]]]:
    """A reader independent of the writer: name -> (mode, data, rdev)."""
    out: dict[str, tuple[int, bytes, tuple[int, int]]] = {}
    pos = 0
    while True:
        assert data[pos : pos + 6] == b"070701", f"bad magic at {pos}"
        f = [int(data[pos + 6 + 8 * i : pos + 14 + 8 * i], 16) for i in range(13)]
        mode, size, rmaj, rmin, namesize = f[1], f[6], f[9], f[10], f[11]
        name = data[pos + 110 : pos + 110 + namesize - 1].decode()
        pos = (pos + 110 + namesize + 3) & ~3
        body = data[pos : pos + size]
        pos = (pos + size + 3) & ~3
        if name == "TRAILER!!!":
            return out
        out[name] = (mode, body, (rmaj, rmin))


def test_newc_archive_holds_files_dirs_links_and_devices_reproducibly() -> None:
    entries = [
        cpio.dir_entry("bin"),
        cpio.file_entry("bin/busybox", b"\x7fELF" + b"x" * 1001, 0o755),
        cpio.symlink_entry("bin/sh", "busybox"),
        cpio.chardev_entry("dev/console", 5, 1),
        cpio.file_entry("init", b"#!/bin/sh\n", 0o755),
    ]
    archive = gzip.decompress(cpio.gzip_newc(entries))
    got = parse_newc(archive)
    assert set(got) == {"bin", "bin/busybox", "bin/sh", "dev/console", "init"}
    assert stat.S_ISDIR(got["bin"][0])
    assert got["bin/busybox"][1].startswith(b"\x7fELF") and len(got["bin/busybox"][1]) == 1005
    assert stat.S_IMODE(got["bin/busybox"][0]) == 0o755
    assert stat.S_ISLNK(got["bin/sh"][0]) and got["bin/sh"][1] == b"busybox"
    assert stat.S_ISCHR(got["dev/console"][0]) and got["dev/console"][2] == (5, 1)
    # Same entries in another order: byte-identical (sorted, mtime 0).
    assert cpio.gzip_newc(list(reversed(entries))) == cpio.gzip_newc(entries)


def _fake_module(root: Path, rel: str, depends: str) -> None:
    p = root / "lib/modules/6.1.0-test/kernel" / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"\x7fELF...\x00license=GPL\x00depends=" + depends.encode() + b"\x00vermagic=6.1\x00")


def test_modules_load_after_their_dependencies_and_builtins_are_skipped(tmp_path: Path) -> None:
    _fake_module(tmp_path, "drivers/virtio/virtio_ring.ko", "")
    _fake_module(tmp_path, "drivers/virtio/virtio.ko", "")
    _fake_module(tmp_path, "drivers/virtio/virtio_pci.ko", "virtio_ring,virtio,virtio_pci_modern_dev")
    _fake_module(tmp_path, "drivers/virtio/virtio_pci_modern_dev.ko", "")
    _fake_module(tmp_path, "drivers/block/virtio_blk.ko", "virtio_ring,virtio")
    _fake_module(tmp_path, "drivers/hid/hid-generic.ko", "hid")
    (tmp_path / "lib/modules/6.1.0-test/modules.builtin").write_text("kernel/drivers/hid/hid.ko\n")
    tree = ModuleTree.load(tmp_path, "6.1.0-test")
    assert tree.load_order(["virtio_blk", "virtio_pci"]) == [
        "virtio_ring", "virtio", "virtio_blk", "virtio_pci_modern_dev", "virtio_pci",
    ]
    assert tree.load_order(["hid-generic"]) == ["hid_generic"]  # hid is built in
    assert tree.load_order(["virtio_blk"], already={"virtio_ring", "virtio"}) == ["virtio_blk"]
    assert tree.available(["virtio_blk", "usbhid", "ext4"], optional={"usbhid"}) == ["virtio_blk", "ext4"]
    with pytest.raises(BuildError, match="ext4 is neither in the kernel package nor built in"):
        tree.load_order(["ext4"])
    rels = tree.install(["virtio_blk"], tmp_path / "out")
    assert rels == ["kernel/drivers/block/virtio_blk.ko"]
    assert (tmp_path / "out" / rels[0]).read_bytes().startswith(b"\x7fELF")


def test_json_socket_skips_garbage_before_the_qga_delimiter() -> None:
    a, b = socket.socketpair()
    js = JsonSocket(Path("unused"))
    js.sock = a
    try:
        b.sendall(b'{"return": 1}\n' + b'half a stale {"re' + b"\xff" + b'{"return": 42}\n' + b"not json\n")
        assert js.recv(time.monotonic() + 2) == {"return": 1}
        assert js.recv(time.monotonic() + 2) == {"return": 42}
        assert js.recv(time.monotonic() + 0.2) is None  # "not json" is dropped, then the deadline
        threading.Timer(0.1, lambda: b.sendall(json.dumps({"event": "X"}).encode() + b"\n")).start()
        assert js.recv(time.monotonic() + 5) == {"event": "X"}
        b.close()
        with pytest.raises(ConnectionError):
            js.recv(time.monotonic() + 2)
    finally:
        a.close()


def test_build_vm_command_line_has_the_sockets_devices_and_no_hv_flags_under_tcg(tmp_path: Path) -> None:
    spec = MachineSpec(
        name="w", machine="q35", hyperv=True, tablet="usb", memory_mib=4096, vcpus=2, firmware="bios",
        drives=[Drive(tmp_path / "d.qcow2", "qcow2"), Drive(tmp_path / "w.iso", "raw", "cdrom", "sata")],
    )
    kvm = spec.argv("kvm", tmp_path)
    joined = " ".join(kvm)
    assert "q35,accel=kvm,hpet=off" in joined
    assert "hv_relaxed" in joined and "hv_time" in joined and "hv_stimer" in joined
    assert "usb-tablet,bus=usb.0" in joined and "virtio-blk-pci,drive=drive0" in joined
    assert "ide-cd,drive=drive1,bus=ide.0" in joined
    assert f"unix:{tmp_path / 'qmp.sock'},server=on,wait=off" in joined
    assert "name=org.qemu.guest_agent.0" in joined
    tcg = " ".join(spec.argv("tcg", tmp_path))
    assert "hv_" not in tcg  # TCG refuses the enlightenments; the build still runs, slowly


def test_typing_maps_shifted_characters() -> None:
    assert _qcodes("a") == ["a"] and _qcodes("A") == ["shift", "a"]
    assert _qcodes(">") == ["shift", "dot"] and _qcodes("\n") == ["ret"] and _qcodes(" ") == ["spc"]
    with pytest.raises(BuildError, match="cannot type"):
        _qcodes("é")


def test_publish_swaps_in_a_validated_image_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    import hashlib

    from imagebuilder import pipeline

    from providers.manifest import DiskFile, FirmwareBoot, ImageManifest, load_manifest

    def manifest(data: bytes, sha: str | None = None) -> ImageManifest:
        return ImageManifest(
            name="toy", os="linux", version="1", shell="sh", guest_channels=["qemu-ga"],
            boot=FirmwareBoot(kind="bios"), memory_mib=128, vcpus=1,
            disk=DiskFile(file="disk.qcow2", sha256=sha or hashlib.sha256(data).hexdigest()),
        )

    out = tmp_path / "images"
    for content in (b"first", b"second"):
        staging = pipeline.staging_dir(out, "toy")
        (staging / "disk.qcow2").write_bytes(content)
        final = pipeline.publish(staging, manifest(content), {"k": 1}, "d" * 64)
        assert final == out / "toy" and (final / "disk.qcow2").read_bytes() == content
        assert load_manifest(final).disk.sha256 == hashlib.sha256(content).hexdigest()
        assert pipeline.up_to_date(final, "d" * 64) is not None
    assert sorted(p.name for p in out.iterdir()) == ["toy"]
    staging = pipeline.staging_dir(out, "toy")
    (staging / "disk.qcow2").write_bytes(b"third")
    with pytest.raises(BuildError, match=r"does not validate: .*checksum mismatch"):
        pipeline.publish(staging, manifest(b"third", sha="0" * 64), {}, "e" * 64)
    pipeline.discard(staging)
    assert (out / "toy" / "disk.qcow2").read_bytes() == b"second"  # the good image stays
    assert sorted(p.name for p in out.iterdir()) == ["toy"]


def test_a_second_build_waits_for_the_first(tmp_path: Path) -> None:
    from imagebuilder.pipeline import build_lock

    order: list[str] = []

    def second() -> None:
        with build_lock(tmp_path, "toy"):
            order.append("second")

    with build_lock(tmp_path, "toy"):
        with pytest.raises(BuildError, match="held its lock"), build_lock(tmp_path, "toy", timeout=0.3):
            pass
        t = threading.Thread(target=second)
        t.start()
        order.append("first")  # the second builder cannot append before this block releases the lock
    t.join(30)
    assert order == ["first", "second"]
    with build_lock(tmp_path, "toy", timeout=0.3):
        pass


def test_module_signature_is_stripped_exactly() -> None:
    from imagebuilder.kmod import strip_signature

    body = b"\x7fELF" + b"m" * 100
    sig = b"S" * 681
    info = bytes([0, 0, 2, 0, 0, 0, 0, 0]) + (681).to_bytes(4, "big")  # struct module_signature
    signed = body + sig + info + b"~Module signature appended~\n"
    assert strip_signature(signed) == body
    assert strip_signature(body) == body  # unsigned stays as it is


def test_guest_agent_errors_and_lost_connections_are_build_errors() -> None:
    from imagebuilder.qga import QGA

    a, b = socket.socketpair()
    qga = QGA(Path("unused"))
    qga.js.sock = a
    try:
        b.sendall(b'{"error": {"class": "CommandNotFound", "desc": "no such command"}}\n')
        with pytest.raises(BuildError, match="guest agent guest-nope: no such command"):
            qga.execute("guest-nope", timeout=5)
        with pytest.raises(BuildError, match="no answer within 0 s"):
            qga.execute("guest-ping", timeout=0.2)
        b.close()
        with pytest.raises(BuildError, match="connection lost"):
            qga.execute("guest-ping", timeout=5)
    finally:
        a.close()
