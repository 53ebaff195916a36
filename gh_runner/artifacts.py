"""Start-state versions and images as OCI artifacts: what goes in the manifest, and moving them.

A start-state version is one OCI image manifest in `PREFIX/states`, tagged `<start_state_id>.v<N>`,
with `artifactType` `application/vnd.gh-runner.start-state.v1` and one layer per file:

- `disk.qcow2` (`application/vnd.gh-runner.disk.qcow2`): the version's qcow2 overlay over its base
  image, which the manifest names by annotation (`dev.gh-runner.image`, `.image.version`,
  `.image.checksum`): the layer is useless over any other image, and a runner checks it has that
  image, checksum and all, before it pulls a byte;
- `memory.img` (`application/vnd.gh-runner.memory-image`) when the version has one;
- `meta.json` (`application/vnd.gh-runner.meta+json`): the provider's own record of the version.

An image is one manifest in `PREFIX/images/<name>`, tagged with its version, with one layer per file
of its directory (`image.yaml`, the disk, kernel, initrd...) titled by file name
(`org.opencontainers.image.title`, as ORAS names files).

Every blob is pulled verified (gh_runner.registry) into a staging directory that is removed on any
failure, so a bad or half pull leaves nothing behind.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gh_runner.registry import Descriptor, Manifest, Registry, RegistryError

STATE_ARTIFACT = "application/vnd.gh-runner.start-state.v1"
IMAGE_ARTIFACT = "application/vnd.gh-runner.image.v1"
MEDIA = {
    "disk.qcow2": "application/vnd.gh-runner.disk.qcow2",
    "memory.img": "application/vnd.gh-runner.memory-image",
    "meta.json": "application/vnd.gh-runner.meta+json",
}
FILE_MEDIA = "application/octet-stream"
TITLE = "org.opencontainers.image.title"
A_IMAGE = "dev.gh-runner.image"
A_IMAGE_VERSION = "dev.gh-runner.image.version"
A_IMAGE_CHECKSUM = "dev.gh-runner.image.checksum"
A_STATE = "dev.gh-runner.start-state"
A_VERSION = "dev.gh-runner.start-state.version"
_SAFE_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class ArtifactInvalid(RegistryError):
    """A manifest that is not what we push: wrong type, a file name we would not write, missing parts."""


@dataclass(frozen=True)
class Pushed:
    ref: str  # host/repo@sha256:... (what the server records)
    tag: str
    bytes: int


def state_repo(prefix: str) -> str:
    return f"{prefix}/states"


def state_tag(start_state_id: str, version: int) -> str:
    tag = f"{start_state_id}.v{version}"
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag):
        raise ValueError(f"start state id {start_state_id!r} does not make an OCI tag")
    return tag


def image_repo(prefix: str, name: str) -> str:
    repo_name = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._")
    if not repo_name:
        raise ValueError(f"image name {name!r} does not make a repository name")
    return f"{prefix}/images/{repo_name}"


def _checked_title(d: Descriptor) -> str:
    title = d.annotations.get(TITLE, "")
    if not _SAFE_FILE.match(title):
        raise ArtifactInvalid(f"layer {d.digest[:19]} has no usable file name ({title[:80]!r})")
    return title


async def push_files(reg: Registry, repo: str, tag: str, files: Mapping[str, Path], artifact_type: str,
                     annotations: Mapping[str, str]) -> Pushed:
    layers = []
    for name, path in sorted(files.items()):
        layers.append(await reg.push_blob(repo, path, MEDIA.get(name, FILE_MEDIA), {TITLE: name}))
    digest = await reg.push_manifest(repo, tag, Manifest(artifact_type, tuple(layers), dict(annotations)))
    return Pushed(ref=f"{reg.host}/{repo}@{digest}", tag=tag, bytes=sum(d.size for d in layers))


async def pull_files(reg: Registry, repo: str, manifest: Manifest, staged: Path) -> int:
    """Every layer into `staged/<title>`, each verified; `staged` is removed when anything fails."""
    staged.mkdir(parents=True, exist_ok=False)  # noqa: ASYNC240 - one mkdir; a staged dir of another pull is kept
    try:
        total = 0
        seen: set[str] = set()
        for d in manifest.layers:
            name = _checked_title(d)
            if name in seen:
                raise ArtifactInvalid(f"two layers are both named {name!r}")
            seen.add(name)
            await reg.pull_blob(repo, d, staged / name)
            total += d.size
        return total
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise


def state_annotations(start_state_id: str, version: int, image: str, image_version: str | None,
                      image_checksum: str) -> dict[str, str]:
    out = {A_STATE: start_state_id, A_VERSION: str(version), A_IMAGE: image, A_IMAGE_CHECKSUM: image_checksum}
    if image_version:
        out[A_IMAGE_VERSION] = image_version
    return out


async def state_manifest(reg: Registry, prefix: str, start_state_id: str, version: int) -> Manifest:
    """The version's manifest, checked to be a start state of ours (NotFound when it is not pushed)."""
    _digest, m = await reg.get_manifest(state_repo(prefix), state_tag(start_state_id, version))
    if m.artifact_type != STATE_ARTIFACT:
        raise ArtifactInvalid(f"{start_state_id} v{version}: artifact type {m.artifact_type!r}, not {STATE_ARTIFACT}")
    if m.annotations.get(A_STATE) != start_state_id or m.annotations.get(A_VERSION) != str(version):
        raise ArtifactInvalid(f"{start_state_id} v{version}: the manifest's annotations name another version")
    if "disk.qcow2" not in {d.annotations.get(TITLE) for d in m.layers}:
        raise ArtifactInvalid(f"{start_state_id} v{version}: no disk.qcow2 layer")
    return m
