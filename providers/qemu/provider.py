"""The QEMU/KVM provider on libvirt: machines as qcow2 overlays plus transient domains.

The provider starts, closes, lists images and makes machines; the rest it hands to its modules:
  machine.py   a machine and what it does (scripts, screen, input, save, destroy)
  reaper.py    this runner's machine ids, leftovers found by their ownership, destroy retries
  versions.py  start-state versions: saved, imported, exported, listed, deleted
  screen.py    screenshots, and the calibration of this hypervisor's PNG colours
  pool.py, warm.py, starts.py  the hot pool, warm snapshots, the ways a domain starts

Layout under `state_dir` (0711 down to the disks' own 0750 directories: see `fileperms`):
  machines/<domain name>/  overlay `disk.qcow2`, `owner.json`, serial `console.log`, transient restore file
  states/<start_state_id>/v<N>/  immutable `disk.qcow2`, optional `memory.img`, `meta.json`
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import libvirt
import structlog

from gh_common.backoff import Backoff
from providers.base import (
    CheckLimits,
    HostCheck,
    ImageInfo,
    Machine,
    MachineOrigin,
    MachineSource,
    Provider,
    ProviderError,
    VersionBundle,
)
from providers.errors import HypervisorUnavailable
from providers.manifest import DirectKernelBoot
from providers.qemu import fileperms, lazy, network, overlays
from providers.qemu.accel import CACHE_NAME, choose_accelerator
from providers.qemu.connection import Connection
from providers.qemu.desktop import SESSION_BOOT_TIMEOUT_S
from providers.qemu.domain import (
    METADATA_NS,
    METADATA_PREFIX,
    DomainSpec,
    Ownership,
    build_domain_xml,
    domain_name,
    ownership_xml,
)
from providers.qemu.errors import in_thread
from providers.qemu.guest_agent import EXEC_POLLING, WRAPPER, ClockMode
from providers.qemu.handle import CALL_TIMEOUT, Domain
from providers.qemu.hostcheck import KVM_DEVICE_FIX, QEMU_USER, kvm_device_access
from providers.qemu.hostchecks import HostContext, run_host_checks
from providers.qemu.images import Image, ImageCatalog
from providers.qemu.machine import MachineOptions, QemuMachine
from providers.qemu.pool import HotPool, PoolConfig
from providers.qemu.reaper import Reaper, write_owner
from providers.qemu.screen import SwapCalibration
from providers.qemu.starts import STARTS, Launch
from providers.qemu.states import StateStore, VersionFiles
from providers.qemu.versions import Versions
from providers.qemu.warm import WARM_BUILD_TIMEOUT_S, WARM_COLD_RESERVE_S, WarmSnapshots, snapshot_key, warm_fits

log = structlog.get_logger("providers.qemu")

PROBE_TIMEOUT = 10.0  # libvirt answers getVersion in milliseconds; a restarting libvirtd not at all


class QemuProvider(Provider):
    def __init__(self, images_dir: Path, state_dir: Path, runner_name: str, libvirt_uri: str = "qemu:///system",
                 *, accelerator: str | None = None, flatten_versions: bool = False,
                 write_cap_bytes: int | None = None, warm_snapshots: bool = False, lazy_restore: bool = True,
                 pool: PoolConfig | None = None, clock_mode: ClockMode = ClockMode.IN_EXEC,
                 polling: Backoff = EXEC_POLLING, genid: bool = True) -> None:
        self.images_dir = Path(images_dir)
        self.state_dir = Path(state_dir)
        self.runner_name = runner_name
        self.libvirt_uri = libvirt_uri
        self.conn = Connection(libvirt_uri)
        self.catalog = ImageCatalog(self.images_dir)
        self.states = StateStore(self.state_dir)
        self.machines_dir = self.state_dir / "machines"
        self.write_cap_bytes = write_cap_bytes  # per machine: overlay + console log (diskcap.WriteCap)
        self._force_accel = accelerator
        self.accelerator: str | None = None  # "kvm" | "tcg" once started
        self.accelerator_reason = ""
        self.hypervisor_version = 0
        self._start_lock = asyncio.Lock()
        self._network_lock = asyncio.Lock()
        self.reaper = Reaper(self.conn, runner_name, self.machines_dir)
        self.calibration = SwapCalibration()  # whether this QEMU's PNG screenshots swap red and blue
        self.genid = genid  # machines get a VM generation ID device (domain.py; off only for bench/)
        self.warm = WarmSnapshots(self.state_dir, self._build_warm, genid=genid) if warm_snapshots else None
        self.lazy_restore = lazy_restore  # warm snapshots keep their RAM in a file copies map private
        self.last_restore_steps: dict[str, float] = {}  # seconds per step of the latest restore
        self.pool: HotPool[QemuMachine] | None = None
        if pool is not None and pool.enabled:
            host = _PoolHost(self._create_paused, self.reaper, runner_name)
            self.pool = HotPool(host, pool, self._pool_sources)
        self.versions = Versions(self.states, self.catalog, flatten=flatten_versions, pool=self.pool)
        # How machines run (machine.MachineOptions): the fast ways, turned back only by bench/ to compare.
        self.clock_mode = clock_mode  # how a restored sh guest's clock is set (guest_agent.ClockMode)
        self.polling = polling  # of guest-exec-status
        self.sh_wrapper = WRAPPER  # qemu-ga's script wrapper
        self.prime_script = True  # the pool primes a script's path too
        self.resident_exec = True  # scripts through gh-execd where the image has it
        self.reseed_after_restore = True  # guest_agent.reseed_arg
        self.ppm_screendumps = True  # screen.py says why

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect to libvirt and pick the accelerator (probing KVM once). Safe to call again.

        Raises:
            ProviderError: libvirt cannot be reached, or a state directory cannot be made.
        """
        async with self._start_lock:
            if self.accelerator is not None:
                return
            for d in (self.state_dir, self.machines_dir, self.states.root):
                fileperms.traverse_only_dir(d)
            self.hypervisor_version = await in_thread(
                "connecting to libvirt", lambda: self.conn.call(lambda c: c.getVersion()), timeout=CALL_TIMEOUT)
            kernel = None
            for img in await self.catalog.scan():
                if isinstance(img.manifest.boot, DirectKernelBoot):
                    kernel = img.dir / img.manifest.boot.kernel
                    break
            decision = await choose_accelerator(self.state_dir / CACHE_NAME, kernel=kernel, force=self._force_accel)
            self.accelerator, self.accelerator_reason = decision.accelerator.value, decision.reason
            log.info("qemu provider ready", uri=self.libvirt_uri, accelerator=self.accelerator,
                     reason=self.accelerator_reason)
            if self.libvirt_uri.startswith("qemu:///system") and (access := kvm_device_access(QEMU_USER)).problem:
                log.warning(f"{access}; fix: {KVM_DEVICE_FIX}")
            if self.pool is not None:
                self.pool.start()

    async def probe(self) -> None:
        """Ask libvirt its version (reconnecting if libvirtd restarted).

        Raises:
            HypervisorUnavailable: libvirt does not answer within PROBE_TIMEOUT, or refuses the call.
        """
        try:
            await in_thread("probing libvirt", lambda: self.conn.call(lambda c: c.getVersion()), timeout=PROBE_TIMEOUT)
        except (ProviderError, TimeoutError) as e:
            raise HypervisorUnavailable(str(e) or f"libvirt at {self.libvirt_uri} did not answer in time") from None

    async def host_checks(self, limits: CheckLimits = CheckLimits()) -> list[HostCheck]:
        """libvirt, /dev/kvm as QEMU's user sees it, capability probing, the images, WinRM
        credentials, and the accelerator `start` decides or decided (providers/qemu/hostchecks.py)."""
        ctx = HostContext(self.libvirt_uri, self.images_dir, limits, accel_cache=self.state_dir / CACHE_NAME)
        return await asyncio.to_thread(run_host_checks, ctx)

    def destroy_leftovers(self) -> int:
        return self.reaper.retrying()

    async def reap(self, keep: set[str]) -> list[str]:
        """Destroy this runner's domains and machine directories whose machine id is not in `keep`
        (reaper.py says which are spared)."""
        await self.start()
        return await self.reaper.reap(keep)

    async def close(self) -> None:
        # A destroy still being retried is left to the reaper of the next start (files kept with it).
        self.reaper.close()
        if self.pool is not None:
            await self.pool.close()
        if self.warm is not None:
            await self.warm.close()
        await asyncio.to_thread(self.conn.close)

    # -- images and versions -----------------------------------------------------------------

    async def list_images(self) -> list[ImageInfo]:
        return [img.info for img in await self.catalog.scan()]

    async def held_versions(self) -> list[tuple[str, int]]:
        return await self.versions.held()

    async def delete_version(self, start_state_id: str, version: int) -> None:
        await self.versions.delete(start_state_id, version)

    async def export_version(self, start_state_id: str, version: int) -> VersionBundle:
        return await self.versions.export(start_state_id, version)

    async def import_version(self, start_state_id: str, version: int, staged: Path) -> int:
        return await self.versions.import_staged(start_state_id, version, staged)

    # -- machines ----------------------------------------------------------------------------

    async def create_machine(self, machine_id: str, source: MachineSource, *, timeout: float) -> Machine:
        if self.pool is not None and not self.reaper.in_use(machine_id):
            pooled = await self.pool.take(machine_id, source, await self._source_key(source))
            if pooled is not None:
                return pooled
        return await self._create_machine(machine_id, source, timeout=timeout, warm=self.warm is not None)

    async def _source_key(self, source: MachineSource) -> str:
        """What a pooled machine of `source` must have been made from to be handed out."""
        if source.start_state_id is not None:
            return f"{source.start_state_id}/v{source.version}"
        try:
            return snapshot_key(await self.catalog.get(source.image), genid=self.genid)
        except ProviderError:
            return ""

    async def _pool_sources(self) -> list[tuple[MachineSource, str, int]]:
        """What the hot pool may keep ready (it keeps those in demand, pool.Demand): images with a warm
        snapshot, start-state versions with memory."""
        out: list[tuple[MachineSource, str, int]] = []
        images = {img.manifest.name: img for img in await self.catalog.scan()}
        if self.warm is not None:
            for img in images.values():
                if warm_fits(img.manifest):
                    out.append((MachineSource(image=img.manifest.name), snapshot_key(img, genid=self.genid),
                                img.manifest.memory_mib))
        for ssid, ver in await asyncio.to_thread(self.states.held):
            vf = self.states.version(ssid, ver)
            try:
                meta = await asyncio.to_thread(vf.read_meta)
            except ProviderError:
                continue
            base = images.get(str(meta.get("image")))
            if base is not None and vf.memory.is_file() and meta.get("image_checksum") == base.info.checksum:
                out.append((MachineSource(image=base.manifest.name, start_state_id=ssid, version=ver),
                            f"{ssid}/v{ver}", base.manifest.memory_mib))
        return out

    async def pooled_sources(self) -> list[MachineSource]:
        if self.pool is None:
            return []
        return await self.pool.hot_sources()

    def machine_options(self) -> MachineOptions:
        """How a machine made now runs (its options are fixed when it is made)."""
        return MachineOptions(clock_mode=self.clock_mode, polling=self.polling, sh_wrapper=self.sh_wrapper,
                              resident_exec=self.resident_exec, reseed_after_restore=self.reseed_after_restore,
                              prime_script=self.prime_script, ppm_screendumps=self.ppm_screendumps)

    async def _create_machine(self, machine_id: str, source: MachineSource, *, timeout: float,
                              warm: bool, ram_file: Path | None = None, paused: bool = False) -> QemuMachine:
        deadline = time.monotonic() + timeout
        await self.start()
        image = await self.catalog.get(source.image)
        name = domain_name(self.runner_name, machine_id)
        if self.reaper.in_use(machine_id):
            raise ProviderError(f"machine {machine_id} already exists (domain {name})")
        if await Domain(self.conn, name).exists():
            # Ours by name, yet no machine of this process: a previous runner process's leftover (the
            # server re-leased an attempt that process was starting when it died). Replace it.
            log.warning("removing a leftover machine with this id", machine_id=machine_id, domain=name)
            await self.reaper.destroy_domain(name)
        version: VersionFiles | None = None
        if source.start_state_id is not None:
            if source.version is None:
                raise ProviderError("a start state source needs a version")
            version = self.states.existing(source.start_state_id, source.version)
            meta = version.read_meta()
            if meta.get("image") != image.manifest.name or meta.get("image_checksum") != image.info.checksum:
                raise ProviderError(
                    f"start state {source.start_state_id} v{source.version} was saved from image "
                    f"{meta.get('image')} {str(meta.get('image_checksum'))[:19]}, which is not the image here "
                    f"({image.manifest.name} {image.info.checksum[:19]})")
        if version is None and warm and self.warm is not None and warm_fits(image.manifest):
            # Waits for a build in progress, but leaves time for a cold boot if it is slow.
            version = await self.warm.get(image, wait=deadline - time.monotonic() - WARM_COLD_RESERVE_S)
        mdir = self.machines_dir / name
        if mdir.exists():
            await asyncio.to_thread(shutil.rmtree, mdir, True)
        fileperms.machine_dir(mdir)
        own = Ownership(runner=self.runner_name, machine_id=machine_id, machine_dir=str(mdir))
        overlay = mdir / "disk.qcow2"
        console = mdir / "console.log"
        machine = QemuMachine(machine_id, name, image, mdir, conn=self.conn, images_dir=self.images_dir,
                              options=self.machine_options(), reaper=self.reaper, versions=self.versions,
                              calibration=self.calibration)
        # NOTE: armed before the machine's first file: a full disk can fail that one too.
        async with removed_on_error(machine):
            write_owner(mdir, own, name)
            base = version.disk if version is not None else image.disk
            await overlays.create_overlay(base, overlay, timeout=max(5.0, deadline - time.monotonic()))
            if image.manifest.network == "isolated":
                await self._ensure_isolated_network()
            assert self.accelerator is not None
            xml = build_domain_xml(DomainSpec(name=name, manifest=image.manifest, image_dir=image.dir,
                                              overlay=overlay, console_log=console, ownership=own,
                                              accelerator=self.accelerator, genid=self.genid))
            launch = Launch(conn=self.conn, name=name, image=image, xml=xml, mdir=mdir, overlay=overlay,
                            console=console, ownership=own, deadline=deadline, version=version, paused=paused,
                            ram_file=ram_file, lazy_allowed=self.lazy_restore,
                            destroy_domain=self.reaper.destroy_domain)
            for way in STARTS:
                if way.fits(launch) and await way.start(launch):
                    machine.origin = way.origin
                    machine.restored = way.origin is not MachineOrigin.COLD
                    break
            if launch.steps:
                self.last_restore_steps = launch.steps
        self.reaper.track(machine_id)
        if self.write_cap_bytes is not None:
            machine.limit_writes(self.write_cap_bytes)
        log.info("machine created", machine_id=machine_id, domain=name, image=image.manifest.name,
                 start_state=source.start_state_id, version=source.version, origin=machine.origin)
        return machine

    async def _build_warm(self, image: Image, dest: Path) -> None:
        """Boot the image once and keep it, memory and disk, in `dest` (see providers/qemu/warm.py)."""
        mid = f"warm-{image.manifest.name}-{secrets.token_hex(3)}"
        self.reaper.hold(mid)
        try:
            ram = dest / lazy.RAM_FILE if self.lazy_restore else None
            if ram is not None:
                try:
                    await asyncio.to_thread(lazy.make_ram_file, ram, image.manifest.memory_mib << 20)
                except (OSError, ProviderError) as e:
                    # Not root (QEMU's user cannot be given the file): full restores only.
                    log.warning("no lazy restore for this snapshot; machines restore in full", reason=str(e))
                    ram.unlink(missing_ok=True)
                    ram = None
            # A desktop is snapshotted with its session up (wait_ready waits for it), which takes
            # longer than a console's boot.
            boot_timeout = WARM_BUILD_TIMEOUT_S if image.manifest.session is None else SESSION_BOOT_TIMEOUT_S
            machine = await self._create_machine(mid, MachineSource(image=image.manifest.name),
                                                 timeout=boot_timeout, warm=False, ram_file=ram)
            try:
                await machine.wait_ready(boot_timeout)
                await machine.save_files(dest, resume=False, devstate=dest / lazy.DEVSTATE_FILE if ram else None)
            finally:
                await machine.destroy()
        finally:
            self.reaper.release(mid)

    async def _create_paused(self, machine_id: str, source: MachineSource, timeout: float) -> QemuMachine:
        """A machine of `source` for the hot pool: restored where it can be, left paused."""
        return await self._create_machine(machine_id, source, timeout=timeout, warm=True, paused=True)

    async def _ensure_isolated_network(self) -> None:
        def go(c: libvirt.virConnect) -> None:
            try:
                net = c.networkLookupByName(network.ISOLATED_NETWORK)
            except libvirt.libvirtError:
                net = c.networkDefineXML(network.network_xml())
            if not network.is_port_isolated(net.XMLDesc(0)):
                # Defined by an older runner without port isolation: replace it (its guests lose the link).
                log.warning("replacing the isolated network: it had no port isolation")
                if net.isActive():
                    net.destroy()
                net.undefine()
                net = c.networkDefineXML(network.network_xml())
            if not net.isActive():
                net.create()
            net.setAutostart(True)

        async with self._network_lock:  # machines start concurrently: one of them replaces an old network
            await in_thread("preparing the isolated network", lambda: self.conn.call(go), timeout=CALL_TIMEOUT)
            await network.apply_host_firewall()



class _PoolHost:
    """The provider as its hot pool sees it (`pool.PoolHost`), made of what the provider gives it."""

    def __init__(self, create_paused: Callable[[str, MachineSource, float], Awaitable[QemuMachine]],
                 reaper: Reaper, runner_name: str) -> None:
        self._create_paused = create_paused
        self._reaper = reaper
        self._runner_name = runner_name

    async def make_paused(self, machine_id: str, source: MachineSource, *, timeout: float) -> QemuMachine:
        self._reaper.hold(machine_id)  # a pooled machine is the provider's own: never reaped
        try:
            return await self._create_paused(machine_id, source, timeout)
        except BaseException:
            self._reaper.release(machine_id)
            raise

    def release(self, machine_id: str) -> None:
        self._reaper.release(machine_id)

    async def prime(self, machine: QemuMachine, timeout: float) -> float:
        return await machine.prime(timeout)

    async def adopt(self, machine: QemuMachine, machine_id: str) -> None:
        """Make a pooled (paused) machine `machine_id`'s, and resume it."""
        own = Ownership(runner=self._runner_name, machine_id=machine_id, machine_dir=str(machine.dir))

        def go(_c: libvirt.virConnect, dom: libvirt.virDomain) -> None:  # one hop: this is the lease's latency
            dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, ownership_xml(own), METADATA_PREFIX,
                            METADATA_NS, libvirt.VIR_DOMAIN_AFFECT_LIVE)
            dom.resume()

        write_owner(machine.dir, own, machine.domain_name)
        await machine.domain.call("handing out a pooled machine", go, retry=False)
        self._reaper.rename(machine.machine_id, machine_id)
        machine.machine_id = machine_id
        machine.origin = MachineOrigin.POOLED
        log.info("machine taken from the hot pool", machine_id=machine_id, domain=machine.domain_name)


@contextlib.asynccontextmanager
async def removed_on_error(machine: QemuMachine) -> AsyncIterator[None]:
    """Whatever fails (or is cancelled) while a machine is being made, nothing of it stays."""
    try:
        yield
    except BaseException:
        await machine.destroy()
        raise


__all__ = ["QemuProvider"]
