"""libvirt's QEMU save-image file (memory image): read its XML, and write a per-machine copy.

Why rewrite it ourselves: libvirt restores a memory image only with a domain XML whose UUID matches
the saved one, and two running domains cannot share a UUID, so two machines warm-started from the
same version could not run at once. A per-machine copy with its own XML (new name, UUID, disk)
lifts that. Layout (libvirt src/qemu/qemu_saveimage.h, version 2): a 92-byte header (16-byte magic,
then uint32 version, data_len, was_running, format, cookieOffset, 14 unused), then `data_len` bytes
holding the NUL-terminated XML and optional NUL-terminated cookie, then QEMU's migration stream.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"LibvirtQemudSave"
HEADER = struct.Struct("<16s5I14I")
ALIGN = 4096


class SaveImageError(Exception):
    pass


@dataclass(frozen=True)
class SaveImage:
    version: int
    was_running: int
    fmt: int
    xml: str
    cookie: bytes | None
    stream_offset: int


def read_save_image(path: Path) -> SaveImage:
    with path.open("rb") as f:
        head = f.read(HEADER.size)
        if len(head) != HEADER.size:
            raise SaveImageError(f"{path}: too short to be a memory image")
        fields = HEADER.unpack(head)
        magic, version, data_len, was_running, fmt, cookie_off = fields[:6]
        if magic != MAGIC:
            raise SaveImageError(f"{path}: not a complete libvirt memory image (bad magic)")
        if version != 2:
            raise SaveImageError(f"{path}: unsupported memory image version {version}")
        if data_len > 64 * 1024 * 1024:
            raise SaveImageError(f"{path}: corrupt memory image header")
        data = f.read(data_len)
    if len(data) != data_len:
        raise SaveImageError(f"{path}: truncated memory image")
    xml_end = data.find(b"\0")
    if xml_end < 0:
        raise SaveImageError(f"{path}: corrupt memory image (unterminated XML)")
    cookie = None
    if cookie_off:
        cend = data.find(b"\0", cookie_off)
        cookie = data[cookie_off:cend if cend >= 0 else len(data)]
    return SaveImage(version=version, was_running=was_running, fmt=fmt, xml=data[:xml_end].decode(),
                     cookie=cookie, stream_offset=HEADER.size + data_len)


def write_machine_copy(src: Path, dst: Path, new_xml: str) -> None:
    """Copy a memory image with a replaced XML; the stream is copied in the kernel (reflinked where
    the filesystem can)."""
    img = read_save_image(src)
    xml_b = new_xml.encode() + b"\0"
    data = xml_b
    cookie_off = 0
    if img.cookie is not None:
        cookie_off = len(xml_b)
        data += img.cookie + b"\0"
    total = HEADER.size + len(data)
    data += b"\0" * ((-total) % ALIGN)
    header = HEADER.pack(MAGIC, img.version, len(data), img.was_running, img.fmt, cookie_off, *([0] * 14))
    tmp = dst.with_name(dst.name + ".partial")
    try:
        with src.open("rb") as fin, tmp.open("wb") as fout:
            fout.write(header)
            fout.write(data)
            fout.flush()
            size = os.fstat(fin.fileno()).st_size
            in_off = img.stream_offset
            while in_off < size:
                n = os.copy_file_range(fin.fileno(), fout.fileno(), size - in_off, in_off)
                if n == 0:
                    break
                in_off += n
        tmp.chmod(0o600)
        tmp.rename(dst)
    finally:
        tmp.unlink(missing_ok=True)
