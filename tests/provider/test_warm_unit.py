"""WarmSnapshots without QEMU: one build however many machines ask, invalidation by version and
checksum, a failed build falls back to cold boots (and is not retried at once), manifests opt out.
The build function is the boundary: here it writes placeholder files where QEMU's would be."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from providers.base import ImageInfo
from providers.manifest import parse_manifest
from providers.qemu.channels import routes_for
from providers.qemu.images import Image
from providers.qemu.warm import WarmSnapshots, snapshot_key, warm_fits

from .test_units import MANIFEST


def image(tmp_path: Path, *, version: str = "1", checksum: str = "sha256:" + "ab" * 32, **manifest: object) -> Image:
    m = parse_manifest(MANIFEST).model_copy(update={"version": version, **manifest})
    info = ImageInfo(name=m.name, os=m.os, version=version, checksum=checksum, shell=m.shell)
    return Image(info=info, manifest=m, dir=tmp_path / "images" / m.name, routes=routes_for(m))


class Builder:
    def __init__(self) -> None:
        self.calls = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: str | None = None

    async def __call__(self, img: Image, dest: Path) -> None:
        self.calls += 1
        await self.gate.wait()
        (dest / "memory.img").write_bytes(b"mem")
        if self.fail:
            raise RuntimeError(self.fail)
        (dest / "disk.qcow2").write_bytes(b"disk")


async def test_concurrent_machines_share_one_build_and_a_restart_reuses_it(tmp_path: Path) -> None:
    b = Builder()
    b.gate.clear()
    w = WarmSnapshots(tmp_path, b)
    img = image(tmp_path)
    waiting = [asyncio.create_task(w.get(img, wait=30)) for _ in range(3)]
    await asyncio.sleep(0)
    b.gate.set()
    got = await asyncio.gather(*waiting)
    assert b.calls == 1 and got[0] is not None and got[0] == got[1] == got[2]
    assert got[0].dir.name == snapshot_key(img) and got[0].memory.is_file()
    again = WarmSnapshots(tmp_path, b)  # a restarted runner
    assert await again.get(img, wait=30) == got[0] and b.calls == 1


async def test_a_new_image_version_or_checksum_rebuilds_and_prunes_the_old(tmp_path: Path) -> None:
    b = Builder()
    w = WarmSnapshots(tmp_path, b)
    old = await w.get(image(tmp_path), wait=30)
    assert old is not None
    new = await w.get(image(tmp_path, checksum="sha256:" + "cd" * 32), wait=30)
    assert new is not None and new.dir != old.dir and b.calls == 2
    assert not old.dir.exists()  # pruned
    assert await w.get(image(tmp_path, version="2", checksum="sha256:" + "cd" * 32), wait=30) is not None
    assert b.calls == 3


async def test_a_snapshot_made_without_the_generation_id_device_is_not_reused_but_rebuilt(tmp_path: Path) -> None:
    """A lazy copy's domain is defined afresh, with `<genid/>`: it cannot take the device state of a
    snapshot machine that had no such device (one kept from before the device was added)."""
    b = Builder()
    before = await WarmSnapshots(tmp_path, b, genid=False).get(image(tmp_path), wait=30)
    assert before is not None
    now = await WarmSnapshots(tmp_path, b).get(image(tmp_path), wait=30)
    assert now is not None and now.dir != before.dir and b.calls == 2
    assert not before.dir.exists()  # pruned


async def test_a_failed_build_leaves_nothing_and_is_not_retried_at_once(tmp_path: Path) -> None:
    b = Builder()
    b.fail = "guest never answered"
    w = WarmSnapshots(tmp_path, b)
    img = image(tmp_path)
    assert await w.get(img, wait=30) is None
    assert list((tmp_path / "warm" / "linux-tiny").iterdir()) == []  # no half-written snapshot
    b.fail = None
    assert await w.get(img, wait=30) is None and b.calls == 1  # machines boot cold for a while


async def test_an_impatient_machine_boots_cold_while_the_build_goes_on(tmp_path: Path) -> None:
    b = Builder()
    b.gate.clear()
    w = WarmSnapshots(tmp_path, b)
    img = image(tmp_path)
    assert await w.get(img, wait=0.05) is None
    b.gate.set()
    assert await w.get(img, wait=30) is not None and b.calls == 1


@pytest.mark.parametrize(("update", "fits"), [
    ({}, True),
    ({"warm_snapshot": False}, False),
    ({"network": "isolated"}, False),
    ({"guest_channels": ["winrm"]}, False),
])
def test_which_images_get_a_warm_snapshot(update: dict[str, object], fits: bool) -> None:
    assert warm_fits(parse_manifest(MANIFEST).model_copy(update=update)) is fits


async def test_an_opted_out_image_never_builds(tmp_path: Path) -> None:
    b = Builder()
    w = WarmSnapshots(tmp_path, b)
    assert await w.get(image(tmp_path, warm_snapshot=False), wait=30) is None and b.calls == 0
