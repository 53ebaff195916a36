"""`gh-runner images push NAME` and `gh-runner images pull REF`: a whole image through the registry.

push: every regular file of the image's directory (image.yaml, the disk, kernel, initrd, ...) as one
OCI artifact (gh_runner.artifacts) in `PREFIX/images/<name>`, tagged with the image's version and
`latest`. pull: `HOST[:PORT]/REPO:TAG` (or `@sha256:...`, or just the image's name: the configured
registry's `PREFIX/images/<name>:latest`) into `--images-dir`: every blob verified while it streams,
staged in `IMAGES_DIR/.incoming/<name>/` (out of the runner's scan), the manifest's disk checksum
checked, and only then renamed into place. An image already there is left alone.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

from gh_runner import artifacts
from gh_runner.config import RunnerConfig
from gh_runner.library import open_registry
from gh_runner.registry import Manifest, Registry, RegistryError, split_ref
from providers.manifest import MANIFEST_NAME, ManifestError, load_manifest

EXIT_OK = 0
EXIT_FAILED = 1
INCOMING = ".incoming"


def find_image_dir(images_dir: Path, name: str) -> Path:
    d = images_dir / name
    if (d / MANIFEST_NAME).is_file():
        return d
    for manifest_path in sorted(images_dir.glob(f"*/{MANIFEST_NAME}")):
        try:
            if load_manifest(manifest_path.parent, verify_checksum=False).name == name:
                return manifest_path.parent
        except ManifestError:
            continue
    raise FileNotFoundError(f"no image named {name!r} in {images_dir}")


async def push_image(reg: Registry, prefix: str, image_dir: Path) -> artifacts.Pushed:
    # Never push an image that is not whole: its disk is hashed against its manifest first.
    manifest = await asyncio.to_thread(load_manifest, image_dir, verify_checksum=True)
    files = await asyncio.to_thread(_image_files, image_dir)
    annotations = {artifacts.A_IMAGE: manifest.name, artifacts.A_IMAGE_VERSION: manifest.version,
                   artifacts.A_IMAGE_CHECKSUM: manifest.checksum}
    repo = artifacts.image_repo(prefix, manifest.name)
    pushed = await artifacts.push_files(reg, repo, manifest.version, files, artifacts.IMAGE_ARTIFACT, annotations)
    await artifacts.push_files(reg, repo, "latest", files, artifacts.IMAGE_ARTIFACT, annotations)  # blobs: HEAD only
    return pushed


async def pull_image(reg: Registry, repo: str, ref: str, images_dir: Path) -> tuple[Path, int]:
    """Pull an image artifact into `images_dir`; returns its directory and the bytes pulled (0 when
    the same version was already there)."""
    _digest, m = await reg.get_manifest(repo, ref)
    if m.artifact_type != artifacts.IMAGE_ARTIFACT:
        raise artifacts.ArtifactInvalid(f"{repo}:{ref} is a {m.artifact_type!r}, not an image of ours")
    name = m.annotations.get(artifacts.A_IMAGE, "")
    if not name or "/" in name or name.startswith("."):
        raise artifacts.ArtifactInvalid(f"{repo}:{ref} does not name its image")
    dest = images_dir / name
    if (dest / MANIFEST_NAME).is_file():
        have = await asyncio.to_thread(load_manifest, dest, verify_checksum=False)
        if have.checksum == m.annotations.get(artifacts.A_IMAGE_CHECKSUM):
            return dest, 0
        raise FileExistsError(f"{dest} holds another version of {name} ({have.version}); move it away first")
    staged = images_dir / INCOMING / name
    await asyncio.to_thread(shutil.rmtree, staged, True)
    await asyncio.to_thread(staged.parent.mkdir, parents=True, exist_ok=True)
    size = await artifacts.pull_files(reg, repo, m, staged)
    try:
        await asyncio.to_thread(_check_pulled, staged, m)
        await asyncio.to_thread(staged.rename, dest)
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, staged, True)
        raise
    return dest, size


def _image_files(image_dir: Path) -> dict[str, Path]:
    return {p.name: p for p in sorted(image_dir.iterdir()) if p.is_file() and not p.name.startswith(".")}


def _check_pulled(staged: Path, m: Manifest) -> None:
    manifest = load_manifest(staged, verify_checksum=True)
    if manifest.checksum != m.annotations.get(artifacts.A_IMAGE_CHECKSUM):
        raise artifacts.ArtifactInvalid(f"image {manifest.name}: its disk is {manifest.checksum}, the artifact "
                                        f"says {m.annotations.get(artifacts.A_IMAGE_CHECKSUM)}")


def main(config: RunnerConfig, action: str, target: str, out: TextIO | None = None) -> int:
    out = sys.stdout if out is None else out
    if config.registry is None:
        print("gh-runner: no registry configured (registry.url in the config file, or GH_RUNNER_REGISTRY_URL)",
              file=sys.stderr)
        return EXIT_FAILED
    settings = config.registry

    async def go() -> int:
        if action == "push":
            async with open_registry(settings) as reg:
                pushed = await push_image(reg, settings.repository, find_image_dir(config.images_dir, target))
            print(f"pushed {pushed.bytes} bytes: {pushed.ref} (tag {pushed.tag})", file=out)
            return EXIT_OK
        if "/" in target:
            host, repo, ref = split_ref(target)
            if host != urlsplit(settings.url).netloc:
                raise RegistryError(f"{target} is not on the configured registry {settings.url}")
        else:
            repo, ref = artifacts.image_repo(settings.repository, target), "latest"
        async with open_registry(settings) as reg:
            dest, size = await pull_image(reg, repo, ref, config.images_dir)
        print(f"{dest}: " + (f"pulled {size} bytes, verified" if size else "already there"), file=out)
        return EXIT_OK

    try:
        return asyncio.run(go())
    except (RegistryError, ManifestError, OSError, ValueError) as e:
        print(f"gh-runner: images {action} {target}: {e}", file=sys.stderr)
        return EXIT_FAILED
