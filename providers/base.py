"""The provider interface: everything the runner asks of a hypervisor (design.md section 4).

Deliberately small so that another provider (a cloud VM, real hardware) can stand beside QEMU:
list images, make a machine, wait for its guest channel, run a script, take a screenshot, send
input, save it as a start-state version, destroy it. Everything is async and every call that
reaches outside the process takes a timeout.

The input event models are the seed's shapes (`POST /v1/start_states/{id}/input`); they are part of
the wire contract (`gh_wire.input`), which the provider, the protocol and the API all import.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from gh_wire.input import InputEvent

# ---------------------------------------------------------------------------------------------
# Results and descriptions
# ---------------------------------------------------------------------------------------------

DEFAULT_OUTPUT_CAP = 1024 * 1024  # bytes per stream


@dataclass(frozen=True)
class ScriptResult:
    """What a script run in the guest gave back. Output is decoded leniently (never raises)."""

    exit_code: int | None  # None when the script was stopped at its timeout
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    duration_s: float = 0.0


@dataclass(frozen=True)
class ImageInfo:
    """An image a provider can start machines from, as the runner advertises it."""

    name: str
    os: str  # "linux" | "windows"
    version: str
    checksum: str  # "sha256:<hex>" of the disk
    shell: str  # "sh" | "powershell"
    path: Path | None = None


@dataclass(frozen=True)
class MachineSource:
    """Where a machine's disk comes from: an image, or a saved start-state version of one."""

    image: str
    start_state_id: str | None = None
    version: int | None = None


@dataclass(frozen=True)
class SavedVersion:
    """A start-state version written by `Machine.save`."""

    start_state_id: str
    version: int
    disk_path: Path
    size_bytes: int
    memory_image: Path | None = None
    extra: Mapping[str, str] = field(default_factory=dict)


class ProviderError(Exception):
    """A plain, operator-readable reason something failed in the provider (no libvirt noise)."""


class MachineNotReady(ProviderError):
    """The guest channel did not answer before the deadline."""


class InputNotSupported(ProviderError):
    """An input event the provider cannot deliver (for example a character outside the keymap)."""


# ---------------------------------------------------------------------------------------------
# The interface
# ---------------------------------------------------------------------------------------------


class MachineOrigin(StrEnum):
    """How a machine was made, for the attempt's report."""

    COLD = "cold"  # booted
    RESTORED = "restored"  # a memory image read in full
    LAZY = "lazy"  # a memory image mapped, pages read on first touch
    POOLED = "pooled"  # taken paused from the runner's hot pool


class Machine(abc.ABC):
    """One running machine, owned by one attempt or start-state job."""

    machine_id: str
    origin: MachineOrigin = MachineOrigin.COLD

    @abc.abstractmethod
    async def wait_ready(self, timeout: float) -> None:
        """Return once the guest channel answers; raise MachineNotReady after `timeout` seconds."""

    @abc.abstractmethod
    async def run_script(
        self,
        script: str,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float,
        output_cap: int = DEFAULT_OUTPUT_CAP,
    ) -> ScriptResult:
        """Run a script in the image's shell, elevated, as the signed-in user."""

    @abc.abstractmethod
    async def screenshot(self) -> bytes:
        """The screen as PNG bytes, at the guest's resolution, with correct colours."""

    @abc.abstractmethod
    async def send_input(self, events: Sequence[InputEvent]) -> None:
        """Deliver events in order through the hypervisor."""

    @abc.abstractmethod
    async def save(self, start_state_id: str, version: int, *, with_memory: bool = True) -> SavedVersion:
        """Keep this machine's disk (and optionally memory) as an immutable start-state version."""

    @abc.abstractmethod
    async def destroy(self) -> None:
        """Stop the machine and delete everything it owns. Idempotent; never raises for a gone machine."""


class Provider(abc.ABC):
    """A hypervisor (or anything else) that makes machines."""

    @abc.abstractmethod
    async def list_images(self) -> list[ImageInfo]:
        """Images this provider can start machines from."""

    @abc.abstractmethod
    async def create_machine(self, machine_id: str, source: MachineSource, *, timeout: float) -> Machine:
        """Make and start a fresh machine (copy-on-write over its source)."""

    @abc.abstractmethod
    async def reap(self, keep: set[str]) -> list[str]:
        """Destroy machines and overlays this runner left behind whose ids are not in `keep`;
        return what was removed."""

    @abc.abstractmethod
    async def delete_version(self, start_state_id: str, version: int) -> None:
        """Remove a saved start-state version's files."""

    async def held_versions(self) -> list[tuple[str, int]]:
        """Start-state versions stored by this provider, as (start_state_id, version)."""
        return []

    async def pooled_sources(self) -> list[MachineSource]:
        """Sources this provider keeps machines ready for (a hot pool), so leases on them start at once."""
        return []

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Machines are not destroyed."""
