"""A machine's screen stream (`Machine.open_screen_stream`): QEMU's VNC server with no listener, handed over by
libvirt, on a booted machine and on one restored from a memory image saved before machines had a display."""

from __future__ import annotations

import asyncio
import os
import secrets
import xml.etree.ElementTree as ET

import pytest

from providers.base import MachineSource
from providers.qemu import QemuProvider
from providers.qemu.saveimage import read_save_image, write_machine_copy

from .conftest import Machines

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


async def rfb_banner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    try:
        async with asyncio.timeout(30):
            return await reader.readexactly(12)
    finally:
        writer.close()


async def test_a_machine_streams_its_screen_to_each_caller(machines: Machines) -> None:
    m = await machines.create()
    first = await m.open_screen_stream(30)
    second = await m.open_screen_stream(30)  # another view beside it
    assert await rfb_banner(*first) == b"RFB 003.008\n"
    assert await rfb_banner(*second) == b"RFB 003.008\n"
    assert not list(m.dir.glob("*vnc*"))  # nothing on the file system to open


async def test_a_version_saved_without_a_display_is_restored_with_one(provider: QemuProvider,
                                                                      machines: Machines) -> None:
    m = await machines.create()
    ssid = "ss_" + secrets.token_hex(4)
    saved = await m.save(ssid, 1)
    try:
        assert saved.memory_image is not None
        # As a version saved before machines had a display: its memory image's XML without <graphics>.
        mem = saved.memory_image
        root = ET.fromstring(read_save_image(mem).xml)
        devices = root.find("devices")
        assert devices is not None
        for g in devices.findall("graphics"):
            devices.remove(g)
        old = mem.with_name("old.img")
        write_machine_copy(mem, old, ET.tostring(root, encoding="unicode"))
        os.chmod(mem, 0o644)
        os.replace(old, mem)
        assert "<graphics" not in read_save_image(mem).xml
        restored = await machines.create(MachineSource(image="linux-tiny", start_state_id=ssid, version=1))
        assert restored.origin.value in ("restored", "lazy"), restored.origin
        assert await rfb_banner(*await restored.open_screen_stream(30)) == b"RFB 003.008\n"
    finally:
        await provider.delete_version(ssid, 1)
