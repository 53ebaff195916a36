"""One machine of the QEMU provider, and what a machine does: become ready, run scripts, show its
screen, take input, save itself as a start-state version, be destroyed.

A machine is a transient domain over its own overlay in `state_dir/machines/<domain>/` (see
provider.py for the layout); the provider makes it and hands it what it needs (the connection, the
reaper, the versions, the screen calibration), and it reaches nothing of the provider's.

A script runs on one channel (channels.py): WinRM for a PowerShell image; for sh and bash,
gh-execd, the image's resident executor, where it takes the script (execd.py), else qemu-ga
(guest_agent.py). `run_script_via` says which one ran it.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import libvirt
import structlog

from gh_common.backoff import Backoff
from gh_wire.input import InputEvent, MoveEvent
from providers.base import DEFAULT_OUTPUT_CAP, Machine, MachineNotReady, MachineOrigin, SavedVersion, ScriptResult
from providers.errors import (
    AccessibilityTooLarge,
    MachineLimitExceeded,
    NoAccessibilityTree,
    NoScreenStream,
    ProviderError,
)
from providers.qemu import atspi_tree, fileperms, lazy, livesave
from providers.qemu.agent_groups import SETTLE_EXIT, FrozenTime, freeze_script, joined, new_group
from providers.qemu.channels import Channel, Duty
from providers.qemu.connection import Connection
from providers.qemu.credentials import Credentials, give_machine_password
from providers.qemu.desktop import run_as_for, wait_session
from providers.qemu.diskcap import WriteCap
from providers.qemu.errors import in_thread
from providers.qemu.execd import MAX_KEEP, ExecChannel, Unavailable
from providers.qemu.guest_agent import RESEED_BYTES, ClockMode, ClockNotSet, GuestAgent, clock_ms, script_env
from providers.qemu.handle import CALL_TIMEOUT, Domain
from providers.qemu.images import Image
from providers.qemu.input import InputDriver
from providers.qemu.reaper import Reaper
from providers.qemu.screen import (
    PAINTED_MIN_COLOURS,
    SwapCalibration,
    distinct_colours,
    ppm_dump_blocking,
    screenshot_blocking,
    to_png,
)
from providers.qemu.states import DISK, MEMORY
from providers.qemu.versions import Versions
from providers.qemu.winrm import WinRMChannel, credentials_path, load_credentials

log = structlog.get_logger("providers.qemu")

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


@dataclass(frozen=True)
class MachineOptions:
    """How a machine runs its scripts and takes its screenshots: the provider's attributes of the
    same names when it made the machine. Their defaults there are the fast ways; bench/ turns single
    ones back to measure both side by side."""

    clock_mode: ClockMode  # how a restored sh guest's clock is set
    polling: Backoff  # of guest-exec-status
    sh_wrapper: str  # qemu-ga's script wrapper (guest_agent.WRAPPER; bench/legacy_exec.py has an older one)
    resident_exec: bool  # scripts through gh-execd where the image has it
    reseed_after_restore: bool  # the first script after a restore reseeds the guest's RNG
    prime_script: bool  # `prime` runs a script too, not only waits for the guest agent
    ppm_screendumps: bool  # QEMU's PPM dump before libvirt's screenshot (screen.py says why)


class QemuMachine(Machine):
    def __init__(self, machine_id: str, name: str, image: Image, mdir: Path, *, conn: Connection,
                 images_dir: Path, options: MachineOptions, reaper: Reaper, versions: Versions,
                 calibration: SwapCalibration) -> None:
        self.machine_id = machine_id
        self.domain_name = name
        self.image = image
        self.dir = mdir
        self.overlay = mdir / DISK
        self._live_top: Path | None = None  # the file a live save left the guest on over `overlay` (livesave.py)
        self.options = options
        self.restored = False
        self.origin = MachineOrigin.COLD
        self._conn = conn
        self._reaper = reaper
        self._versions = versions
        self._calibration = calibration
        self._clock_task: asyncio.Task[None] | None = None
        self._clock_chosen = False  # a restored machine's clock is set once, the way wait_ready picks
        self._clock_in_exec = False  # the next sh script sets the clock first (ClockMode.IN_EXEC)
        self._reseed_in_exec = False  # the next sh script reseeds the guest's RNG first (restored)
        self.rng_reseeded = False  # since its restore (`prime` does it for a pooled machine)
        self._destroyed = False
        self._screen_size: tuple[int, int] | None = None
        self._screen_size_at = 0.0
        self._ppm_dumps = options.ppm_screendumps
        self.domain = Domain(conn, name)
        self.agent = GuestAgent(self.domain, polling=options.polling, wrapper=options.sh_wrapper)
        # the image's resident executor, which takes root sh scripts ahead of qemu-ga (execd.py)
        self.execd = ExecChannel(self.domain) if image.routes.execd and options.resident_exec else None
        self._frozen = FrozenTime()  # how long holds kept the agent's execs frozen: moves their deadlines
        self.run_as = run_as_for(image.manifest)  # root, or the desktop session's user (desktop.py)
        self.input = InputDriver(self.domain, self._current_screen_size)
        self._winrm: WinRMChannel | None = None
        self.images_dir = images_dir
        self.credentials: Credentials | None = None  # this machine's own WinRM password, in memory only
        self.write_cap: WriteCap | None = None

    # -- limits and state ---------------------------------------------------------------------------

    def limit_writes(self, cap_bytes: int) -> None:
        """Destroy the domain once this machine's directory (overlay + console log) grows past
        `cap_bytes`; its calls raise MachineLimitExceeded(DISK_WRITE_CAP) from then on (diskcap.py)."""
        self.write_cap = WriteCap(self.dir, cap_bytes, self._stop_over_limit)
        self.write_cap.start()

    async def _stop_over_limit(self, exc: MachineLimitExceeded) -> None:
        # The domain goes at once (it may be writing still); its files stay until destroy().
        await self.domain.destroy()

    def _over_limit(self) -> None:
        if self.write_cap is not None and self.write_cap.exceeded is not None:
            raise self.write_cap.exceeded

    @property
    def _uses_winrm(self) -> bool:
        return self.image.routes.script is Channel.WINRM

    @property
    def shell(self) -> str:
        return "powershell" if self._uses_winrm else "sh"

    async def guest_running(self) -> bool:
        if self._destroyed:
            return False
        return await self.domain.state() == libvirt.VIR_DOMAIN_RUNNING

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

    # -- ready ----------------------------------------------------------------------------------------

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
            # pause). A sh guest's first script sets it in its own request (`date -s`, or
            # clock_settime in gh-execd: no extra round trip). Elsewhere qemu-ga's guest-set-time
            # does, beside whatever the caller does next: on Linux it waits for `hwclock -w` in the
            # guest (0.3-0.5 s under TCG), on Windows it is a SetSystemTime. Either way no script
            # sees the stale clock.
            if self._clock_by_exec():
                self._clock_in_exec = True
            elif routes.channel(Duty.CLOCK) is Channel.QEMU_GA:
                self._clock_task = asyncio.create_task(self._set_clock())
            # Its kernel's RNG is the memory image's too, the same in every machine restored from it:
            # the first script reseeds it from host bytes (guest_agent.reseed_arg), unless `prime` did.
            self._reseed_in_exec = (self.options.reseed_after_restore and not self.rng_reseeded
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
        return (self.options.clock_mode is ClockMode.IN_EXEC and self.image.routes.script is Channel.QEMU_GA
                and self.image.manifest.os != "windows")

    async def _clock_set(self) -> None:
        """Wait until the guest clock is right (for what reads it outside a script: a save)."""
        if self._clock_in_exec:
            await self.run_script("true", timeout=30.0, output_cap=0)
        if self._clock_task is not None:
            await asyncio.shield(self._clock_task)

    async def prime(self, timeout: float) -> float:
        """Run this paused, just-restored machine until its guest agent answers, then pause it again
        (for the hot pool: providers/qemu/pool.py says why); the seconds the answer took.

        Raises:
            ProviderError: MachineNotReady when the guest did not answer within `timeout`.
        """
        await self.domain.resume("resuming a machine for the hot pool")
        started = time.monotonic()
        await self.agent.wait_ready(timeout, alive=self._require_running)
        answered = time.monotonic() - started
        # A script's path too (qemu-ga's fork, busybox sh, setsid, head): the first after a restore
        # took ~0.5 s under TCG, later ones a fraction. It sets the clock, and reseeds the guest's
        # RNG with its own host bytes (guest_agent.reseed_arg), so no two pooled machines share
        # their memory image's RNG state and the lease's first script need not start gh-reseed
        # again: a pooled machine serves one attempt. Through gh-execd, where the image has it,
        # the connection to its port is made here and stays open through the pause, and the kernel
        # paths the lease's first script takes (clock_settime, the RTC read) are translated here
        # under TCG (~10 ms on that script otherwise).
        if self.options.prime_script:
            self._clock_in_exec, self._reseed_in_exec = True, self.options.reseed_after_restore
            _, channel = await self.run_script_via("true", timeout=timeout, output_cap=0)
            if channel is Channel.QEMU_GA:  # the wrapper removes its files in the background: gone before the pause
                await self.agent.run_sh("rm -f /tmp/gh-exec-*", env=None, timeout=timeout, output_cap=0)
        await self.domain.suspend("pausing a machine for the hot pool")
        return answered

    # -- scripts --------------------------------------------------------------------------------------

    async def run_script(self, script: str, *, env: Mapping[str, str] | None = None, timeout: float,
                         output_cap: int = DEFAULT_OUTPUT_CAP) -> ScriptResult:
        result, _ = await self.run_script_via(script, env=env, timeout=timeout, output_cap=output_cap)
        return result

    async def run_agent_script(self, script: str, *, env: Mapping[str, str] | None = None, timeout: float,
                               output_cap: int = DEFAULT_OUTPUT_CAP) -> ScriptResult:
        """An agent's exec, in an exec group of its own on an sh guest (agent_groups.py)."""
        group = None if self._uses_winrm else new_group()
        result, _ = await self.run_script_via(script, env=env, timeout=timeout, output_cap=output_cap, group=group)
        return result

    async def freeze_agent_execs(self, frozen: bool, timeout: float) -> bool:
        """Freeze or thaw the agent's exec groups, as root through qemu-ga (gh-execd may be busy
        with the very exec being frozen). A PowerShell image has none: False."""
        if self._uses_winrm or self._destroyed:
            return False
        if frozen:
            self._frozen.froze()
        res = await self.agent.run_sh(freeze_script(frozen), env=None, timeout=timeout, output_cap=4096)
        if not frozen and res.exit_code == 0:
            self._frozen.thawed()
        if res.exit_code != 0:
            what = "did not settle" if res.exit_code == SETTLE_EXIT else f"exit {res.exit_code}"
            raise ProviderError(f"the guest did not {'freeze' if frozen else 'thaw'} the agent's execs "
                                f"({what}): {(res.stderr or res.stdout).strip()[:200]}")
        return True

    async def run_script_via(self, script: str, *, env: Mapping[str, str] | None = None, timeout: float,
                             output_cap: int = DEFAULT_OUTPUT_CAP,
                             group: str | None = None) -> tuple[ScriptResult, Channel]:
        """`run_script`, and the channel that ran the script: Channel.WINRM for a PowerShell image;
        else Channel.EXECD where gh-execd took it, or Channel.QEMU_GA.

        The first sh script after a restore sets the guest's clock and reseeds its RNG before it
        starts, in the same request (wait_ready decides); where the guest refuses the clock,
        qemu-ga's guest-set-time sets it and the script, which had not run, runs then. With `group`
        (an agent's exec) the script runs in that exec group (agent_groups.py).

        Raises:
            ProviderError: the script could not be run or its channel failed (MachineLimitExceeded
                when the machine was stopped over a limit).
        """
        try:
            self._over_limit()
            if self._destroyed:
                raise ProviderError("the machine was destroyed")
            if self._clock_task is not None:
                await asyncio.shield(self._clock_task)
            if self._uses_winrm:
                result: ScriptResult = await self._winrm_channel().run_script(script, env=env, timeout=timeout,
                                                                             output_cap=output_cap)
                return result, Channel.WINRM
            reseed = self._reseed_in_exec
            try:
                ran = await self._run_sh(script, env=env, timeout=timeout, output_cap=output_cap,
                                         set_clock=self._clock_in_exec, reseed=reseed, group=group)
            except ClockNotSet as e:  # the script did not run: set the clock the slow way, then run it
                log.warning("guest clock not set by the exec; using guest-set-time", machine_id=self.machine_id,
                            reason=str(e))
                await self.agent.set_time()
                ran = await self._run_sh(script, env=env, timeout=timeout, output_cap=output_cap, set_clock=False,
                                         reseed=reseed, group=group)
            self._clock_in_exec = False
            self._reseed_in_exec = False
            self.rng_reseeded |= reseed
            return ran
        except ProviderError:
            if self.write_cap is not None:
                await self.write_cap.stopped()
            self._over_limit()  # the script failed because its machine was stopped over a limit: say so
            raise

    async def _run_sh(self, script: str, *, env: Mapping[str, str] | None, timeout: float, output_cap: int,
                      set_clock: bool, reseed: bool, group: str | None = None) -> tuple[ScriptResult, Channel]:
        """One sh script as the image's scripts run (root, or the desktop session's user; the clock
        set and the RNG reseeded as root first when asked): through gh-execd where the image has it
        and it takes this one (root, output within its buffer, none running), else qemu-ga."""
        execd = self.execd
        if execd is not None and execd.free and self.run_as.user is None and 0 <= output_cap < MAX_KEEP:
            try:
                # gh-execd forks the interpreter itself: the script's own shell joins the group first
                text = joined(script, group) if group is not None else script
                res = await execd.run(text, script_env(self.run_as, env), interpreter=self.run_as.interpreter,
                                      timeout=timeout, output_cap=output_cap,
                                      clock_ms=clock_ms() if set_clock else None,
                                      reseed=secrets.token_bytes(RESEED_BYTES) if reseed else None,
                                      frozen=self._frozen if group is not None else None)
                return res, Channel.EXECD
            except Unavailable as e:  # the script did not run
                log.info("script through qemu-ga: gh-execd cannot take it", machine_id=self.machine_id, reason=str(e))
        res = await self.agent.run_sh(script, env=env, timeout=timeout, output_cap=output_cap, set_clock=set_clock,
                                      reseed=reseed, run_as=self.run_as, group=group,
                                      frozen=self._frozen if group is not None else None)
        return res, Channel.QEMU_GA

    def _winrm_username(self) -> str:
        return load_credentials(credentials_path(self))[0]

    def _winrm_channel(self) -> WinRMChannel:
        if self._winrm is None:
            self._winrm = WinRMChannel.for_machine(self)
        return self._winrm

    # -- the accessibility tree ------------------------------------------------------------------------

    async def accessibility_tree(self, timeout: float, max_bytes: int) -> str:
        """The session's AT-SPI tree, read by atspi_tree.py in the guest as the signed-in user (its
        session bus) and stopped by `timeout` there; the output cap is one byte over `max_bytes`, so the
        reader's own check refuses first."""
        if self.image.manifest.session is None or self._uses_winrm:
            raise NoAccessibilityTree(f"{self.image.manifest.name} has no desktop session to read an "
                                      "accessibility tree from")
        res = await self.run_script(atspi_tree.reader_script(max_bytes, timeout), timeout=timeout + 5,
                                    output_cap=max_bytes + 1)
        why = res.stderr.strip()[-300:]
        if res.timed_out or res.exit_code == 124:
            raise TimeoutError(f"the accessibility tree was not read in {timeout:g} s")
        if res.exit_code == atspi_tree.TOO_LARGE_EXIT or res.stdout_truncated:
            raise AccessibilityTooLarge(why or f"the accessibility tree is over {max_bytes} bytes")
        if res.exit_code in (atspi_tree.NO_BUS_EXIT, atspi_tree.NO_READER_EXIT, 127):
            raise NoAccessibilityTree(f"{self.image.manifest.name} gives no accessibility tree: {why}")
        if res.exit_code != 0:
            raise ProviderError(f"the accessibility reader failed (exit {res.exit_code}): {why}")
        return res.stdout

    # -- screen and input -----------------------------------------------------------------------------

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
            swap = bool(await self._calibration.swapped(self.domain, self.dir, raw))
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

    async def open_screen_stream(self, timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connected socket to QEMU's VNC server, from libvirt (domain.add_display says why no
        listener): the runner's own client, one per call."""
        self._over_limit()
        if self._destroyed:
            raise ProviderError("the machine was destroyed")
        fd = await self.domain.call("opening the machine's screen stream", _open_graphics_fd, timeout=timeout,
                                    retry=False)
        sock = socket.socket(fileno=fd)
        try:
            sock.setblocking(False)
            return await asyncio.open_connection(sock=sock)
        except BaseException:
            sock.close()
            raise

    # -- save -----------------------------------------------------------------------------------------

    async def save(self, start_state_id: str, version: int, *, with_memory: bool = True) -> SavedVersion:
        """Keep disk (and memory) as an immutable version; this machine keeps running afterwards.

        With memory: the memory image is written while the guest runs and the disk's overlay is frozen at
        its end (livesave.py), so memory and disk agree; the guest stops only for the last dirty pages.
        Without memory: the guest's buffers are synced, the domain is paused while the disk is copied, then
        resumed.
        """
        await self._clock_set()
        return await self._versions.save(start_state_id, version, image=self.image, with_memory=with_memory,
                                         write=partial(self._write_version, with_memory=with_memory))

    async def _write_version(self, dest: Path, *, with_memory: bool) -> None:
        if with_memory:
            await self.save_files(dest, resume=True)
            return
        await self._one_overlay()
        if not self._uses_winrm:
            await self.agent.run_sh("sync", env=None, timeout=60)
        await self.domain.suspend()
        try:
            await self._versions.write_disk(self.overlay, self.image.disk, dest / DISK)
        finally:
            await self.domain.resume()

    async def save_files(self, dest: Path, *, resume: bool, devstate: Path | None = None) -> None:
        """Write `dest/memory.img` and `dest/disk.qcow2` from this machine, memory and disk of one moment.
        With `resume` the machine runs on: its memory is written while it runs (livesave.py). Without, it
        stops for it (libvirt's save) and stays stopped; with `devstate` (a machine whose RAM is a file),
        its device state alone goes there too, from the same moment, for lazy copies (the machine is left
        paused)."""
        mem = dest / MEMORY
        await self._one_overlay()
        if not self._uses_winrm:
            # A smaller memory image restores faster. QEMU sends zero pages almost for free, and
            # free guest memory holds stale data: fill tmpfs (the kernel zeroes pages it hands
            # out), delete it, and drop the clean page cache.
            keep = "48" if self.image.manifest.session is None else "384"
            await self.agent.run_sh(ZERO_FREE_MEMORY, env={"GH_KEEP_MIB": keep}, timeout=120)
        if resume:
            await self._save_live(dest)
            return
        await self.domain.save(str(mem), timeout=600)
        await self._versions.write_disk(self.overlay, self.image.disk, dest / DISK)
        if devstate is not None:
            # QEMU will not migrate twice from one pause, and libvirt's save ends the domain: so the full
            # image first, then the same moment restored paused (which fills the RAM file) for the device
            # state alone.
            await in_thread("restoring machine paused",
                            lambda: self._conn.call(lambda c: c.restoreFlags(str(mem), None,
                                                                             libvirt.VIR_DOMAIN_SAVE_PAUSED),
                                                    retry=False),
                            timeout=600)
            await in_thread("saving the device state", lazy.save_devstate_blocking, self.domain, devstate, 120.0,
                            timeout=150.0)
        fileperms.disk_file(mem, read_only=True)
        if self.execd is not None:
            self.execd.close()  # the port's socket was the stopped QEMU's

    async def _one_overlay(self) -> None:
        """Back on its own overlay alone, should an earlier live save have left the guest on a file over it
        (a save copies that one overlay). Raises ProviderError."""
        if self._live_top is not None:
            await livesave.fold(self.domain, self.overlay, self._live_top)
            self._live_top = None

    async def _save_live(self, dest: Path) -> None:
        """`dest/memory.img` and `dest/disk.qcow2` while the guest runs (livesave.py): it stops only for the
        last dirty pages and the disk switch, its QEMU and its agent's connections carry on."""
        def left_on(top: Path) -> None:
            self._live_top = top

        await livesave.save_live(self.domain, self.overlay, dest / MEMORY, left_on=left_on,
                                 copy_disk=lambda frozen: self._versions.write_disk(frozen, self.image.disk,
                                                                                    dest / DISK))
        fileperms.disk_file(dest / MEMORY, read_only=True)

    # -- destroy --------------------------------------------------------------------------------------

    async def destroy(self) -> None:
        """Remove the domain and every file of this machine; idempotent, and quiet for a gone machine."""
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
            # does not stop QEMU). The reaper retries the destroy and removes them once it is gone.
            self._reaper.destroy_later(self.machine_id, self.domain, self._remove_files, str(e))
            raise
        await self._remove_files()

    async def _remove_files(self) -> None:
        """The domain is gone: remove this machine's files; it is destroyed from now on."""
        await asyncio.to_thread(shutil.rmtree, self.dir, True)
        self._destroyed = True
        self._reaper.forget(self.machine_id)


def _open_graphics_fd(_c: libvirt.virConnect, dom: libvirt.virDomain) -> int:
    try:
        return int(dom.openGraphicsFD(0, 0))
    except libvirt.libvirtError as e:
        if "type='vnc'" not in dom.XMLDesc(0):  # a domain started before machines had a display
            raise NoScreenStream("this machine was started without a display to stream; a machine made "
                                 "from now on has one") from None
        raise ProviderError(f"libvirt would not open the machine's screen stream: {e.get_error_message()}") from None


__all__ = ["MachineOptions", "QemuMachine"]
