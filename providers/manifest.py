"""The image manifest (`image.yaml`): what an image is and how to boot it.

Written by `image-builder/build`, read by the provider. `load_manifest(dir)` validates it against
the files beside it and raises `ManifestError` with a plain message naming what is wrong.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

MANIFEST_NAME = "image.yaml"
IMAGE_NAME_RE = r"^[a-z0-9][a-z0-9._-]{0,62}$"


class ManifestError(Exception):
    """A manifest that is missing, malformed, or does not match the files beside it."""


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DirectKernelBoot(_M):
    kind: Literal["direct-kernel"] = "direct-kernel"
    kernel: str
    initrd: str
    cmdline: str
    kernel_sha256: str | None = None
    initrd_sha256: str | None = None


class FirmwareBoot(_M):
    kind: Literal["bios", "uefi"]


class DiskFile(_M):
    file: str
    format: Literal["qcow2"] = "qcow2"
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    virtual_size: int | None = None


class WinRMChannel(_M):
    port: int = Field(default=5985, ge=1, le=65535)
    transport: Literal["ntlm"] = "ntlm"
    credentials: str = Field(description="name of a credentials file under the images dir, never inline")

    @field_validator("credentials")
    @classmethod
    def _under_images_dir(cls, v: str) -> str:
        # The provider reads images_dir / credentials: it must not point anywhere else.
        parts = v.replace("\\", "/").split("/")
        if not v or v.startswith(("/", "~")) or ".." in parts or "" in parts:
            raise ValueError("must be a relative path inside the images directory (not absolute, no '..')")
        return v


class Display(_M):
    """The size the guest's screen is set to at boot (screenshots and pointer coordinates use it)."""

    width: int = Field(ge=320, le=7680)
    height: int = Field(ge=200, le=4320)


class DesktopSession(_M):
    """A graphical session signed in at boot. Scripts on such an image run as `user` inside the
    session's environment (`env`: DISPLAY, DBUS_SESSION_BUS_ADDRESS, XDG_RUNTIME_DIR, ...), so a
    script changes that user's own settings and opens windows the user sees; `elevation` is how it
    acts as the administrator (`sudo`, without a password), which together is what "elevated, as
    the signed-in user" means on Windows (docs/desktop-guests.md). `ready_check`, run as the user,
    succeeds once the session is up: a booted machine is ready only then."""

    user: str = Field(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    uid: int = Field(ge=1, le=65533)
    home: str = Field(pattern=r"^/")
    env: dict[str, str] = Field(default_factory=dict)
    ready_check: str = Field(min_length=1)
    elevation: Literal["sudo"] = "sudo"


class ImageManifest(_M):
    name: str = Field(pattern=IMAGE_NAME_RE)
    os: Literal["linux", "windows"]
    version: str = Field(min_length=1, max_length=64)
    description: str = ""
    shell: Literal["sh", "bash", "powershell"]
    # gh-execd: a resident script executor on its own port, beside qemu-ga (providers/qemu/execd.py)
    guest_channels: list[Literal["qemu-ga", "winrm", "gh-execd"]] = Field(min_length=1)
    boot: DirectKernelBoot | FirmwareBoot = Field(discriminator="kind")
    machine: Literal["pc", "q35"] = "pc"
    memory_mib: int = Field(ge=64, le=262144)
    vcpus: int = Field(ge=1, le=64)
    video: Literal["vga", "virtio", "qxl", "cirrus"] = "vga"
    disk: DiskFile
    network: Literal["none", "isolated"] = "none"
    # The absolute pointer the guest has a driver for: input-send-event coordinates reach the guest
    # only through it. Debian's cloud kernel (linux-tiny) has no USB at all, so it uses virtio.
    tablet: Literal["usb", "virtio"] = "usb"
    hyperv: bool = False
    # Machines start from a booted snapshot of the image (providers/qemu/warm.py); false boots each one.
    warm_snapshot: bool = True
    winrm: WinRMChannel | None = None
    display: Display | None = None
    session: DesktopSession | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ImageManifest:
        if "winrm" in self.guest_channels and self.winrm is None:
            raise ValueError("guest channel 'winrm' needs a 'winrm' section with its credentials reference")
        if self.os == "windows" and self.shell != "powershell":
            raise ValueError("a windows image runs scripts with shell 'powershell'")
        if self.os == "linux" and self.shell not in ("sh", "bash"):
            raise ValueError("a linux image runs scripts with shell 'sh' or 'bash'")
        if self.session is not None and (self.os != "linux" or "qemu-ga" not in self.guest_channels):
            raise ValueError("a desktop session is run through qemu-ga on a linux image")
        if "gh-execd" in self.guest_channels and (self.os != "linux" or "qemu-ga" not in self.guest_channels):
            raise ValueError("gh-execd runs beside qemu-ga on a linux image (qemu-ga takes what it does not)")
        return self

    @property
    def checksum(self) -> str:
        return f"sha256:{self.disk.sha256}"


def sha256_file(path: Path, chunk: int = 4 * 1024 * 1024) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _format_validation(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "(top level)"
        parts.append(f"{where}: {err.get('msg')}")
    return "; ".join(parts)


def parse_manifest(text: str, source: str = MANIFEST_NAME) -> ImageManifest:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ManifestError(f"{source}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{source}: must be a YAML mapping")
    try:
        return ImageManifest.model_validate(data)
    except ValidationError as e:
        raise ManifestError(f"{source}: {_format_validation(e)}") from None


def load_manifest(image_dir: Path, *, verify_checksum: bool = True) -> ImageManifest:
    """Read and validate `image_dir/image.yaml` against the files beside it."""
    path = image_dir / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(f"{path}: no manifest (build the image with image-builder/build)")
    manifest = parse_manifest(path.read_text(encoding="utf-8", errors="replace"), str(path))
    if not re.fullmatch(IMAGE_NAME_RE, image_dir.name) or image_dir.name != manifest.name:
        raise ManifestError(f"{path}: name {manifest.name!r} does not match its directory {image_dir.name!r}")
    files = [manifest.disk.file]
    if isinstance(manifest.boot, DirectKernelBoot):
        files += [manifest.boot.kernel, manifest.boot.initrd]
    for rel in files:
        if "/" in rel or rel in (".", ".."):
            raise ManifestError(f"{path}: file {rel!r} must be a plain name in the image directory")
        if not (image_dir / rel).is_file():
            raise ManifestError(f"{path}: missing file {rel!r} in {image_dir}")
    if verify_checksum:
        actual = sha256_file(image_dir / manifest.disk.file)
        if actual != manifest.disk.sha256:
            raise ManifestError(
                f"{path}: checksum mismatch for {manifest.disk.file}: manifest says {manifest.disk.sha256[:12]}…, "
                f"file is {actual[:12]}… (rebuild the image or restore the file)"
            )
    return manifest


def dump_manifest(manifest: ImageManifest) -> str:
    return yaml.safe_dump(manifest.model_dump(mode="json", exclude_none=True), sort_keys=False)
