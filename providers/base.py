"""The provider interface: everything the runner asks of a hypervisor.

Deliberately small so that another provider (a cloud VM, real hardware) can stand beside QEMU:
list images, make a machine, wait for its guest channel, run a script, take a screenshot, send
input, save it as a start-state version, destroy it. Everything is async and every call that
reaches outside the process takes a timeout.

The input event models are the Evals API's (`POST /v1/start_states/{id}/input`); they are part of
the wire contract (`gh_wire.input`), which the provider, the protocol and the API all import.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from gh_wire.input import InputEvent
from providers.errors import (
    InputNotSupported,
    MachineLimitExceeded,
    MachineNotReady,
    NoAccessibilityTree,
    NoScreenStream,
    ProviderError,
)

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


@dataclass(frozen=True)
class VersionBundle:
    """A saved start-state version as files, to carry to another runner (through a registry): the
    image it was saved over (by name and checksum: it only runs over that same image) and its files
    by name (`disk.qcow2`, `memory.img` when it has one, `meta.json`)."""

    start_state_id: str
    version: int
    image: str
    image_checksum: str
    files: Mapping[str, Path]


class CheckStatus(StrEnum):
    OK = "OK"
    WARN = "WARN"  # works, but worse than it could (a TCG-only host: slow guests)
    FAIL = "FAIL"  # the runner cannot make machines until it is fixed
    SKIP = "SKIP"  # not checked: a prerequisite failed, or it does not apply here


@dataclass(frozen=True)
class CheckLimits:
    """How long host checks may wait. (The accelerator decision has its own short deadline, the same
    for everyone who decides: providers/qemu/accel.py.)"""

    fallback_s: float = 60.0  # proving the software fallback runs a guest, when the decision is it
    call_s: float = 15.0  # one call to the hypervisor


@dataclass(frozen=True)
class HostCheck:
    """One thing a provider found about its host, for `gh-runner doctor`."""

    name: str
    status: CheckStatus
    detail: str
    fix: str | None = None  # the command or step that fixes it (FAIL and WARN)

    @property
    def ok(self) -> bool:
        return self.status is not CheckStatus.FAIL


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

    @property
    def shell(self) -> str:
        """The language `run_script` runs: "sh" | "powershell" (as ImageInfo.shell)."""
        return "sh"

    @abc.abstractmethod
    async def wait_ready(self, timeout: float) -> None:
        """Return once the guest channel answers.

        Raises:
            MachineNotReady: no answer within `timeout` seconds, or the machine stopped first.
            ProviderError: the hypervisor failed.
        """

    async def guest_running(self) -> bool:
        """Whether the hypervisor runs this machine's guest (its kernel has the CPU: not stopped, paused
        by an I/O error such as a full host disk, or crashed). A machine that cannot tell says False,
        so a dead channel on it stays the runner's error.

        Raises:
            ProviderError: the hypervisor did not answer.
        """
        return False

    @abc.abstractmethod
    async def run_script(
        self,
        script: str,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float,
        output_cap: int = DEFAULT_OUTPUT_CAP,
    ) -> ScriptResult:
        """Run a script in the image's shell, elevated, as the signed-in user. A script past its
        `timeout` is stopped and returned with `timed_out` set (not raised).

        Raises:
            MachineLimitExceeded: the machine was stopped over one of the runner's limits.
            ProviderError: the guest channel or the hypervisor failed (the script may not have run).
        """

    async def run_agent_script(self, script: str, *, env: Mapping[str, str] | None = None, timeout: float,
                               output_cap: int = DEFAULT_OUTPUT_CAP) -> ScriptResult:
        """`run_script` for an agent's exec: where the machine can, the script and every process it
        starts run in a group of their own that `freeze_agent_execs` stops (providers/qemu/agent_groups.py).
        A machine that cannot group processes runs it as `run_script` does (the default).

        Raises:
            as `run_script`.
        """
        return await self.run_script(script, env=env, timeout=timeout, output_cap=output_cap)

    async def freeze_agent_execs(self, frozen: bool, timeout: float) -> bool:
        """Freeze (`frozen`) or thaw every process the agent's execs started (`run_agent_script`),
        running or left behind; returns once done. False: this machine cannot (the default), nothing
        was done.

        Raises:
            ProviderError: the guest did not freeze or thaw them within `timeout` seconds.
        """
        return False

    @abc.abstractmethod
    async def screenshot(self) -> bytes:
        """The screen as PNG bytes, at the guest's resolution, with correct colours.

        Raises:
            MachineLimitExceeded: the machine was stopped over one of the runner's limits.
            ProviderError: the hypervisor failed or the machine is gone.
        """

    @abc.abstractmethod
    async def send_input(self, events: Sequence[InputEvent]) -> None:
        """Deliver events in order through the hypervisor.

        Raises:
            InputNotSupported: an event cannot be delivered (a key outside the keymap is found before
                anything is sent; the hypervisor refusing pointer input, when it comes to it).
            MachineLimitExceeded: the machine was stopped over one of the runner's limits.
            ProviderError: the hypervisor failed or the machine is gone.
        """

    async def accessibility_tree(self, timeout: float, max_bytes: int) -> str:
        """The signed-in session's accessibility tree as XML in OSWorld's form
        (providers/qemu/atspi_tree.py), read within `timeout` and `max_bytes`.

        Raises:
            NoAccessibilityTree: the machine has no desktop session or no accessibility bus (the default).
            AccessibilityTooLarge: the tree is over `max_bytes`.
            TimeoutError: the read ran past `timeout`.
            ProviderError: the guest channel failed.
        """
        raise NoAccessibilityTree("this machine has no desktop session to read an accessibility tree from")

    async def open_screen_stream(self, timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A new connection to the machine's own display server, speaking RFB 3.8 (security type
        None) from its first byte: a live view of the screen that takes input too (docs/protocol.md,
        "Live views"). Each call is one more client; closing the writer ends it. The stream ends
        when the machine stops (destroyed, or saved with its memory).

        Raises:
            NoScreenStream: this machine has no display to stream (the default).
            ProviderError: the hypervisor failed or did not answer within `timeout`.
        """
        raise NoScreenStream("this provider's machines have no screen stream")

    @abc.abstractmethod
    async def save(self, start_state_id: str, version: int, *, with_memory: bool = True) -> SavedVersion:
        """Keep this machine's disk (and optionally memory) as an immutable start-state version;
        the machine keeps running. Nothing half-written is left on failure.

        Raises:
            ProviderError: the version exists already, or saving failed.
        """

    @abc.abstractmethod
    async def destroy(self) -> None:
        """Stop the machine and delete everything it owns. Idempotent; never raises for a gone machine.

        Raises:
            ProviderError: the hypervisor would not stop it (its files are gone; the reaper retries).
        """


class Provider(abc.ABC):
    """A hypervisor (or anything else) that makes machines.

    Closed: the runner calls only what is declared here. Optional hooks (`start`, `host_checks`,
    `held_versions`, `pooled_sources`, `close`) are no-op methods here, so a provider overrides
    what it has and the runner never looks a method up by name.
    """

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Connect and get ready (for QEMU: reach libvirt, pick the accelerator). Called once before
        anything else; safe to call again. The runner does not start without it.

        Raises:
            ProviderError: the provider cannot work on this host (the reason says what to fix).
        """

    async def probe(self) -> None:  # noqa: B027 - optional hook
        """A cheap call that proves the hypervisor answers now (the runner calls it on a timer, and
        after an attempt ends in error, and pauses while it fails).

        Raises:
            HypervisorUnavailable: the hypervisor does not answer (the reason says what it said).
        """

    async def host_checks(self, limits: CheckLimits = CheckLimits()) -> list[HostCheck]:
        """What `gh-runner doctor` prints about this provider's host, in order. Does not `start()`
        the provider and changes nothing on the host. Never raises: a failure is a check with status
        FAIL."""
        return []

    @abc.abstractmethod
    async def list_images(self) -> list[ImageInfo]:
        """Images this provider can start machines from.

        Raises:
            ProviderError: the images directory cannot be read.
        """

    @abc.abstractmethod
    async def create_machine(self, machine_id: str, source: MachineSource, *, timeout: float) -> Machine:
        """Make and start a fresh machine (copy-on-write over its source). Nothing of it is left
        behind when this raises.

        Raises:
            ProviderError: the image or start-state version is missing or does not match, or the
                hypervisor failed or did not answer within `timeout`.
        """

    @abc.abstractmethod
    async def reap(self, keep: set[str]) -> list[str]:
        """Destroy machines and overlays this runner left behind whose ids are not in `keep`;
        return what was removed.

        Raises:
            ProviderError: the hypervisor failed (what was removed before stays removed).
        """

    @abc.abstractmethod
    async def delete_version(self, start_state_id: str, version: int) -> None:
        """Remove a saved start-state version's files.

        Raises:
            ProviderError: the files could not be removed.
        """

    async def held_versions(self) -> list[tuple[str, int]]:
        """Start-state versions stored by this provider, as (start_state_id, version).

        Raises:
            ProviderError: the state directory cannot be read.
        """
        return []

    async def export_version(self, start_state_id: str, version: int) -> VersionBundle:
        """The files of a held start-state version, read-only, for a registry push.

        Raises:
            ProviderError: the version is not held here, or this provider cannot export versions.
        """
        raise ProviderError("this provider cannot export start-state versions")

    async def import_version(self, start_state_id: str, version: int, staged: Path) -> int:
        """Take a version's files (as `export_version` gave them on another runner, already verified)
        from the directory `staged` into this provider's store, fitting them to the local copy of its
        image; returns the bytes now held. `staged` is consumed (moved or removed).

        Raises:
            ProviderError: the files are incomplete, or the image they were saved over is not here
                with the same checksum.
        """
        raise ProviderError("this provider cannot import start-state versions")

    async def pooled_sources(self) -> list[MachineSource]:
        """Sources this provider keeps machines ready for (a hot pool), so leases on them start at once.

        Raises:
            ProviderError: the provider cannot tell (the runner advertises none).
        """
        return []

    def destroy_leftovers(self) -> int:
        """Machines whose destroy failed and that the provider is still retrying in the background
        (their files kept until the domain is gone): the runner shows the count in /metrics."""
        return 0

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and the provider's own machines (a pool); attempts' machines are
        not destroyed. Never raises."""


__all__ = [
    "DEFAULT_OUTPUT_CAP", "CheckLimits", "CheckStatus", "HostCheck", "ImageInfo", "InputNotSupported", "Machine",
    "MachineLimitExceeded", "MachineNotReady", "MachineOrigin", "MachineSource", "NoScreenStream", "Provider",
    "ProviderError",
    "SavedVersion", "ScriptResult",
]
