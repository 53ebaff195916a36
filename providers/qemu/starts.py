"""The ways a machine's domain is started, one class each (as Nova's imagebackend has one per disk kind).

The provider prepares what every way needs once (the overlay over the image or start-state disk,
the owner file, the domain XML: a `Launch`), then tries the ways in order: the first that fits and
succeeds made the machine. A way that fails in a manner the next can recover from removes what it
made and returns False (a lazy restore QEMU would not do falls back to a full one); any other
failure raises, and the provider removes the whole machine (`QemuProvider._create_machine`).

A pooled machine is not among them: it is not started but handed over already running
(`pool.HotPool.take`), before any of this is prepared.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import libvirt
import structlog

from providers.base import MachineOrigin
from providers.errors import ProviderError
from providers.qemu import lazy
from providers.qemu.connection import Connection
from providers.qemu.domain import Ownership, rewrite_saved_xml
from providers.qemu.errors import in_thread
from providers.qemu.hostcheck import SlowCall
from providers.qemu.images import Image
from providers.qemu.saveimage import SaveImageError, read_save_image, write_machine_copy
from providers.qemu.states import VersionFiles

log = structlog.get_logger("providers.qemu")


@dataclass
class Launch:
    """Everything a way of starting needs, prepared once by the provider."""

    conn: Connection
    name: str  # the domain's
    image: Image
    xml: str  # the domain as a cold boot would define it, over `overlay`
    mdir: Path
    overlay: Path
    console: Path
    ownership: Ownership
    deadline: float  # monotonic
    version: VersionFiles | None = None  # the start-state version or warm snapshot to restore, if any
    paused: bool = False  # leave it paused once started (the hot pool primes it first)
    ram_file: Path | None = None  # cold boot with RAM in this file (a warm snapshot's build)
    lazy_allowed: bool = True
    destroy_domain: Callable[[str], Awaitable[None]] | None = None
    steps: dict[str, float] = field(default_factory=dict)  # seconds per step of a restore, for bench/

    def left(self) -> float:
        return max(5.0, self.deadline - time.monotonic())


class MachineStart(abc.ABC):
    """One way of starting a machine's domain."""

    origin: MachineOrigin

    @abc.abstractmethod
    def fits(self, launch: Launch) -> bool:
        """Whether this way can start `launch` at all (a restore needs a saved memory image)."""

    @abc.abstractmethod
    async def start(self, launch: Launch) -> bool:
        """Start the domain. False: it could not, nothing of the domain is left, try the next way.

        Raises:
            ProviderError: it could not, and no other way should be tried.
        """


class LazyRestore(MachineStart):
    """Map the snapshot's RAM file private and read the device state: pages load on first touch."""

    origin = MachineOrigin.LAZY

    def fits(self, launch: Launch) -> bool:
        return launch.version is not None and launch.lazy_allowed and lazy.has_lazy(launch.version.dir)

    async def start(self, launch: Launch) -> bool:
        assert launch.version is not None and launch.destroy_domain is not None
        xml = lazy.with_ram_file(launch.xml, launch.version.dir / lazy.RAM_FILE, launch.image.manifest.memory_mib,
                                 share=False, incoming=True)
        try:
            steps = await in_thread("restoring machine lazily", lazy.restore_blocking, launch.conn, xml,
                                    launch.version.dir / lazy.DEVSTATE_FILE, launch.left() - 1, not launch.paused,
                                    timeout=launch.left())
        except ProviderError as e:
            log.warning("lazy restore failed; restoring in full", domain=launch.name, reason=str(e))
            await launch.destroy_domain(launch.name)
            return False
        log.info("machine restored lazily", domain=launch.name, **steps)
        launch.steps = steps
        return True


class FullRestore(MachineStart):
    """Read the whole memory image (a copy naming this machine's overlay and console) back in."""

    origin = MachineOrigin.RESTORED

    def fits(self, launch: Launch) -> bool:
        return launch.version is not None and launch.version.memory.is_file()

    async def start(self, launch: Launch) -> bool:
        assert launch.version is not None
        memory = launch.version.memory
        flags = libvirt.VIR_DOMAIN_SAVE_PAUSED if launch.paused else libvirt.VIR_DOMAIN_SAVE_RUNNING
        restore_file = launch.mdir / "restore.img"
        try:
            saved = await asyncio.to_thread(read_save_image, memory)
            xml = rewrite_saved_xml(lazy.standalone_ram(saved.xml), name=launch.name, overlay=launch.overlay,
                                    console_log=launch.console, ownership=launch.ownership,
                                    image_dir=launch.image.dir)
            copy_started = time.monotonic()
            await asyncio.to_thread(write_machine_copy, memory, restore_file, xml)
            copied = time.monotonic()
        except (SaveImageError, ValueError, OSError) as e:
            raise ProviderError(f"cannot use the memory image of this start state: {e}") from None
        started = time.monotonic()
        try:
            await in_thread(
                "restoring machine from memory image",
                lambda: launch.conn.call(lambda c: c.restoreFlags(str(restore_file), None, flags), retry=False),
                timeout=launch.left(), slow=SlowCall.CREATE)
            restored = time.monotonic()
            ago = await asyncio.to_thread(lazy.qemu_started_ago, launch.name)
        finally:
            restore_file.unlink(missing_ok=True)
        # Where a full restore's time goes (bench/warm_start.py prints the medians).
        launch.steps = {"copy_memory_image": round(copied - copy_started, 3), "restore": round(restored - started, 3)}
        if ago is not None:
            launch.steps["libvirt_before_exec"] = round(max(0.0, restored - started - ago), 3)
            launch.steps["qemu_start_to_running"] = round(min(ago, restored - started), 3)
        return True


class ColdBoot(MachineStart):
    """Boot from the disk; fits always, so it comes last."""

    origin = MachineOrigin.COLD

    def fits(self, launch: Launch) -> bool:
        return True

    async def start(self, launch: Launch) -> bool:
        xml = launch.xml
        if launch.ram_file is not None:  # a warm snapshot's machine: RAM in a file lazy copies map
            xml = lazy.with_ram_file(xml, launch.ram_file, launch.image.manifest.memory_mib, share=True,
                                     incoming=False)
        await in_thread("starting machine", lambda: launch.conn.call(lambda c: c.createXML(xml, 0), retry=False),
                        timeout=launch.left(), slow=SlowCall.CREATE)
        return True


# In order: the first that fits and starts made the machine.
STARTS: tuple[MachineStart, ...] = (LazyRestore(), FullRestore(), ColdBoot())
