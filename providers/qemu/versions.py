"""Start-state versions on this runner: saved from a machine, exported to and imported from the
registry, listed and deleted.

Where a version's files live is `states.py`; how its disk is written, `overlays.write_version_disk`
(a depth-1 delta over the image's base unless `flatten`). A version is immutable once its
directory has its name: a save or an import is written beside it (`v<N>.partial`, or the staged
download) and renamed into place whole, and its `meta.json` pins the image it was saved over (by
checksum), so a version whose image changed is refused. A version with memory is a source of the
hot pool: saving or importing one wakes it, and deleting one destroys its pooled machines first.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog

from providers.base import MachineSource, SavedVersion, VersionBundle
from providers.errors import ProviderError
from providers.qemu import fileperms, overlays
from providers.qemu.images import Image, ImageCatalog
from providers.qemu.pool import HotPool
from providers.qemu.states import DISK, StateStore, VersionFiles

log = structlog.get_logger("providers.qemu")


class Versions:
    def __init__(self, store: StateStore, catalog: ImageCatalog, *, flatten: bool, pool: HotPool[Any] | None) -> None:
        self.store = store
        self.catalog = catalog
        self.flatten = flatten  # standalone disks instead of deltas (bench/start_state_save.py compares)
        self.pool = pool

    async def held(self) -> list[tuple[str, int]]:
        return await asyncio.to_thread(self.store.held)

    async def save(self, start_state_id: str, version: int, *, image: Image, with_memory: bool,
                   write: Callable[[Path], Awaitable[None]]) -> SavedVersion:
        """Make version `version` of `start_state_id` from what `write(dir)` puts in `dir` (the
        machine's disk, and its memory image when `with_memory`), over `image`.

        Raises:
            ProviderError: the version exists already (versions are immutable), or writing failed
                (nothing of it is left).
        """
        vf = self.store.version(start_state_id, version)
        if vf.dir.exists():
            raise ProviderError(
                f"start state {start_state_id} version {version} already exists (versions are immutable)")
        partial = vf.dir.with_name(vf.dir.name + ".partial")
        await asyncio.to_thread(shutil.rmtree, partial, True)
        fileperms.machine_dir(partial.parent)
        fileperms.machine_dir(partial)
        started = time.monotonic()
        try:
            await write(partial)
            meta = {"image": image.manifest.name, "image_checksum": image.info.checksum,
                    "start_state_id": start_state_id, "version": version, "with_memory": with_memory,
                    "flattened": self.flatten, "created_at": time.time()}
            (partial / "meta.json").write_text(json.dumps(meta))
            partial.rename(vf.dir)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, partial, True)
            raise
        size = sum(f.stat().st_size for f in vf.dir.iterdir() if f.is_file())
        if with_memory and self.pool is not None:
            self.pool.wake()  # a version with memory is a new pool source
        log.info("start state saved", start_state_id=start_state_id, version=version, with_memory=with_memory,
                 seconds=round(time.monotonic() - started, 2), bytes=size)
        return SavedVersion(start_state_id=start_state_id, version=version, disk_path=vf.disk, size_bytes=size,
                            memory_image=vf.memory if with_memory else None)

    async def write_disk(self, overlay: Path, base: Path, dest: Path) -> None:
        """A version's disk at `dest` from a paused or stopped machine's `overlay` over `base`. Raises ProviderError."""
        await overlays.write_version_disk(overlay, base, dest, flatten=self.flatten)

    async def export(self, start_state_id: str, version: int) -> VersionBundle:
        vf = self.store.existing(start_state_id, version)
        meta = await asyncio.to_thread(vf.read_meta)
        files = {p.name: p for p in (vf.disk, vf.memory, vf.meta) if p.is_file()}
        return VersionBundle(start_state_id=start_state_id, version=version, image=str(meta.get("image")),
                             image_checksum=str(meta.get("image_checksum")), files=files)

    async def import_staged(self, start_state_id: str, version: int, staged: Path) -> int:
        """Install the version downloaded into `staged` (removed in any case); its bytes on disk.

        The disk is an overlay whose backing file names the image's disk on the runner that saved
        it: `qemu-img rebase -u` points it at this runner's copy of the same image (checked by
        checksum), a header-only change. The memory image's XML is fitted at restore as always.

        Raises:
            ProviderError: the image here is another, the disk is missing, or installing failed.
        """
        try:
            dest = self.store.version(start_state_id, version)
            meta = VersionFiles(staged).read_meta()
            image = await self.catalog.get(str(meta.get("image")))
            if meta.get("image_checksum") != image.info.checksum:
                raise ProviderError(
                    f"start state {start_state_id} v{version} was saved over image {meta.get('image')} "
                    f"{str(meta.get('image_checksum'))[:19]}; this runner has {image.info.checksum[:19]}")
            disk = staged / DISK
            if not disk.is_file():
                raise ProviderError(f"start state {start_state_id} v{version}: no {DISK} among its files")
            await overlays.run_cmd([overlays.QEMU_IMG, "rebase", "-u", "-q", "-b", str(image.disk), "-F", "qcow2",
                                    str(disk)], timeout=60, what=f"fitting {disk} to the local image")
            held = await asyncio.to_thread(_install, staged, dest.dir)
        finally:
            await asyncio.to_thread(shutil.rmtree, staged, True)
        if self.pool is not None:
            self.pool.wake()  # a version with memory is a new pool source
        return held

    async def delete(self, start_state_id: str, version: int) -> None:
        """Remove a version's files, its hot-pool machines first: a paused machine restored from it
        would otherwise hold its memory, and the deleted files' space, until the runner closes.

        Raises:
            ProviderError: the files could not be removed, or a pooled machine of it was still being
                made after the pool's bound (nothing is removed then).
        """
        if self.pool is None:
            await asyncio.to_thread(self.store.delete, start_state_id, version)
            return

        def of_version(source: MachineSource) -> bool:
            return source.start_state_id == start_state_id and source.version == version

        try:
            async with self.pool.dropping(of_version):
                await asyncio.to_thread(self.store.delete, start_state_id, version)
        except TimeoutError:
            raise ProviderError(f"start state {start_state_id} v{version} not deleted: the hot pool was still "
                                "making a machine of it; try again") from None


def _install(staged: Path, dest: Path) -> int:
    fileperms.machine_dir(dest.parent)
    fileperms.machine_dir(staged)
    for f in staged.iterdir():
        fileperms.disk_file(f, read_only=True)
    if not dest.exists():  # else pulled twice (a race with a save here): the one in place stands
        staged.rename(dest)
    return sum(f.stat().st_size for f in dest.iterdir() if f.is_file())


__all__ = ["Versions"]
