"""Unit tests of the QEMU provider's pure parts (no libvirt, no guest)."""

from __future__ import annotations

import io
import struct
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import libvirt
import pytest
from PIL import Image

from gh_wire.input import ClickEvent, DoubleClickEvent, MouseDownEvent, MouseUpEvent, MoveEvent, ScrollEvent
from providers.errors import InputNotSupported, ProviderError
from providers.manifest import parse_manifest
from providers.qemu.domain import (
    METADATA_NS,
    DomainSpec,
    Ownership,
    build_domain_xml,
    domain_name,
    ownership_from_domain_xml,
    rewrite_saved_xml,
    safe_part,
)
from providers.qemu.errors import plain_reason
from providers.qemu.input import ABS_MAX, abs_value, button_event, move_events, pointer_batches
from providers.qemu.keymap import SHIFT, char_keys, combo_keys, key_name, text_keys
from providers.qemu.saveimage import HEADER, MAGIC, read_save_image, write_machine_copy
from providers.qemu.screen import png_swap_verdict, to_png

MANIFEST = """
name: linux-tiny
os: linux
version: "1"
shell: sh
guest_channels: [qemu-ga]
boot: {kind: direct-kernel, kernel: vmlinuz, initrd: initrd.img, cmdline: "console=ttyS0 root=/dev/vda"}
memory_mib: 256
vcpus: 1
disk: {file: disk.qcow2, sha256: "%s"}
""" % ("0" * 64)


def spec(**kw: object) -> DomainSpec:
    m = parse_manifest(MANIFEST)
    for key in ("network", "tablet", "guest_channels"):
        if kw.get(key):
            m = m.model_copy(update={key: kw[key]})
    return DomainSpec(name="gh-r1-at_1", manifest=m, image_dir=Path("/img/linux-tiny"), overlay=Path("/st/o.qcow2"),
                      console_log=Path("/st/console.log"), ownership=Ownership("r1", "at_1", "/st"),
                      accelerator=str(kw.get("accel", "tcg")))


# -- names and XML ----------------------------------------------------------------------------

def test_domain_names_are_libvirt_safe_and_distinct() -> None:
    assert domain_name("lab-1", "at_abc123") == "gh-lab-1-at_abc123"
    a, b = safe_part("job/1 x"), safe_part("job:1 x")
    assert a != b and all(c.isalnum() or c in "-_." for c in a + b)
    assert len(safe_part("x" * 300)) <= 40


def test_domain_xml_has_owner_tablet_agent_no_network_and_a_display_without_listener() -> None:
    xml = build_domain_xml(spec())
    root = ET.fromstring(xml)
    assert root.get("type") == "qemu"
    assert root.findtext("name") == "gh-r1-at_1"
    assert ownership_from_domain_xml(xml) == Ownership("r1", "at_1", "/st")
    inputs = [(i.get("type"), i.get("bus")) for i in root.iter("input")]
    assert ("tablet", "usb") in inputs
    virtio = ET.fromstring(build_domain_xml(spec(tablet="virtio")))
    assert ("tablet", "virtio") in [(i.get("type"), i.get("bus")) for i in virtio.iter("input")]
    assert [c.get("model") for c in virtio.iter("controller") if c.get("type") == "usb"] == ["none"]
    chans = [c.find("target").get("name") for c in root.iter("channel")]  # type: ignore[union-attr]
    assert chans == ["org.qemu.guest_agent.0"]
    both = ET.fromstring(build_domain_xml(spec(guest_channels=["qemu-ga", "gh-execd"])))
    chans = [c.find("target").get("name") for c in both.iter("channel")]  # type: ignore[union-attr]
    assert chans == ["org.qemu.guest_agent.0", "org.ghrunner.exec.0"]  # paths left to libvirt
    assert all(c.find("source") is None for c in both.iter("channel"))
    assert root.find("devices/interface") is None
    [graphics] = root.findall("devices/graphics")  # VNC, only through libvirt's fd: no port, no socket file
    assert graphics.get("type") == "vnc" and [(el.get("type")) for el in graphics.findall("listen")] == ["none"]
    assert graphics.get("port") is None and graphics.get("autoport") is None
    assert root.find("devices/disk/source").get("file") == "/st/o.qcow2"  # type: ignore[union-attr]
    assert root.findtext("os/cmdline") == "console=ttyS0 root=/dev/vda"


def test_every_domain_asks_libvirt_for_a_new_generation_id() -> None:
    """`<genid/>` without a value: libvirt makes one at each start and restore, whatever the image
    (the desktop's kernel reseeds its RNG when it changes)."""
    for kw in ({}, {"accel": "kvm", "network": "isolated"}, {"tablet": "virtio"}):
        genid = ET.fromstring(build_domain_xml(spec(**kw))).find("genid")
        assert genid is not None and not genid.text
    off = DomainSpec(**{**spec().__dict__, "genid": False})
    assert ET.fromstring(build_domain_xml(off)).find("genid") is None


def test_kvm_and_isolated_network_xml() -> None:
    root = ET.fromstring(build_domain_xml(spec(accel="kvm", network="isolated")))
    assert root.get("type") == "kvm"
    iface = root.find("devices/interface")
    assert iface is not None and iface.find("filterref").get("filter") == "clean-traffic"  # type: ignore[union-attr]
    assert iface.find("port").get("isolated") == "yes"  # type: ignore[union-attr]


def test_rewrite_saved_xml_changes_only_identity_disk_and_owner() -> None:
    original = build_domain_xml(spec())
    new = rewrite_saved_xml(original, name="gh-r1-at_2", overlay=Path("/st2/o.qcow2"),
                            console_log=Path("/st2/c.log"), ownership=Ownership("r1", "at_2", "/st2"))
    a, b = ET.fromstring(original), ET.fromstring(new)
    assert b.findtext("name") == "gh-r1-at_2" and b.findtext("uuid") != a.findtext("uuid")
    assert b.find("devices/disk/source").get("file") == "/st2/o.qcow2"  # type: ignore[union-attr]
    assert ownership_from_domain_xml(new) == Ownership("r1", "at_2", "/st2")
    assert len(b.find("metadata")) == 1  # type: ignore[arg-type]
    assert b.findtext("memory") == a.findtext("memory") and b.findtext("os/kernel") == a.findtext("os/kernel")
    assert METADATA_NS in new


def test_rewrite_saved_xml_gives_a_version_saved_without_a_display_one() -> None:
    original = ET.fromstring(build_domain_xml(spec()))
    devices = original.find("devices")
    assert devices is not None
    for g in devices.findall("graphics"):
        devices.remove(g)
    new = ET.fromstring(rewrite_saved_xml(ET.tostring(original, encoding="unicode"), name="gh-r1-at_4",
                                          overlay=Path("/st4/o.qcow2"), console_log=Path("/st4/c.log"),
                                          ownership=Ownership("r1", "at_4", "/st4")))
    assert [(g.get("type"), g.find("listen").get("type")) for g in new.iter("graphics")] == [("vnc", "none")]  # type: ignore[union-attr]
    # One with a display keeps it as it is.
    again = ET.fromstring(rewrite_saved_xml(ET.tostring(new, encoding="unicode"), name="gh-r1-at_5",
                                            overlay=Path("/st5/o.qcow2"), console_log=Path("/st5/c.log"),
                                            ownership=Ownership("r1", "at_5", "/st5")))
    assert len(again.findall("devices/graphics")) == 1


def test_rewrite_saved_xml_reads_the_kernel_from_this_runners_image_dir() -> None:
    # A version pulled from a registry was saved on a runner whose images live elsewhere.
    original = build_domain_xml(spec())
    a = ET.fromstring(original)
    new = rewrite_saved_xml(original, name="gh-r2-at_3", overlay=Path("/st3/o.qcow2"),
                            console_log=Path("/st3/c.log"), ownership=Ownership("r2", "at_3", "/st3"),
                            image_dir=Path("/elsewhere/images/linux-tiny"))
    b = ET.fromstring(new)
    kernel, initrd = a.findtext("os/kernel") or "", a.findtext("os/initrd") or ""
    assert kernel and initrd
    assert b.findtext("os/kernel") == f"/elsewhere/images/linux-tiny/{Path(kernel).name}"
    assert b.findtext("os/initrd") == f"/elsewhere/images/linux-tiny/{Path(initrd).name}"
    assert b.findtext("os/cmdline") == a.findtext("os/cmdline")


def test_ownership_of_foreign_domain_is_none() -> None:
    assert ownership_from_domain_xml("<domain><name>gh-x</name></domain>") is None
    assert ownership_from_domain_xml("not xml") is None


# -- keys and pointer ---------------------------------------------------------------------------

def test_typing_covers_printable_ascii_with_shift() -> None:
    for code in range(32, 127):
        keys = char_keys(chr(code))
        assert 1 <= len(keys) <= 2
    assert char_keys("a") == [30] and char_keys("A") == [SHIFT, 30]
    assert char_keys("!") == [SHIFT, 2] and char_keys("1") == [2]
    assert text_keys("a\r\nb") == [[30], [28], [48]]


def test_untypable_text_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(InputNotSupported, match="U\\+00E9"):
        text_keys("caf\u00e9")


def test_key_names_as_agents_write_them() -> None:
    assert combo_keys(["CTRL", "ALT", "DELETE"]) == [29, 56, 111]
    assert combo_keys(["ctrl+c"]) == [29, 46]
    for n, code in [("Return", 28), ("ENTER", 28), ("esc", 1), ("Page_Up", 104), ("ArrowLeft", 105), ("F12", 88),
                    ("super", 125), ("WIN", 125), ("meta", 125), ("Tab", 15), ("BackSpace", 14), ("space", 57)]:
        assert key_name(n) == [code], n
    assert combo_keys(["shift", "A"]) == [SHIFT, 30]
    with pytest.raises(InputNotSupported, match="unknown key"):
        key_name("HYPERDRIVE")


def test_pointer_batches_separate_press_and_release() -> None:
    size = (640, 480)
    assert abs_value(639, 640) == ABS_MAX and abs_value(0, 640) == 0 and abs_value(10_000, 640) == ABS_MAX
    click = pointer_batches(ClickEvent(x=320, y=240, button="right"), size)
    # The move rides with the press (one report: the position applies first), the release alone.
    assert [[e["type"] for e in b] for b in click] == [["abs", "abs", "btn"], ["btn"]]
    assert click[0][2]["data"] == {"down": True, "button": "right"}
    assert click[1][0]["data"] == {"down": False, "button": "right"}
    assert len(pointer_batches(DoubleClickEvent(x=1, y=1), size)) == 4
    scroll = pointer_batches(ScrollEvent(x=1, y=1, dy=-3), size)
    assert len(scroll) == 6 and scroll[0][2]["data"]["button"] == "wheel-up"
    assert pointer_batches(ScrollEvent(x=5, y=5), size) == [move_events(5, 5, size)]
    mv = pointer_batches(MoveEvent(x=320, y=0), size)[0]
    assert mv[0]["data"]["value"] == round(320 * ABS_MAX / 639) and mv[1]["data"]["value"] == 0


def test_mouse_down_and_up_are_one_press_each_and_scroll_goes_both_ways() -> None:
    size = (640, 480)
    down = pointer_batches(MouseDownEvent(x=10, y=20), size)
    up = pointer_batches(MouseUpEvent(x=30, y=40, button="middle"), size)
    assert [[e["type"] for e in b] for b in down] == [["abs", "abs", "btn"]]
    assert down[0][2]["data"] == {"down": True, "button": "left"}
    assert up == [move_events(30, 40, size) + button_event("middle", False)]
    both = pointer_batches(ScrollEvent(x=1, y=1, dy=1, dx=-2), size)
    assert [b[-1]["data"]["button"] for b in both if b[-1]["data"]["down"]] == ["wheel-down", "wheel-left",
                                                                                "wheel-left"]


# -- screen colours --------------------------------------------------------------------------------

def _png(colour: tuple[int, int, int], size: tuple[int, int] = (8, 4)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return out.getvalue()


def _ppm(colour: tuple[int, int, int], size: tuple[int, int] = (8, 4)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PPM")
    return out.getvalue()


def test_swapped_png_is_detected_against_a_ppm_dump_and_fixed() -> None:
    # A pure red screen: the PPM dump says red, a channel-swapping QEMU's PNG says blue.
    verdict = png_swap_verdict(_png((0, 0, 200), (64, 48)), _ppm((200, 0, 0), (64, 48)))
    assert verdict is True
    png, size = to_png(_png((0, 0, 200), (64, 48)), "image/png", swap_png=verdict)
    assert size == (64, 48)
    assert Image.open(io.BytesIO(png)).convert("RGB").getpixel((0, 0)) == (200, 0, 0)


def test_correct_png_is_left_alone_and_grey_screens_are_undecided() -> None:
    assert png_swap_verdict(_png((200, 10, 0), (64, 48)), _ppm((200, 10, 0), (64, 48))) is False
    png, _ = to_png(_png((200, 10, 0)), "image/png", swap_png=False)
    assert Image.open(io.BytesIO(png)).convert("RGB").getpixel((0, 0)) == (200, 10, 0)
    # Grey text on black looks the same either way: no verdict, and none needed.
    assert png_swap_verdict(_png((170, 170, 170), (64, 48)), _ppm((170, 170, 170), (64, 48))) is None
    assert png_swap_verdict(_png((0, 0, 200), (64, 48)), _ppm((200, 0, 0), (32, 48))) is None


def test_ppm_dumps_are_converted_without_swapping() -> None:
    png, size = to_png(_ppm((200, 10, 0), (3, 2)), "image/x-portable-pixmap", swap_png=True)
    assert Image.open(io.BytesIO(png)).getpixel((0, 0)) == (200, 10, 0) and size == (3, 2)


def test_qemus_ppm_is_encoded_from_its_rows_without_a_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    from providers.qemu import screen

    src = Image.new("RGB", (5, 3), (200, 10, 0))
    src.putpixel((4, 2), (1, 2, 3))
    qemu_ppm = b"P6\n5 3\n255\n" + src.tobytes()  # the layout QEMU's ppm_save writes
    pillow_open = Image.open

    def no_decode(*_a: object, **_k: object) -> Image.Image:
        raise AssertionError("QEMU's PPM went through a decode")
    monkeypatch.setattr(screen.Image, "open", no_decode)
    png, size = to_png(qemu_ppm, "image/x-portable-pixmap", swap_png=False)
    assert size == (5, 3) and pillow_open(io.BytesIO(png)).convert("RGB").tobytes() == src.tobytes()
    # Any other PPM (a comment line, 16-bit samples, a short body) is Pillow's to read.
    for other in (b"P6\n# by hand\n5 3\n255\n" + src.tobytes(), b"P6\n5 3\n65535\n" + src.tobytes() * 2,
                  qemu_ppm[:-1]):
        assert screen.ppm_pixels(other) is None


def test_unreadable_screenshot_is_a_plain_error() -> None:
    with pytest.raises(ProviderError, match="unreadable screenshot"):
        to_png(b"garbage", "image/png", swap_png=False)


# -- memory image rewrite -----------------------------------------------------------------------

def _fake_save_image(path: Path, xml: str, cookie: bytes, stream: bytes) -> None:
    data = xml.encode() + b"\0" + cookie + b"\0" + b"\0" * 777
    header = HEADER.pack(MAGIC, 2, len(data), 1, 0, len(xml) + 1, *([0] * 14))
    path.write_bytes(header + data + stream)


def test_memory_image_copy_gets_new_xml_and_same_stream(tmp_path: Path) -> None:
    src, dst = tmp_path / "m.img", tmp_path / "c.img"
    stream = bytes(range(256)) * 5000
    _fake_save_image(src, "<domain><name>a</name></domain>", b"<cookie/>", stream)
    img = read_save_image(src)
    assert img.xml == "<domain><name>a</name></domain>" and img.cookie == b"<cookie/>"
    write_machine_copy(src, dst, "<domain><name>a-much-longer-name</name></domain>")
    copy = read_save_image(dst)
    assert copy.xml == "<domain><name>a-much-longer-name</name></domain>" and copy.cookie == b"<cookie/>"
    assert dst.read_bytes()[copy.stream_offset:] == stream
    assert copy.stream_offset % 4096 == 0


def test_corrupt_memory_image_is_refused(tmp_path: Path) -> None:
    from providers.qemu.saveimage import SaveImageError

    bad = tmp_path / "bad.img"
    bad.write_bytes(b"LibvirtQemudPart" + struct.pack("<19I", 2, 10, *([0] * 17)) + b"x" * 10)
    with pytest.raises(SaveImageError, match="not a complete"):
        read_save_image(bad)


# -- errors -------------------------------------------------------------------------------------------

def test_libvirt_errors_become_plain_reasons() -> None:
    from providers.qemu.errors import install_error_handler

    install_error_handler()
    with pytest.raises(libvirt.libvirtError) as ei:
        libvirt.open("qemu+unix:///system?socket=/nonexistent/sock")
    reason = plain_reason(ei.value)
    assert "cannot reach libvirt" in reason and "libvirtd" in reason


# -- reconnect -------------------------------------------------------------------------------------

def test_connection_reconnects_once_when_libvirtd_went_away(monkeypatch: pytest.MonkeyPatch) -> None:
    from providers.qemu.connection import Connection

    class FakeConn:
        def __init__(self, n: int) -> None:
            self.n, self.alive, self.closed = n, True, False

        def isAlive(self) -> bool:
            return self.alive

        def close(self) -> int:
            self.closed = True
            return 0

    opened: list[FakeConn] = []

    def fake_open(uri: str) -> FakeConn:
        opened.append(FakeConn(len(opened)))
        return opened[-1]

    def libvirt_error(code: int, domain: int, msg: str) -> libvirt.libvirtError:
        err = libvirt.libvirtError(msg)
        err.err = (code, domain, msg, 2, None, None, None, 0, 0)
        return err

    monkeypatch.setattr(libvirt, "open", fake_open)
    c = Connection("qemu:///system")

    def call(conn: FakeConn) -> int:
        if conn.n == 0:
            conn.alive = False  # what libvirt's client knows once the daemon closed the socket
            raise libvirt_error(libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_FROM_RPC, "End of file while reading data")
        return conn.n

    assert c.call(call) == 1  # type: ignore[arg-type]
    # Dropped, not closed: other threads may still be inside a call on it.
    assert len(opened) == 2 and not opened[0].closed

    def agent_not_connected(conn: FakeConn) -> int:
        # Its text once read as a broken connection ("is not connected") and reset the shared one.
        raise libvirt_error(libvirt.VIR_ERR_AGENT_UNRESPONSIVE, libvirt.VIR_FROM_QEMU,
                            "Guest agent is not responding: QEMU guest agent is not connected")

    with pytest.raises(libvirt.libvirtError):
        c.call(agent_not_connected)  # type: ignore[arg-type]
    assert len(opened) == 2 and not opened[1].closed  # an error on a live connection does not reconnect

    opened[1].alive = False
    assert c.call(call) == 2  # type: ignore[arg-type]  # a dead connection is replaced before the call
    c.close()
    assert opened[2].closed and not opened[1].closed


def test_correct_png_passes_through_untouched() -> None:
    raw = _png((1, 2, 3), (33, 17))
    png, size = to_png(raw, "image/png", swap_png=False)
    assert png is raw and size == (33, 17)


# -- images directory ---------------------------------------------------------------------------------

def _image(root: Path, name: str, disk: bytes, sha: str | None = None) -> Path:
    import hashlib

    d = root / name
    d.mkdir()
    (d / "disk.qcow2").write_bytes(disk)
    (d / "vmlinuz").write_bytes(b"k")
    (d / "initrd.img").write_bytes(b"i")
    digest = sha or hashlib.sha256(disk).hexdigest()
    (d / "image.yaml").write_text(MANIFEST.replace("linux-tiny", name).replace("0" * 64, digest))
    return d


def test_bad_images_are_skipped_and_checksums_cached(tmp_path: Path) -> None:
    from providers.qemu.images import ImageCatalog

    good = _image(tmp_path, "good", b"disk-bytes")
    _image(tmp_path, "tampered", b"other", sha="1" * 64)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "image.yaml").write_text("name: [unclosed")
    cat = ImageCatalog(tmp_path)
    images = cat.scan_blocking()
    assert [i.info.name for i in images] == ["good"]
    assert images[0].info.checksum.startswith("sha256:") and len(images[0].info.checksum) == 71
    skipped = {p.name: why for p, why in cat.skipped().items()}
    assert "checksum mismatch" in skipped["tampered"] and "not valid YAML" in skipped["broken"]
    # Listing again does not re-hash an unchanged disk; a changed one is caught.
    calls: list[Path] = []
    import providers.qemu.images as images_mod

    real = images_mod.sha256_file
    images_mod.sha256_file = lambda p, *a: calls.append(p) or real(p)  # type: ignore[assignment, func-returns-value]
    try:
        cat.scan_blocking()
        assert calls == []  # unchanged disks (good or not) are not hashed again
        (good / "disk.qcow2").write_bytes(b"changed!!!")
        assert [i.info.name for i in cat.scan_blocking()] == []
    finally:
        images_mod.sha256_file = real


# -- when a request of input is done ---------------------------------------------------------------

class _Clock:
    """A virtual monotonic clock: sleeping advances it, nothing else does."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept = 0.0

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.now += s
        self.slept += s


class _KeysDomain:
    """The libvirt domain at its boundary: sendKey recorded with the clock's time."""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.sent: list[tuple[float, list[int], int]] = []

    def sendKey(self, _set: int, hold_ms: int, codes: list[int], _n: int, _flags: int) -> None:
        self.sent.append((self.clock.now, list(codes), hold_ms))

    def call_blocking(self, fn: Any, *, retry: bool = True) -> Any:
        return fn(None, self)


async def test_input_is_done_once_its_last_key_is_pressed_and_a_held_key_once_released(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from gh_wire.input import KeyEvent, TypeEvent
    from providers.qemu import input as qinput

    clock = _Clock()
    monkeypatch.setattr(qinput, "time", SimpleNamespace(monotonic=clock.monotonic))
    monkeypatch.setattr(qinput, "asyncio", SimpleNamespace(sleep=clock.sleep))
    dom = _KeysDomain(clock)
    driver = qinput.InputDriver(dom, screen_size=None)  # type: ignore[arg-type]
    step = (qinput.HOLD_MS + 10) / 1000  # QEMU: press, hold, release, inter-key delay

    # A chord: nothing to wait for once it is sent (its release is QEMU's to play).
    await driver.deliver([KeyEvent(keys=["shift"])])
    assert clock.slept == 0 and len(dom.sent) == 1
    # Typed text: done when its last key is pressed, which QEMU plays after the ones before it.
    clock.slept = 0
    await driver.deliver([TypeEvent(text="abc")])
    assert clock.slept == pytest.approx(3 * step)  # behind the chord above, then "a" and "b"
    # A key the agent asked to hold: done when it is released.
    clock.slept = 0
    await driver.deliver([KeyEvent(keys=["shift"], hold_ms=700)])
    assert clock.slept == pytest.approx(step + 0.71)
