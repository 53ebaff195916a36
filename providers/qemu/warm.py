"""Warm snapshots of images: each image is booted once per runner and kept as memory + disk, so a
machine on the image is an overlay plus a restore instead of a boot.

Layout under `state_dir/warm/<image>/<version>-<checksum[:16]>/`: `disk.qcow2` (a depth-1 overlay
over the image's base, read-only), `memory.img` (libvirt's memory image of the booted guest, its
free memory zeroed so the stream stays small), `meta.json`. The key is the image's version and its
disk's checksum: a rebuilt image gets a new snapshot on its next use, and the old ones are pruned.

Invariant: a snapshot is taken from a machine that only booted; no attempt ever ran on it, so a
machine restored from it is as fresh as a cold boot (its own overlay; the clock is set after the
restore by the machine itself). A directory is complete once it has its final name: it is written
as `<key>.partial` and renamed.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from providers.errors import ProviderError
from providers.manifest import ImageManifest
from providers.qemu import fileperms
from providers.qemu.images import Image
from providers.qemu.states import VersionFiles

log = structlog.get_logger("providers.qemu.warm")

WARM_DIR = "warm"
RETRY_AFTER_S = 300.0  # a failed build is not retried on every machine; a cold boot serves meanwhile
WARM_BUILD_TIMEOUT_S = 300.0  # boot + save of the snapshot machine, on a loaded host under TCG
WARM_COLD_RESERVE_S = 60.0  # a machine waits for a build only while a cold boot would still fit


def warm_fits(manifest: ImageManifest) -> bool:
    """Whether machines of this image may share one booted memory image. Not when the manifest opts
    out, nor when a guest's identity lives in its memory: a network (every clone would carry the
    saved MAC and lease) or WinRM (per-machine credentials are set at boot)."""
    return manifest.warm_snapshot and manifest.network == "none" and "winrm" not in manifest.guest_channels

BuildFn = Callable[[Image, Path], Awaitable[None]]  # writes disk.qcow2 + memory.img into the given dir


def snapshot_key(image: Image, *, genid: bool = True) -> str:
    """The snapshot's directory name. A lazy copy's domain is defined afresh (`build_domain_xml`) and
    must have the devices the snapshot machine had, so a snapshot made without the VM generation ID
    device (before it was added, or for bench/ side by side) is another key, not reused."""
    checksum = image.info.checksum.removeprefix("sha256:")
    return f"{image.info.version}-{checksum[:16]}" + ("-genid" if genid else "")


class WarmSnapshots:
    """One warm snapshot per image, built on demand (once, however many machines ask at once)."""

    def __init__(self, state_dir: Path, build: BuildFn, *, genid: bool = True) -> None:
        self.root = state_dir / WARM_DIR
        self._build = build
        self.genid = genid  # whether its machines have a VM generation ID device (`snapshot_key`)
        self._builds: dict[str, asyncio.Task[VersionFiles | None]] = {}
        self._failed_at: dict[str, float] = {}

    def files(self, image: Image) -> VersionFiles:
        return VersionFiles(self.root / image.manifest.name / snapshot_key(image, genid=self.genid))

    def ready(self, image: Image) -> VersionFiles | None:
        """The image's complete, current snapshot, or None."""
        vf = self.files(image)
        if not (vf.disk.is_file() and vf.memory.is_file()):
            return None
        try:
            meta = vf.read_meta()
        except ProviderError:
            return None
        if meta.get("image_checksum") != image.info.checksum or meta.get("image_version") != image.info.version:
            return None
        return vf

    async def get(self, image: Image, *, wait: float) -> VersionFiles | None:
        """The image's snapshot, building it if needed; None when the image opts out, a recent build
        failed, or the build is not done within `wait` seconds (it carries on for the next machine)."""
        if not warm_fits(image.manifest):
            return None
        vf = await asyncio.to_thread(self.ready, image)
        if vf is not None:
            return vf
        key = f"{image.manifest.name}/{snapshot_key(image, genid=self.genid)}"
        failed = self._failed_at.get(key)
        if failed is not None and time.monotonic() - failed < RETRY_AFTER_S:
            return None
        task = self._builds.get(key)
        if task is None:
            task = asyncio.create_task(self._build_once(image, key), name=f"warm-{key}")
            self._builds[key] = task
            task.add_done_callback(lambda _t: self._builds.pop(key, None))
        if wait <= 0:
            return None
        done, _ = await asyncio.wait({task}, timeout=wait)  # the build outlives an impatient caller
        return task.result() if done else None

    async def _build_once(self, image: Image, key: str) -> VersionFiles | None:
        vf = self.files(image)
        partial = vf.dir.with_name(vf.dir.name + ".partial")
        started = time.monotonic()
        try:
            await asyncio.to_thread(shutil.rmtree, partial, True)
            # QEMU reaches the disk and RAM file through these, nobody else lists them (fileperms.py).
            fileperms.traverse_only_dir(self.root)
            fileperms.traverse_only_dir(self.root / image.manifest.name)
            fileperms.machine_dir(partial)
            await self._build(image, partial)
            meta = {"image": image.manifest.name, "image_version": image.info.version,
                    "image_checksum": image.info.checksum, "created_at": time.time()}
            (partial / "meta.json").write_text(json.dumps(meta))
            await asyncio.to_thread(shutil.rmtree, vf.dir, True)
            partial.rename(vf.dir)
        except Exception as e:
            await asyncio.to_thread(shutil.rmtree, partial, True)
            self._failed_at[key] = time.monotonic()
            log.warning("warm snapshot not built; machines on this image boot cold for now",
                        image=image.manifest.name, reason=str(e)[:300], retry_after_s=RETRY_AFTER_S)
            return None
        except BaseException:
            await asyncio.shield(asyncio.to_thread(shutil.rmtree, partial, True))
            raise
        self._failed_at.pop(key, None)
        await asyncio.to_thread(self._prune, image)
        log.info("warm snapshot built", image=image.manifest.name, key=snapshot_key(image, genid=self.genid),
                 seconds=round(time.monotonic() - started, 2))
        return vf

    def _prune(self, image: Image) -> None:
        """Remove the image's snapshots for other versions or checksums (running machines keep
        their open files; a removed base disk stays readable until they stop)."""
        keep = snapshot_key(image, genid=self.genid)
        idir = self.root / image.manifest.name
        for d in idir.iterdir() if idir.is_dir() else ():
            if d.name != keep and not d.name.endswith(".partial"):
                shutil.rmtree(d, True)

    async def close(self) -> None:
        """Stop builds in progress (their half-written files are removed)."""
        tasks = list(self._builds.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
