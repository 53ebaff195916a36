"""Screenshots: QEMU's PPM screen dump (through QMP) or libvirt's (PPM or PNG, depending on QEMU), to a
PNG with correct colours.

The PPM dump comes first: QEMU writes its raw pixels to a file in the machine's directory (~30 ms for
1280x800 under TCG) and gh_common.png encodes them (~25 ms). libvirt's own screenshot asks QEMU 7.1+
for a PNG, which QEMU's main loop encodes with libpng's defaults while the guest's vCPU waits for the
same lock: 120-450 ms on linux-desktop here (bench/agent_step.py prints both, side by side). libvirt's
stays as the fallback where the dump cannot be written (the directory not QEMU's to write, a full disk).
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import libvirt
import structlog
from PIL import Image

from gh_common import png as fastpng
from providers.errors import ProviderError
from providers.qemu.errors import in_thread
from providers.qemu.handle import CALL_TIMEOUT, Domain

log = structlog.get_logger("providers.qemu")

# Some QEMU 7.x builds write PNG screen dumps with red and blue swapped (pixman x8r8g8b8 read as RGB
# bytes); distribution builds differ (Debian's 7.2.22 is fixed), so a version number cannot tell.
# The provider calibrates instead (`SwapCalibration`): the first PNG that has colour is compared with
# a PPM dump (QEMU's PPM writer has always been right) of the same screen, and the answer is kept
# per hypervisor.
CALIBRATION_TRIES = 20  # screens too plain to judge by; past these, PNGs are taken as they come


def png_swap_verdict(png: bytes, ppm: bytes) -> bool | None:
    """True if `png` is `ppm` with red and blue swapped, False if they agree, None if undecidable
    (no pixel where red differs from blue, different sizes, or the screen changed in between)."""
    try:
        a = Image.open(io.BytesIO(png)).convert("RGB")
        b = Image.open(io.BytesIO(ppm)).convert("RGB")
    except Exception:
        return None
    if a.size != b.size:
        return None
    same = swapped = 0
    w, h = a.size
    step = max(1, int((w * h / 20000) ** 0.5))
    for y in range(0, h, step):
        for x in range(0, w, step):
            r, g, bl = b.getpixel((x, y))  # type: ignore[misc]
            if abs(r - bl) < 16:
                continue
            px = a.getpixel((x, y))
            if px == (r, g, bl):
                same += 1
            elif px == (bl, g, r):
                swapped += 1
    if same + swapped < 20:
        return None
    if same >= 0.95 * (same + swapped):
        return False
    if swapped >= 0.95 * (same + swapped):
        return True
    return None


# A text console shows two or three colours, a screen still black one; a painted desktop (backdrop,
# panel, icons) hundreds. Counted on a quarter-size sample, nearest pixel (no blended shades).
PAINTED_MIN_COLOURS = 64


def distinct_colours(png: bytes) -> int:
    """Distinct colours in a quarter-size sample of a screenshot."""
    img = Image.open(io.BytesIO(png)).convert("RGB")
    small = img.resize((max(1, img.width // 4), max(1, img.height // 4)), Image.Resampling.NEAREST)
    return len(small.getcolors(small.width * small.height) or [])


def png_size(data: bytes) -> tuple[int, int] | None:
    """Width and height from a PNG's IHDR chunk, without decoding the image."""
    if len(data) >= 24 and data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    return None


def ppm_pixels(data: bytes) -> tuple[memoryview, tuple[int, int]] | None:
    """The pixels and size of a PPM as QEMU writes it ("P6\\n<w> <h>\\n255\\n" and packed RGB rows),
    without a decode; None for any other layout (Pillow reads those)."""
    if not data.startswith(b"P6\n"):
        return None
    fields = data[:64].split(b"\n", 3)
    if len(fields) < 4 or fields[2] != b"255":
        return None
    try:
        w, h = (int(v) for v in fields[1].split(b" "))
    except ValueError:
        return None
    start = len(fields[0]) + len(fields[1]) + len(fields[2]) + 3
    if w <= 0 or h <= 0 or len(data) - start != w * h * 3:
        return None
    return memoryview(data)[start:], (w, h)


def to_png(data: bytes, mime: str | None, *, swap_png: bool) -> tuple[bytes, tuple[int, int]]:
    """Convert libvirt's dump to PNG bytes, fixing the channel order when the PNG writer swapped it."""
    size = png_size(data)
    if size is not None and not swap_png:
        return data, size  # already a correct PNG: no decode and re-encode on the hot path
    ppm = ppm_pixels(data)
    if ppm is not None:  # QEMU's own dump: its rows are already the PNG's, less the filter byte
        return fastpng.encode_rgb(*ppm), ppm[1]
    img: Image.Image
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except Exception as e:  # Pillow raises many types for corrupt input
        raise ProviderError(f"the hypervisor returned an unreadable screenshot ({mime}): {e}") from None
    fmt = (img.format or "").upper()
    if fmt == "PNG" and swap_png:
        rgb = img.convert("RGB")
        r, g, b = rgb.split()
        img = Image.merge("RGB", (b, g, r))
    return fastpng.encode(img), img.size


def _dac_owner(xml: str) -> tuple[int, int] | None:
    """uid:gid QEMU runs as, from the live domain XML's DAC label ("+64055:+64055")."""
    import re

    m = re.search(r"<seclabel[^>]*model=.dac.[^>]*>\s*<label>\+?(\d+):\+?(\d+)</label>", xml)
    return (int(m.group(1)), int(m.group(2))) if m else None


SCREENDUMP_DIR = "screendump"  # in the machine's directory, owned by the user QEMU runs as


def ppm_dump_blocking(domain: Domain, work_dir: Path) -> bytes | None:
    """A PPM screen dump through QMP into a directory QEMU may write; None when that is not possible
    (QEMU's answer is an error: no display, the disk full). Each dump has its own file, removed once
    read, so two screenshots of one machine at once (the agent's and the replay's) never share one."""
    import json
    import os
    import secrets

    import libvirt_qemu

    def go(_c: libvirt.virConnect, dom: libvirt.virDomain) -> bytes | None:
        d = work_dir / SCREENDUMP_DIR
        if not d.is_dir():
            d.mkdir(mode=0o700, exist_ok=True)
            owner = _dac_owner(dom.XMLDesc(0))
            if owner is not None:
                os.chown(d, *owner)
        target = d / f"screen-{secrets.token_hex(6)}.ppm"
        try:
            cmd = {"execute": "screendump", "arguments": {"filename": str(target), "format": "ppm"}}
            reply = json.loads(libvirt_qemu.qemuMonitorCommand(dom, json.dumps(cmd), 0))
            if "error" in reply or not target.is_file():
                return None
            return target.read_bytes()
        finally:
            target.unlink(missing_ok=True)

    return domain.call_blocking(go)


def screenshot_blocking(domain: Domain) -> tuple[bytes, str]:
    """virDomainScreenshot through a stream; returns (raw bytes, mime)."""

    def go(c: libvirt.virConnect, dom: libvirt.virDomain) -> tuple[bytes, str]:
        stream = c.newStream(0)
        try:
            mime = dom.screenshot(stream, 0, 0)
            chunks: list[bytes] = []

            def sink(_st: object, data: bytes, _opaque: object) -> int:
                chunks.append(data)
                return len(data)

            stream.recvAll(sink, None)
            stream.finish()
        except libvirt.libvirtError:
            try:
                stream.abort()
            except libvirt.libvirtError:
                pass
            raise
        return b"".join(chunks), str(mime or "")

    return domain.call_blocking(go)


class SwapCalibration:
    """Whether this hypervisor's PNG screen dumps swap red and blue: learnt once, for every machine
    of the provider, from the first screen with colour enough to tell."""

    def __init__(self) -> None:
        self.png_swapped: bool | None = None  # None: not known yet
        self._tries = 0

    async def swapped(self, domain: Domain, work_dir: Path, png: bytes) -> bool | None:
        """Whether `png`, just taken of `domain`'s screen, has red and blue swapped; None while that
        is not known. Until it is, each call compares `png` with a PPM dump of the same screen
        (written in `work_dir`, the machine's directory)."""
        if self.png_swapped is None and self._tries < CALIBRATION_TRIES:
            self._tries += 1
            try:
                ppm = await in_thread("calibrating screenshot colours", ppm_dump_blocking, domain, work_dir,
                                      timeout=CALL_TIMEOUT)
            except (ProviderError, OSError) as e:
                log.warning("cannot calibrate screenshot colours", reason=str(e))
                return None
            if ppm is not None:
                verdict = await asyncio.to_thread(png_swap_verdict, png, ppm)
                if verdict is not None:
                    self.png_swapped = verdict
                    log.info("screenshot colours calibrated", png_red_blue_swapped=verdict)
        return self.png_swapped
