"""A newc cpio writer, so the initramfs is reproducible (uid 0, mtime 0, sorted) and can hold
/dev/console without root privileges or a cpio binary."""

from __future__ import annotations

import gzip
import io
import stat
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    name: str  # path inside the archive, no leading slash
    mode: int  # full st_mode, type bits included
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)


def _pad(n: int) -> bytes:
    return b"\0" * ((4 - n % 4) % 4)


def newc(entries: list[Entry]) -> bytes:
    out = io.BytesIO()
    for ino, e in enumerate([*sorted(entries, key=lambda x: x.name), Entry("TRAILER!!!", 0)], start=1):
        name = e.name.encode() + b"\0"
        nlink = 2 if stat.S_ISDIR(e.mode) else 1
        fields = [ino, e.mode, 0, 0, nlink, 0, len(e.data), 0, 0, e.rdev[0], e.rdev[1], len(name), 0]
        header = b"070701" + b"".join(f"{f:08x}".encode() for f in fields)
        out.write(header + name + _pad(len(header) + len(name)))
        out.write(e.data + _pad(len(e.data)))
    return out.getvalue()


def gzip_newc(entries: list[Entry]) -> bytes:
    return gzip.compress(newc(entries), compresslevel=9, mtime=0)


def dir_entry(name: str) -> Entry:
    return Entry(name, stat.S_IFDIR | 0o755)


def file_entry(name: str, data: bytes, mode: int = 0o644) -> Entry:
    return Entry(name, stat.S_IFREG | mode, data)


def symlink_entry(name: str, target: str) -> Entry:
    return Entry(name, stat.S_IFLNK | 0o777, target.encode())


def chardev_entry(name: str, major: int, minor: int, mode: int = 0o600) -> Entry:
    return Entry(name, stat.S_IFCHR | mode, rdev=(major, minor))
