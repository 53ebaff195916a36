"""The images directory: manifests validated (files, checksums verified once per (path, size, mtime),
and a guest channel for every duty, see `channels`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import structlog

from providers.base import ImageInfo
from providers.errors import ProviderError
from providers.manifest import ImageManifest, ManifestError, load_manifest, sha256_file
from providers.qemu.channels import Routes, routes_for

log = structlog.get_logger("providers.qemu.images")


@dataclass(frozen=True)
class Image:
    info: ImageInfo
    manifest: ImageManifest
    dir: Path
    routes: Routes  # which guest channel does what (validated when the image is loaded)

    @property
    def disk(self) -> Path:
        return self.dir / self.manifest.disk.file


class ImageCatalog:
    def __init__(self, images_dir: Path) -> None:
        self.images_dir = images_dir
        self._verified: dict[Path, tuple[int, int, str]] = {}  # disk -> (size, mtime_ns, sha256)
        self._skipped: dict[Path, str] = {}

    def _checksum(self, disk: Path) -> str:
        st = disk.stat()
        cached = self._verified.get(disk)
        if cached and cached[0] == st.st_size and cached[1] == st.st_mtime_ns:
            return cached[2]
        digest = sha256_file(disk)
        self._verified[disk] = (st.st_size, st.st_mtime_ns, digest)
        return digest

    def _load_one(self, d: Path) -> Image:
        manifest = load_manifest(d, verify_checksum=False)
        routes = routes_for(manifest)  # before the checksum: an image no channel can run is refused cheaply
        disk = d / manifest.disk.file
        actual = self._checksum(disk)
        if actual != manifest.disk.sha256:
            raise ManifestError(
                f"{d / 'image.yaml'}: checksum mismatch for {manifest.disk.file}: manifest says "
                f"{manifest.disk.sha256[:12]}…, file is {actual[:12]}… (rebuild the image or restore the file)"
            )
        info = ImageInfo(name=manifest.name, os=manifest.os, version=manifest.version,
                         checksum=manifest.checksum, shell=manifest.shell, path=d)
        return Image(info=info, manifest=manifest, dir=d, routes=routes)

    def scan_blocking(self) -> list[Image]:
        out: list[Image] = []
        if not self.images_dir.is_dir():
            log.warning("images directory does not exist", images_dir=str(self.images_dir))
            return out
        for manifest_path in sorted(self.images_dir.glob("*/image.yaml")):
            d = manifest_path.parent
            try:
                out.append(self._load_one(d))
                self._skipped.pop(d, None)
            except (ManifestError, OSError) as e:
                reason = str(e)
                if self._skipped.get(d) != reason:  # log each distinct problem once, not on every listing
                    log.warning("skipping image", image_dir=str(d), reason=reason)
                self._skipped[d] = reason
        return out

    async def scan(self) -> list[Image]:
        return await asyncio.to_thread(self.scan_blocking)

    async def get(self, name: str) -> Image:
        d = self.images_dir / name
        if "/" in name or name in (".", "..") or not (d / "image.yaml").is_file():
            raise ProviderError(f"no image named {name!r} in {self.images_dir}")
        try:
            return await asyncio.to_thread(self._load_one, d)
        except (ManifestError, OSError) as e:
            raise ProviderError(f"image {name!r} is not usable: {e}") from None

    def skipped(self) -> dict[Path, str]:
        return dict(self._skipped)
