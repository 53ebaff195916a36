"""Screenshots: libvirt's screen dump (PPM or PNG, depending on QEMU) to a PNG with correct colours."""

from __future__ import annotations

import io

import libvirt
from PIL import Image

from providers.base import ProviderError
from providers.qemu.connection import Connection

# QEMU 7.1 started writing PNG screen dumps and, until 8.0, wrote them with the red and blue
# channels swapped on little-endian hosts (pixman x8r8g8b8 read as RGB bytes). PPM dumps are right.
_SWAPPED_PNG = (7_001_000, 8_000_000)


def png_channels_swapped(qemu_version: int) -> bool:
    """Whether a PNG dump from this QEMU version (libvirt's integer form, 7002000 = 7.2.0) is BGR."""
    return _SWAPPED_PNG[0] <= qemu_version < _SWAPPED_PNG[1]


def to_png(data: bytes, mime: str | None, *, swap_png: bool) -> tuple[bytes, tuple[int, int]]:
    """Convert libvirt's dump to PNG bytes, fixing the channel order when the PNG writer swapped it."""
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
    elif img.mode not in ("RGB", "RGBA"):
        img = img.convert("RGB")
    out = io.BytesIO()
    img.save(out, format="PNG", compress_level=1)
    return out.getvalue(), img.size


def screenshot_blocking(conn: Connection, domain_name: str) -> tuple[bytes, str]:
    """virDomainScreenshot through a stream; returns (raw bytes, mime)."""

    def go(c: libvirt.virConnect) -> tuple[bytes, str]:
        dom = c.lookupByName(domain_name)
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

    return conn.call(go)
