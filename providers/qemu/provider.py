"""The QEMU/KVM provider on libvirt: machines as qcow2 overlays plus transient domains.

Layout under `state_dir` (0711 down to the disks' own 0750 directories: see `fileperms`):
  machines/<domain name>/  overlay `disk.qcow2`, `owner.json`, serial `console.log`, transient restore file
  states/<start_state_id>/v<N>/  immutable `disk.qcow2`, optional `memory.img`, `meta.json`
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import libvirt
import structlog

from gh_wire.input import InputEvent, MoveEvent
from providers.base import (
    DEFAULT_OUTPUT_CAP,
    CheckLimits,
    HostCheck,
    ImageInfo,
    Machine,
    MachineNotReady,
    MachineOrigin,
    MachineSource,
    Provider,
    ProviderError,
    SavedVersion,
    ScriptResult,
    VersionBundle,
)
from providers.errors import HypervisorUnavailable, MachineLimitExceeded
from providers.manifest import DirectKernelBoot
from providers.qemu import fileperms, lazy, network, overlays
from providers.qemu.accel import CACHE_NAME, choose_accelerator
from providers.qemu.channels import Channel, Duty
from providers.qemu.connection import Connection
from providers.qemu.credentials import Credentials, give_machine_password
from providers.qemu.desktop import SESSION_BOOT_TIMEOUT_S, run_as_for, wait_session
from providers.qemu.diskcap import WriteCap
from providers.qemu.domain import (
    METADATA_NS,
    METADATA_PREFIX,
    DomainSpec,
    Ownership,
    build_domain_xml,
    domain_name,
    domain_prefix,
    ownership_from_domain_xml,
    ownership_xml,
)
from providers.qemu.errors import in_thread, plain_reason
from providers.qemu.execd import MAX_KEEP, ExecChannel, Unavailable
from providers.qemu.guest_agent import RESEED_BYTES, ClockMode, ClockNotSet, GuestAgent, Polling, clock_ms, script_env
from providers.qemu.handle import CALL_TIMEOUT, Domain
from providers.qemu.hostcheck import KVM_DEVICE_FIX, QEMU_USER, kvm_device_access
from providers.qemu.hostchecks import HostContext, run_host_checks
from providers.qemu.images import Image, ImageCatalog
from providers.qemu.input import InputDriver
from providers.qemu.pool import HotPool, PoolConfig
from providers.qemu.screen import (
    PAINTED_MIN_COLOURS,
    distinct_colours,
    png_swap_verdict,
    ppm_dump_blocking,
    screenshot_blocking,
    to_png,
)
from providers.qemu.starts import STARTS, Launch
from providers.qemu.states import StateStore, VersionFiles
from providers.qemu.warm import WARM_BUILD_TIMEOUT_S, WARM_COLD_RESERVE_S, WarmSnapshots, snapshot_key, warm_fits
from providers.qemu.winrm import WinRMChannel, credentials_path, load_credentials

log = structlog.get_logger("providers.qemu")

OWNER_FILE = "owner.json"
# Only into tmpfs (a desktop's /tmp is on its disk: writing there would grow the overlay), and
# leaving GH_KEEP_MIB available: a desktop's processes keep allocating while it runs, and an OOM
# kill of its X server would save a broken session.
ZERO_FREE_MEMORY = r"""
sync; echo 3 > /proc/sys/vm/drop_caches
keep=${GH_KEEP_MIB:-48}
for dir in /dev/shm /tmp; do
  grep -q " $dir tmpfs " /proc/mounts || continue
  avail=$(awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo)
  n=$(( (avail - keep) / 2 ))
  [ "$n" -gt 0 ] && dd if=/dev/zero of=$dir/.gh-zero bs=1M count="$n" 2>/dev/null
done
rm -f /dev/shm/.gh-zero /tmp/.gh-zero
sync; echo 3 > /proc/sys/vm/drop_caches
exit 0
"""
SCREEN_SIZE_TTL_S = 5.0
PAINT_POLL_S = 1.0  # a screenshot a second while a booted desktop paints its first frame
DESTROY_RETRY_FIRST_S = 1.0  # a failed destroy is retried after this, doubling up to the cap
DESTROY_RETRY_CAP_S = 30.0
PROBE_TIMEOUT = 10.0  # libvirt answers getVersion in milliseconds; a restarting libvirtd not at all


class QemuProvider(Provider):
    def __init__(self, images_dir: Path, state_dir: Path, runner_name: str, libvirt_uri: str = "qemu:///system",
                 *, accelerator: str | None = None, flatten_versions: bool = False,
                 write_cap_bytes: int | None = None, warm_snapshots: bool = False, lazy_restore: bool = True,
                 pool: PoolConfig | None = None, clock_mode: ClockMode = ClockMode.IN_EXEC,
                 polling: Polling = Polling(), genid: bool = True) -> None:
        self.images_dir = Path(images_dir)
        self.state_dir = Path(state_dir)
        self.runner_name = runner_name
        self.libvirt_uri = libvirt_uri
        self.conn = Connection(libvirt_uri)
        self.catalog = ImageCatalog(self.images_dir)
        self.states = StateStore(self.state_dir)
        self.machines_dir = self.state_dir / "machines"
        self.flatten_versions = flatten_versions
        self.write_cap_bytes = write_cap_bytes  # per machine: overlay + console log (diskcap.WriteCap)
        self._force_accel = accelerator
        self.accelerator: str | None = None  # "kvm" | "tcg" once started
        self.accelerator_reason = ""
        self.hypervisor_version = 0
        self._start_lock = asyncio.Lock()
        self._network_lock = asyncio.Lock()
        self._machines: dict[str, QemuMachine] = {}
        # Machines the provider runs for itself (warm-snapshot builds): never reaped while running.
        self._private: set[str] = set()
        # Machines whose destroy failed (libvirtd restarting): retried here until the domain is gone,
        # and only then are their files removed (QEMU may still run on them).
        self._destroy_retries: dict[str, asyncio.Task[None]] = {}
        self.genid = genid  # machines get a VM generation ID device (domain.py; off only for bench/)
        self.warm = WarmSnapshots(self.state_dir, self._build_warm, genid=genid) if warm_snapshots else None
        self.lazy_restore = lazy_restore  # warm snapshots keep their RAM in a file copies map private
        self.last_restore_steps: dict[str, float] = {}  # seconds per step of the latest restore
        self.pool: HotPool[QemuMachine] | None = (
            HotPool(_PoolHost(self), pool, self._pool_sources) if pool is not None and pool.enabled else None)
        self.png_swapped: bool | None = None  # learnt from the first colourful screenshot
        self.ppm_screendumps = True  # screen.py says why; bench/agent_step.py turns it off for its side by side
        self.clock_mode = clock_mode  # how a restored sh guest's clock is set (guest_agent.ClockMode)
        self.polling = polling  # of guest-exec-status (the old values stay for bench/ side by side)
        self.prime_script = True  # the pool primes a script's path too (off only in bench/legacy_exec.py)
        self.resident_exec = True  # scripts through gh-execd where the image has it (off only in bench/)
        self.reseed_after_restore = True  # guest_agent.reseed_arg (off only in bench/warm_start.py)
        self._calibrations = 0

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
        return len(self._destroy_retries)

    def _destroy_later(self, machine: QemuMachine, reason: str) -> None:
        """Retry a failed destroy in the background, with capped backoff, until the domain is gone; then
        remove the machine's files. The reaper leaves the machine to it meanwhile."""
        if machine.machine_id in self._destroy_retries:
            return
        log.warning("destroying machine failed; retrying in the background, its files are kept until the "
                    "domain is gone", machine_id=machine.machine_id, reason=reason)
        task = asyncio.create_task(self._retry_destroy(machine), name=f"destroy-retry-{machine.machine_id}")
        self._destroy_retries[machine.machine_id] = task
        mid = machine.machine_id

        def forget(_t: asyncio.Task[None]) -> None:
            self._destroy_retries.pop(mid, None)

        task.add_done_callback(forget)

    async def _retry_destroy(self, machine: QemuMachine) -> None:
        delay, tries = DESTROY_RETRY_FIRST_S, 1
        while True:
            await asyncio.sleep(delay)
            tries += 1
            try:
                await machine.domain.destroy()
            except ProviderError as e:
                delay = min(DESTROY_RETRY_CAP_S, delay * 2)
                log.info("destroy retry failed", machine_id=machine.machine_id, tries=tries, next_in=delay,
                         reason=str(e))
                continue
            await asyncio.to_thread(shutil.rmtree, machine.dir, True)
            machine._destroyed = True
            self._machines.pop(machine.machine_id, None)
            log.warning("machine destroyed after retries; its files are removed", machine_id=machine.machine_id,
                        tries=tries)
            return

    async def close(self) -> None:
        # A destroy still being retried is left to the reaper of the next start (files kept with it).
        for task in list(self._destroy_retries.values()):
            task.cancel()
        if self.pool is not None:
            await self.pool.close()
        if self.warm is not None:
            await self.warm.close()
        await asyncio.to_thread(self.conn.close)

    # -- images and versions -----------------------------------------------------------------

    async def list_images(self) -> list[ImageInfo]:
        return [img.info for img in await self.catalog.scan()]

    async def held_versions(self) -> list[tuple[str, int]]:
        return await asyncio.to_thread(self.states.held)

    async def delete_version(self, start_state_id: str, version: int) -> None:
        """Remove a version's files, its hot-pool machines first: a paused machine restored from it
        would otherwise hold its memory, and the deleted files' space, until the runner closes.

        Raises:
            ProviderError: the files could not be removed, or a pooled machine of it was still being
                made after the pool's bound (nothing is removed then).
        """
        if self.pool is None:
            await asyncio.to_thread(self.states.delete, start_state_id, version)
            return

        def of_version(source: MachineSource) -> bool:
            return source.start_state_id == start_state_id and source.version == version

        try:
            async with self.pool.dropping(of_version):
                await asyncio.to_thread(self.states.delete, start_state_id, version)
        except TimeoutError:
            raise ProviderError(f"start state {start_state_id} v{version} not deleted: the hot pool was still "
                                "making a machine of it; try again") from None

    async def export_version(self, start_state_id: str, version: int) -> VersionBundle:
        vf = self.states.existing(start_state_id, version)
        meta = await asyncio.to_thread(vf.read_meta)
        files = {p.name: p for p in (vf.disk, vf.memory, vf.meta) if p.is_file()}
        return VersionBundle(start_state_id=start_state_id, version=version, image=str(meta.get("image")),
                             image_checksum=str(meta.get("image_checksum")), files=files)

    async def import_version(self, start_state_id: str, version: int, staged: Path) -> int:
        """The disk is an overlay whose backing file names the image's disk on the runner that saved
        it: `qemu-img rebase -u` points it at this runner's copy of the same image (checked by
        checksum), a header-only change. The memory image's XML is fitted at restore as always."""
        try:
            dest = self.states.version(start_state_id, version)
            meta = VersionFiles(staged).read_meta()
            image = await self.catalog.get(str(meta.get("image")))
            if meta.get("image_checksum") != image.info.checksum:
                raise ProviderError(
                    f"start state {start_state_id} v{version} was saved over image {meta.get('image')} "
                    f"{str(meta.get('image_checksum'))[:19]}; this runner has {image.info.checksum[:19]}")
            disk = staged / "disk.qcow2"
            if not disk.is_file():
                raise ProviderError(f"start state {start_state_id} v{version}: no disk.qcow2 among its files")
            await overlays.run_cmd([overlays.QEMU_IMG, "rebase", "-u", "-q", "-b", str(image.disk), "-F", "qcow2",
                                    str(disk)], timeout=60, what=f"fitting {disk} to the local image")
            held = await asyncio.to_thread(_install_version, staged, dest.dir)
        finally:
            await asyncio.to_thread(shutil.rmtree, staged, True)
        if self.pool is not None:
            self.pool.wake()  # a version with memory is a new pool source
        return held

    # -- machines ----------------------------------------------------------------------------

    async def create_machine(self, machine_id: str, source: MachineSource, *, timeout: float) -> Machine:
        if self.pool is not None and machine_id not in self._machines:
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

    async def _create_machine(self, machine_id: str, source: MachineSource, *, timeout: float,
                              warm: bool, ram_file: Path | None = None, paused: bool = False) -> QemuMachine:
        deadline = time.monotonic() + timeout
        await self.start()
        image = await self.catalog.get(source.image)
        name = domain_name(self.runner_name, machine_id)
        if machine_id in self._machines:
            raise ProviderError(f"machine {machine_id} already exists (domain {name})")
        if await Domain(self.conn, name).exists():
            # Ours by name, yet no machine of this process: a previous runner process's leftover (the
            # server re-leased an attempt that process was starting when it died). Replace it.
            log.warning("removing a leftover machine with this id", machine_id=machine_id, domain=name)
            await self._destroy_domain(name)
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
        machine = QemuMachine(self, machine_id, name, image, mdir)
        # NOTE: armed before the machine's first file: a full disk can fail that one too (issue 27).
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
                            ram_file=ram_file, lazy_allowed=self.lazy_restore, destroy_domain=self._destroy_domain)
            for way in STARTS:
                if way.fits(launch) and await way.start(launch):
                    machine.origin = way.origin
                    machine.restored = way.origin is not MachineOrigin.COLD
                    break
            if launch.steps:
                self.last_restore_steps = launch.steps
        self._machines[machine_id] = machine
        if self.write_cap_bytes is not None:
            machine.write_cap = WriteCap(mdir, self.write_cap_bytes, machine._stop_over_limit)
            machine.write_cap.start()
        log.info("machine created", machine_id=machine_id, domain=name, image=image.manifest.name,
                 start_state=source.start_state_id, version=source.version, origin=machine.origin)
        return machine

    async def _build_warm(self, image: Image, dest: Path) -> None:
        """Boot the image once and keep it, memory and disk, in `dest` (see providers/qemu/warm.py)."""
        mid = f"warm-{image.manifest.name}-{secrets.token_hex(3)}"
        self._private.add(mid)
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
            self._private.discard(mid)

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

    async def reap(self, keep: set[str]) -> list[str]:
        """Destroy this runner's domains and machine directories whose machine id is not in `keep`."""
        await self.start()
        prefix = domain_prefix(self.runner_name)

        def list_ours(c: libvirt.virConnect) -> list[tuple[str, Ownership | None, bool]]:
            out = []
            for dom in c.listAllDomains(0):
                n = dom.name()
                if not n.startswith(prefix):
                    continue
                try:
                    own = ownership_from_domain_xml(dom.XMLDesc(0))
                except libvirt.libvirtError:
                    continue
                out.append((n, own, bool(dom.isPersistent())))
            return out

        removed: list[str] = []
        found = await in_thread("listing machines", lambda: self.conn.call(list_ours), timeout=CALL_TIMEOUT)
        for name, own, persistent in found:
            if (own is None or own.runner != self.runner_name or own.machine_id in keep
                    or own.machine_id in self._private or own.machine_id in self._destroy_retries):
                continue
            try:
                await self._destroy_domain(name, persistent)
            except ProviderError as e:
                # Its files stay: QEMU may still run on them. The next reap tries again.
                log.warning("reaping a leftover machine failed; its files are kept", machine_id=own.machine_id,
                            reason=str(e))
                continue
            mdir = self.machines_dir / name
            await asyncio.to_thread(shutil.rmtree, mdir, True)
            self._machines.pop(own.machine_id, None)
            removed.append(own.machine_id)
            log.warning("reaped leftover machine", machine_id=own.machine_id, domain=name)
        live = {n for n, _, _ in found}
        if self.machines_dir.is_dir():
            for mdir in sorted(self.machines_dir.iterdir()):
                if not mdir.name.startswith(prefix) or mdir.name in live:
                    continue
                try:
                    info = json.loads((mdir / OWNER_FILE).read_text())
                    mid = str(info.get("machine_id"))
                    if info.get("runner") != self.runner_name:
                        continue
                except (OSError, ValueError):
                    mid = mdir.name
                if mid in keep or mid in self._private or mid in self._destroy_retries:
                    continue
                await asyncio.to_thread(shutil.rmtree, mdir, True)
                if mid not in removed:
                    removed.append(mid)
                log.warning("reaped leftover machine files", machine_id=mid, dir=str(mdir))
        return removed

    async def _png_swapped(self, machine: QemuMachine, png: bytes) -> bool | None:
        if self.png_swapped is None and self._calibrations < 20:
            self._calibrations += 1
            try:
                ppm = await in_thread("calibrating screenshot colours", ppm_dump_blocking, machine.domain,
                                      machine.dir, timeout=CALL_TIMEOUT)
            except (ProviderError, OSError) as e:
                log.warning("cannot calibrate screenshot colours", reason=str(e))
                return None
            if ppm is not None:
                verdict = await asyncio.to_thread(png_swap_verdict, png, ppm)
                if verdict is not None:
                    self.png_swapped = verdict
                    log.info("screenshot colours calibrated", png_red_blue_swapped=verdict)
        return self.png_swapped

    async def _destroy_domain(self, name: str, persistent: bool = False) -> None:
        await Domain(self.conn, name).destroy(persistent)


def _install_version(staged: Path, dest: Path) -> int:
    fileperms.machine_dir(dest.parent)
    fileperms.machine_dir(staged)
    for f in staged.iterdir():
        fileperms.disk_file(f, read_only=True)
    if not dest.exists():  # else pulled twice (a race with a save here): the one in place stands
        staged.rename(dest)
    return sum(f.stat().st_size for f in dest.iterdir() if f.is_file())


class _PoolHost:
    """The provider as its hot pool sees it (`pool.PoolHost`): the pool reaches none of its privates."""

    def __init__(self, provider: QemuProvider) -> None:
        self._p = provider

    async def make_paused(self, machine_id: str, source: MachineSource, *, timeout: float) -> QemuMachine:
        self._p._private.add(machine_id)  # a pooled machine is the provider's own: never reaped
        try:
            return await self._p._create_machine(machine_id, source, timeout=timeout, warm=True, paused=True)
        except BaseException:
            self._p._private.discard(machine_id)
            raise

    def release(self, machine_id: str) -> None:
        self._p._private.discard(machine_id)

    async def prime(self, machine: QemuMachine, timeout: float) -> float:
        """Run a paused, just-restored machine until its guest agent answers, then pause it again
        (see providers/qemu/pool.py); returns the seconds the answer took."""
        await machine.domain.resume("resuming a machine for the hot pool")
        started = time.monotonic()
        await machine.agent.wait_ready(timeout, alive=machine._require_running)
        answered = time.monotonic() - started
        # A script's path too (qemu-ga's fork, busybox sh, setsid, head): the first after a restore
        # took ~0.5 s under TCG, later ones a fraction. Its temp files are removed before the pause.
        # It reseeds the guest's RNG with its own host bytes (guest_agent.reseed_arg), so no two
        # pooled machines share their memory image's RNG state, and the lease's first script need
        # not start gh-reseed again: a pooled machine serves one attempt.
        # Through gh-execd, where the image has it: the connection to its port is made here and
        # stays open through the pause, and the clock is set here too, so that the kernel paths
        # the lease's first script takes (clock_settime, the RTC read) are already translated
        # under TCG (~10 ms on that script otherwise).
        if self._p.prime_script:
            reseed = self._p.reseed_after_restore
            _, via = await machine._exec("true", env=None, timeout=timeout, output_cap=0, set_clock=True,
                                         reseed=reseed)
            machine.rng_reseeded = reseed
            if via is Channel.QEMU_GA:  # the wrapper removes its files in the background: gone before the pause
                await machine.agent.run_sh("rm -f /tmp/gh-exec-*", env=None, timeout=timeout, output_cap=0)
        await machine.domain.suspend("pausing a machine for the hot pool")
        return answered

    async def adopt(self, machine: QemuMachine, machine_id: str) -> None:
        """Make a pooled (paused) machine `machine_id`'s, and resume it."""
        p = self._p
        own = Ownership(runner=p.runner_name, machine_id=machine_id, machine_dir=str(machine.dir))

        def go(_c: libvirt.virConnect, dom: libvirt.virDomain) -> None:  # one hop: this is the lease's latency
            dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, ownership_xml(own), METADATA_PREFIX,
                            METADATA_NS, libvirt.VIR_DOMAIN_AFFECT_LIVE)
            dom.resume()

        write_owner(machine.dir, own, machine.domain_name)
        await machine.domain.call("handing out a pooled machine", go, retry=False)
        old = machine.machine_id
        p._machines.pop(old, None)
        machine.machine_id = machine_id
        p._machines[machine_id] = machine
        p._private.discard(old)
        machine.origin = MachineOrigin.POOLED
        log.info("machine taken from the hot pool", machine_id=machine_id, domain=machine.domain_name)


def write_owner(mdir: Path, own: Ownership, domain: str) -> None:
    """The machine dir's owner.json (the reaper reads it when the domain is gone). Raises ProviderError."""
    try:
        (mdir / OWNER_FILE).write_text(json.dumps({"runner": own.runner, "machine_id": own.machine_id,
                                                   "domain": domain}))
    except OSError as e:
        full = " (the host disk is full)" if e.errno == errno.ENOSPC else ""
        raise ProviderError(f"cannot write the machine's files in {mdir}: {e.strerror or e}{full}") from e


@contextlib.asynccontextmanager
async def removed_on_error(machine: QemuMachine) -> AsyncIterator[None]:
    """Whatever fails (or is cancelled) while a machine is being made, nothing of it stays."""
    try:
        yield
    except BaseException:
        await machine.destroy()
        raise


class QemuMachine(Machine):
    def __init__(self, provider: QemuProvider, machine_id: str, name: str, image: Image, mdir: Path) -> None:
        self.provider = provider
        self.machine_id = machine_id
        self.domain_name = name
        self.image = image
        self.dir = mdir
        self.overlay = mdir / "disk.qcow2"
        self.restored = False
        self.origin = MachineOrigin.COLD
        self._clock_task: asyncio.Task[None] | None = None
        self._clock_chosen = False  # a restored machine's clock is set once, the way wait_ready picks
        self._clock_in_exec = False  # the next qemu-ga script sets the clock first (ClockMode.IN_EXEC)
        self._reseed_in_exec = False  # the next qemu-ga script reseeds the guest's RNG first (restored)
        self.rng_reseeded = False  # since its restore (the hot pool's prime does it)
        self._destroyed = False
        self._screen_size: tuple[int, int] | None = None
        self._screen_size_at = 0.0
        self._ppm_dumps = provider.ppm_screendumps
        self.domain = Domain(provider.conn, name)
        self.agent = GuestAgent(self.domain, polling=provider.polling)
        # the image's resident executor, which takes root sh scripts ahead of qemu-ga (execd.py)
        self.execd = ExecChannel(self.domain) if image.routes.execd and provider.resident_exec else None
        self.run_as = run_as_for(image.manifest)  # root, or the desktop session's user (desktop.py)
        self.input = InputDriver(self.domain, self._current_screen_size)
        self._winrm: WinRMChannel | None = None
        self.images_dir = provider.images_dir
        self.credentials: Credentials | None = None  # this machine's own WinRM password, in memory only
        self.write_cap: WriteCap | None = None

    async def _stop_over_limit(self, exc: MachineLimitExceeded) -> None:
        # The domain goes at once (it may be writing still); its files stay until destroy().
        await self.domain.destroy()

    def _over_limit(self) -> None:
        if self.write_cap is not None and self.write_cap.exceeded is not None:
            raise self.write_cap.exceeded

    @property
    def _uses_winrm(self) -> bool:
        return self.image.routes.script is Channel.WINRM

    async def _require_running(self) -> None:
        st = await self.domain.state()
        if st in (libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_PAUSED, libvirt.VIR_DOMAIN_BLOCKED):
            return
        tail = self.console_tail()
        what = "no longer exists" if st is None else "stopped"
        raise MachineNotReady(f"the machine {what} before its guest answered" + (f"; console: {tail}" if tail else ""))

    def console_tail(self, limit: int = 300) -> str:
        # Only the tail is read: the guest decides how much it prints (virtlogd rotates the file at
        # its max_size, 2 MiB by default, and keeps max_backups old ones: that bounds the disk).
        try:
            with open(self.dir / "console.log", "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
                data = f.read(limit)
        except OSError:
            return ""
        return data.decode(errors="replace").strip().replace("\r", "")

    async def wait_ready(self, timeout: float) -> None:
        if self._destroyed:
            raise MachineNotReady("the machine was destroyed")
        started = time.monotonic()
        deadline = started + timeout
        routes = self.image.routes
        for i, channel in enumerate(routes.ready_order):  # qemu-ga first where it sets the password WinRM uses
            left = timeout if i == 0 else max(1.0, deadline - time.monotonic())
            if channel is Channel.QEMU_GA:
                await self.agent.wait_ready(left, alive=self._require_running)
                if routes.per_machine_password and self.credentials is None:
                    self.credentials = await give_machine_password(
                        self.agent, self._winrm_username(), timeout=max(1.0, deadline - time.monotonic()),
                        alive=self._require_running)
            else:
                await self._winrm_channel().wait_ready(left, alive=self._require_running)
        if self.image.manifest.session is not None and not self.restored:
            # A restored desktop was saved with its session up; a booted one is ready only once the
            # session is (its guest agent answers a minute before that under TCG).
            took = await wait_session(self.agent, self.image.manifest, self.run_as, deadline,
                                      alive=self._require_running)
            log.info("desktop session up", machine_id=self.machine_id, seconds=round(took, 2))
            took = await self._wait_painted(deadline)
            log.info("desktop painted", machine_id=self.machine_id, seconds=round(took, 2))
            await self._park_pointer()
        if self.restored and not self._clock_chosen:
            self._clock_chosen = True
            # A restored guest's clock stands where it was saved (a pooled one's also lags by its
            # pause). A sh guest's first script sets it in its own guest-exec (`date -s`, no extra
            # round trip). Elsewhere qemu-ga's guest-set-time does, beside whatever the caller does
            # next: on Linux it waits for `hwclock -w` in the guest (0.3-0.5 s under TCG), on
            # Windows it is a SetSystemTime. Either way no script sees the stale clock.
            if self._clock_by_exec():
                self._clock_in_exec = True
            elif routes.channel(Duty.CLOCK) is Channel.QEMU_GA:
                self._clock_task = asyncio.create_task(self._set_clock())
            # Its kernel's RNG is the memory image's too, the same in every machine restored from it:
            # the first script reseeds it from host bytes (guest_agent.reseed_arg), unless the pool did.
            self._reseed_in_exec = (self.provider.reseed_after_restore and not self.rng_reseeded
                                    and self.image.routes.script is Channel.QEMU_GA
                                    and self.image.manifest.os != "windows")
        log.info("machine ready", machine_id=self.machine_id, seconds=round(time.monotonic() - started, 2))

    async def _wait_painted(self, deadline: float) -> float:
        """Poll the screen until it shows a painted desktop; the seconds it took. The session's
        processes run well before they have drawn anything (measured under TCG: a minute or more
        of black screen on a first start), and a warm snapshot taken then would hand every
        restored machine, and the agent's first screenshot, a black screen.

        Raises:
            MachineNotReady: the screen was still blank or a console at `deadline`.
        """
        started = time.monotonic()
        while (colours := distinct_colours(await self.screenshot())) < PAINTED_MIN_COLOURS:
            if time.monotonic() >= deadline:
                raise MachineNotReady(f"the session of {self.image.manifest.name} is up but its screen still shows "
                                      f"{colours} colours: blank or a console, not a desktop")
            await self._require_running()
            await asyncio.sleep(PAINT_POLL_S)
        return time.monotonic() - started

    async def _park_pointer(self) -> None:
        """Put the tablet's pointer where the X server put its own at start (the screen's centre).
        The guest kernel drops an absolute value equal to the one it holds, and a tablet that never
        moved holds 0: without this, an agent's first move to x=0 or y=0 after boot would not move
        the pointer (measured: a first click aimed at (0, 0) landed at the centre). The machine's
        warm snapshot is taken after this, so every restored desktop starts parked too."""
        w, h = await self._current_screen_size()
        await self.input.deliver([MoveEvent(x=w // 2, y=h // 2)])

    async def _set_clock(self) -> None:
        try:
            await self.agent.set_time()
        except ProviderError as e:
            log.warning("could not set the guest clock after restore", machine_id=self.machine_id, reason=str(e))

    def _clock_by_exec(self) -> bool:
        return (self.provider.clock_mode is ClockMode.IN_EXEC and self.image.routes.script is Channel.QEMU_GA
                and self.image.manifest.os != "windows")

    async def _clock_set(self) -> None:
        """Wait until the guest clock is right (for what reads it outside a script: a save)."""
        if self._clock_in_exec:
            await self._run_sh("true", env=None, timeout=30.0, output_cap=0)
        if self._clock_task is not None:
            await asyncio.shield(self._clock_task)

    async def _run_sh(self, script: str, *, env: Mapping[str, str] | None, timeout: float,
                      output_cap: int) -> ScriptResult:
        # As the image's scripts run: root, or the desktop session's user (the clock is set, and
        # the RNG reseeded, as root before the script starts).
        reseed = self._reseed_in_exec
        try:
            res, _ = await self._exec(script, env=env, timeout=timeout, output_cap=output_cap,
                                      set_clock=self._clock_in_exec, reseed=reseed)
        except ClockNotSet as e:  # the script did not run: set the clock the slow way, then run it
            log.warning("guest clock not set by the exec; using guest-set-time", machine_id=self.machine_id,
                        reason=str(e))
            await self.agent.set_time()
            res, _ = await self._exec(script, env=env, timeout=timeout, output_cap=output_cap, set_clock=False,
                                      reseed=reseed)
        self._clock_in_exec = False
        self._reseed_in_exec = False
        self.rng_reseeded |= reseed
        return res

    async def _exec(self, script: str, *, env: Mapping[str, str] | None, timeout: float, output_cap: int,
                    set_clock: bool, reseed: bool) -> tuple[ScriptResult, Channel]:
        """One sh script in the guest, and the channel that ran it: gh-execd where the image has it
        and it takes this one (root, output within its buffer, none running), else qemu-ga."""
        execd = self.execd
        if execd is not None and execd.free and self.run_as.user is None and 0 <= output_cap < MAX_KEEP:
            try:
                res = await execd.run(script, script_env(self.run_as, env), interpreter=self.run_as.interpreter,
                                      timeout=timeout, output_cap=output_cap,
                                      clock_ms=clock_ms() if set_clock else None,
                                      reseed=secrets.token_bytes(RESEED_BYTES) if reseed else None)
                return res, Channel.EXECD
            except Unavailable as e:  # the script did not run
                log.info("script through qemu-ga: gh-execd cannot take it", machine_id=self.machine_id, reason=str(e))
        res = await self.agent.run_sh(script, env=env, timeout=timeout, output_cap=output_cap, set_clock=set_clock,
                                      reseed=reseed, run_as=self.run_as)
        return res, Channel.QEMU_GA

    def _winrm_username(self) -> str:
        return load_credentials(credentials_path(self))[0]

    def _winrm_channel(self) -> WinRMChannel:
        if self._winrm is None:
            self._winrm = WinRMChannel.for_machine(self)
        return self._winrm

    async def run_script(self, script: str, *, env: Mapping[str, str] | None = None, timeout: float,
                         output_cap: int = DEFAULT_OUTPUT_CAP) -> ScriptResult:
        try:
            return await self._run_script(script, env=env, timeout=timeout, output_cap=output_cap)
        except ProviderError:
            if self.write_cap is not None:
                await self.write_cap.stopped()
            self._over_limit()  # the script failed because its machine was stopped over a limit: say so
            raise

    async def _run_script(self, script: str, *, env: Mapping[str, str] | None, timeout: float,
                          output_cap: int) -> ScriptResult:
        self._over_limit()
        if self._destroyed:
            raise ProviderError("the machine was destroyed")
        if self._clock_task is not None:
            await asyncio.shield(self._clock_task)
        if self._uses_winrm:
            result: ScriptResult = await self._winrm_channel().run_script(script, env=env, timeout=timeout,
                                                                         output_cap=output_cap)
            return result
        return await self._run_sh(script, env=env, timeout=timeout, output_cap=output_cap)

    async def screenshot(self) -> bytes:
        self._over_limit()
        if self._ppm_dumps:
            try:
                ppm = await in_thread("taking a screenshot", ppm_dump_blocking, self.domain, self.dir,
                                      timeout=CALL_TIMEOUT)
            except (ProviderError, OSError):
                ppm = None  # libvirt's screenshot below says what is wrong, if anything is
            if ppm is not None:
                png, size = await asyncio.to_thread(to_png, ppm, "image/x-portable-pixmap", swap_png=False)
                self._screen_size, self._screen_size_at = size, time.monotonic()
                return png
            self._ppm_dumps = False  # QEMU cannot write here: libvirt's path from now on, not a failed try each time
        raw, mime = await in_thread("taking a screenshot", screenshot_blocking, self.domain, timeout=CALL_TIMEOUT)
        swap = False
        if mime == "image/png":
            swap = bool(await self.provider._png_swapped(self, raw))
        png, size = await asyncio.to_thread(to_png, raw, mime, swap_png=swap)
        self._screen_size, self._screen_size_at = size, time.monotonic()
        return png

    async def _current_screen_size(self) -> tuple[int, int]:
        # Pointer coordinates are in the pixels of the screenshots the agent sees; the guest may
        # change resolution (a Windows sign-in, a driver), so a size older than a few seconds is
        # refreshed with a new screenshot (~50 ms) rather than trusted.
        if self._screen_size is None or time.monotonic() - self._screen_size_at > SCREEN_SIZE_TTL_S:
            await self.screenshot()
        assert self._screen_size is not None
        return self._screen_size

    async def send_input(self, events: Sequence[InputEvent]) -> None:
        self._over_limit()
        await self.input.deliver(events)

    async def save(self, start_state_id: str, version: int, *, with_memory: bool = True) -> SavedVersion:
        """Keep disk (and memory) as an immutable version; this machine keeps running afterwards.

        With memory: the domain is saved to a memory image (it stops), the disk is copied while it is
        stopped, then the domain is restored from that same image, so memory and disk agree and the
        machine carries on. Without memory: the guest's buffers are synced, the domain is paused
        while the disk is copied, then resumed.
        """
        p = self.provider
        await self._clock_set()
        vf = p.states.version(start_state_id, version)
        if vf.dir.exists():
            raise ProviderError(
                f"start state {start_state_id} version {version} already exists (versions are immutable)")
        partial = vf.dir.with_name(vf.dir.name + ".partial")
        await asyncio.to_thread(shutil.rmtree, partial, True)
        fileperms.machine_dir(partial.parent)
        fileperms.machine_dir(partial)
        started = time.monotonic()
        try:
            if with_memory:
                await self.save_files(partial, resume=True)
            else:
                if not self._uses_winrm:
                    await self.agent.run_sh("sync", env=None, timeout=60)
                await self.domain.suspend()
                try:
                    await overlays.write_version_disk(self.overlay, self.image.disk, partial / "disk.qcow2",
                                                      flatten=p.flatten_versions)
                finally:
                    await self.domain.resume()
            meta = {"image": self.image.manifest.name, "image_checksum": self.image.info.checksum,
                    "start_state_id": start_state_id, "version": version, "with_memory": with_memory,
                    "flattened": p.flatten_versions, "created_at": time.time()}
            (partial / "meta.json").write_text(json.dumps(meta))
            partial.rename(vf.dir)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, partial, True)
            raise
        size = sum(f.stat().st_size for f in vf.dir.iterdir() if f.is_file())
        if with_memory and p.pool is not None:
            p.pool.wake()  # a version with memory is a new pool source
        log.info("start state saved", start_state_id=start_state_id, version=version, with_memory=with_memory,
                 seconds=round(time.monotonic() - started, 2), bytes=size)
        return SavedVersion(start_state_id=start_state_id, version=version, disk_path=vf.disk, size_bytes=size,
                            memory_image=vf.memory if with_memory else None)

    async def save_files(self, dest: Path, *, resume: bool, devstate: Path | None = None) -> None:
        """Write `dest/memory.img` and `dest/disk.qcow2` from this machine, which stops for it: with
        `resume` it is restored from that same image afterwards, so memory and disk agree. With
        `devstate` (a machine whose RAM is a file), its device state alone goes there too, from
        the same moment, for lazy copies (the machine is left paused)."""
        p = self.provider
        mem = dest / "memory.img"
        if not self._uses_winrm:
            # A smaller memory image restores faster. QEMU sends zero pages almost for free, and
            # free guest memory holds stale data: fill tmpfs (the kernel zeroes pages it hands
            # out), delete it, and drop the clean page cache.
            keep = "48" if self.image.manifest.session is None else "384"
            await self.agent.run_sh(ZERO_FREE_MEMORY, env={"GH_KEEP_MIB": keep}, timeout=120)
        await self.domain.save(str(mem), timeout=600)
        try:
            await overlays.write_version_disk(self.overlay, self.image.disk, dest / "disk.qcow2",
                                              flatten=p.flatten_versions)
            if devstate is not None:
                # QEMU will not migrate twice from one pause, and libvirt's save ends the domain: so
                # the full image first, then the same moment restored paused (which fills the RAM
                # file) for the device state alone.
                await in_thread("restoring machine paused",
                                lambda: p.conn.call(lambda c: c.restoreFlags(str(mem), None,
                                                                             libvirt.VIR_DOMAIN_SAVE_PAUSED),
                                                    retry=False),
                                timeout=600)
                await in_thread("saving the device state", lazy.save_devstate_blocking, self.domain, devstate, 120.0,
                                timeout=150.0)
        finally:
            if resume:
                await in_thread("resuming machine after save",
                                lambda: p.conn.call(lambda c: c.restoreFlags(str(mem), None,
                                                                             libvirt.VIR_DOMAIN_SAVE_RUNNING),
                                                    retry=False),
                                timeout=600)
        fileperms.disk_file(mem, read_only=True)
        if self.execd is not None:
            self.execd.close()  # the port's socket was the stopped QEMU's
        if resume and not self._uses_winrm:
            # Restored from what it just saved: its agent reconnects, and its clock stood still for
            # the save. The next script sets it (as after any restore) once the agent answers.
            await self.agent.wait_ready(CALL_TIMEOUT, alive=self._require_running)
            if self._clock_by_exec():
                self._clock_in_exec = True

    async def destroy(self) -> None:
        """Remove the domain and every file of this machine; idempotent, and quiet for a gone machine."""
        p = self.provider
        if self._clock_task is not None and not self._clock_task.done():
            self._clock_task.cancel()
        if self.write_cap is not None:
            await self.write_cap.close()
        if self.execd is not None:
            self.execd.close()
        try:
            await self.domain.destroy()
        except ProviderError as e:
            # NOTE: the files stay: the domain may well still run on its overlay (libvirtd restarting
            # does not stop QEMU). The provider retries the destroy and removes them once it is gone.
            p._destroy_later(self, str(e))
            raise
        await asyncio.to_thread(shutil.rmtree, self.dir, True)
        self._destroyed = True
        p._machines.pop(self.machine_id, None)


__all__ = ["QemuMachine", "QemuProvider", "plain_reason"]
