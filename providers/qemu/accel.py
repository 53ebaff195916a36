"""The one accelerator decision: KVM when a Linux kernel booted under it prints, else TCG.

Everyone who picks an accelerator asks here: the runner's provider when it starts, the image
builder (linux-tiny, linux-desktop, windows-10) and `gh-runner doctor`.

`/dev/kvm` opening is not enough. Under broken nested virtualisation a KVM guest can run its
firmware (SeaBIOS, a boot sector) and still hang before a Linux kernel prints anything, hang after
its first line (bringing up a second virtual CPU, calibrating its timers), or QEMU aborts on the
host CPU model's MSRs. So the decision boots a real kernel under KVM, with the CPU model every KVM
guest of ours gets (`host`: providers/qemu/domain.py, image-builder/imagebuilder/vm.py) and two
virtual CPUs as our desktops have, its serial console on a pipe, and waits PROBE_DEADLINE_S for the
kernel to reach the end of its own start (`FINISHED`): with no disk and no initrd that is the root
mount's failure; a kernel with an initramfs built in gets as far as freeing its init memory instead.
A kernel that printed "Linux version" and never got there is a hung kernel, and TCG. The kernel is
the caller's (an image's direct-boot kernel), else this host's own when it is readable.

Why the whole start, not the first line: a probe satisfied by "Linux version" on one virtual CPU
can choose KVM on a host whose 2-vCPU desktop guests then never finish booting, while 1-vCPU
linux-tiny guests run. That is the likely cause of issue 52 (a CI host's first linux-desktop machine
waited out its 900 s bound); it was not reproduced on a host with that fault.

With no kernel at all nothing is proved. QEMU is still started under KVM, paused before any guest
code runs: if it cannot even make its KVM virtual CPU (a host CPU model whose MSRs nested KVM
refuses) the decision is TCG; if it can, KVM is chosen and the decision says it is unproven
(`Basis.UNPROVEN`).

A verdict that stands on QEMU run under KVM (the kernel printed, or did not, or QEMU failed) holds
until the host reboots: it is kept in memory and in the caller's file, keyed by the host's boot id
and the QEMU binary. The /dev/kvm check is cheap and is made on every call, so a permission fix
counts at once; unproven and forced decisions are never kept.
"""

from __future__ import annotations

import asyncio
import json
import os
import selectors
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import structlog

from providers.manifest import MANIFEST_NAME, DirectKernelBoot, ManifestError, load_manifest
from providers.qemu.hostcheck import KvmAccess, kvm_device_access

log = structlog.get_logger("providers.qemu.accel")

QEMU_BINARIES = ("qemu-system-x86_64", "/usr/libexec/qemu-kvm")
# From QEMU's start to the kernel's root mount: under TCG on a 2-core host 2.3 s for linux-tiny's
# kernel and 4.7 s for linux-desktop's (1.6 s of guest time), so about a second under working KVM;
# QEMU's own start on a loaded host takes a few more. Paid once per boot of the host (the verdict is kept).
PROBE_DEADLINE_S = 10.0
STARTED = b"Linux version"  # the kernel's first line
# The end of a kernel's own start, every CPU up and every built-in driver initialised: with no root to
# mount (no disk, no initrd) the panic saying so (Debian's kernels); with an initramfs built into
# the kernel, the line just before it runs /init.
FINISHED = (b"VFS: Unable to mount root fs", b"Freeing unused kernel")
PROBE_VCPUS = 2  # a second virtual CPU's bring-up is where nested KVM often hangs; our desktops have 2
# Kept verdicts name the probe that made them: one from a weaker probe is not trusted after an upgrade.
PROBE_VERSION = 2
CACHE_NAME = "accelerator.json"  # the file's usual name, in the caller's state or cache directory


class Accelerator(StrEnum):
    KVM = "kvm"
    TCG = "tcg"


class Basis(StrEnum):
    """What a decision stands on."""

    BOOTED = "booted"  # KVM: a Linux kernel printed under KVM
    UNPROVEN = "unproven"  # KVM: /dev/kvm opens, but there was no kernel to boot under it
    FORCED = "forced"  # either: the caller's configuration said so
    NO_QEMU = "no-qemu"  # TCG (nothing runs without QEMU; the decision does not stand in the way)
    NO_DEVICE = "no-device"  # TCG: /dev/kvm missing, or this process may not open it
    QEMU_FAILED = "qemu-failed"  # TCG: QEMU failed under KVM (before the kernel printed, or with no guest)
    KERNEL_SILENT = "kernel-silent"  # TCG: the kernel printed nothing before the deadline
    KERNEL_HUNG = "kernel-hung"  # TCG: the kernel printed its first line but did not finish starting

    @property
    def kept(self) -> bool:
        """A verdict from QEMU run under KVM, kept until the host reboots."""
        return self in (Basis.BOOTED, Basis.QEMU_FAILED, Basis.KERNEL_SILENT, Basis.KERNEL_HUNG)


@dataclass(frozen=True)
class Decision:
    accelerator: Accelerator
    basis: Basis
    detail: str  # the fact behind the basis: the kernel booted, QEMU's error, the /dev/kvm access
    cached: bool = False  # read from memory or the file, not decided by this call

    @property
    def reason(self) -> str:
        said = {
            Basis.BOOTED: "a KVM guest booted a kernel",
            Basis.UNPROVEN: "unproven: no Linux kernel to boot under KVM, so KVM is chosen without a guest run",
            Basis.FORCED: "forced by configuration",
            Basis.NO_QEMU: "no QEMU to run KVM with",
            Basis.NO_DEVICE: "KVM cannot be opened",
            Basis.QEMU_FAILED: "QEMU failed under KVM",
            Basis.KERNEL_SILENT: "a Linux kernel booted under KVM never printed (nested KVM that runs firmware "
                                 "but not a kernel?)",
            Basis.KERNEL_HUNG: "a Linux kernel started under KVM but never finished starting (nested KVM that "
                               "hangs a kernel part way?)",
        }[self.basis]
        return f"{said} ({self.detail})" + ("; kept from earlier this boot" if self.cached else "")

    def __str__(self) -> str:
        return f"{self.accelerator}: {self.reason}"


_kept: dict[tuple[str, str], Decision] = {}  # (boot id, QEMU binary) -> decision


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def qemu_binary() -> str | None:
    for b in QEMU_BINARIES:
        found = shutil.which(b) or (b if os.path.isabs(b) and os.access(b, os.X_OK) else None)
        if found:
            return found
    return None


def host_kernel() -> Path | None:
    """This host's running kernel, when this process may read it (Debian: yes; Ubuntu: root only)."""
    k = Path("/boot") / f"vmlinuz-{os.uname().release}"
    return k if os.access(k, os.R_OK) else None


def image_kernel(*images_dirs: Path) -> Path | None:
    """The direct-boot kernel of the first image (by name) in these images directories that has one."""
    for images in images_dirs:
        try:
            dirs = sorted(d for d in images.iterdir() if (d / MANIFEST_NAME).is_file())
        except OSError:
            continue
        for d in dirs:
            try:
                m = load_manifest(d, verify_checksum=False)
            except ManifestError:
                continue
            if isinstance(m.boot, DirectKernelBoot) and (d / m.boot.kernel).is_file():
                return d / m.boot.kernel
    return None


@dataclass(frozen=True)
class _Run:
    seen: frozenset[bytes]  # the marks that appeared on stdout
    exited: int | None  # QEMU's exit status, when it ended by itself
    error: str  # QEMU's last error line on stderr ("" when none)
    seconds: float


def _run_under_kvm(qemu: str, args: list[str], marks: tuple[bytes, ...], until: tuple[bytes, ...],
                   deadline_s: float, stdin: bytes = b"") -> _Run:
    """Run QEMU under KVM with the CPU model our guests get, `stdin` on its standard input, until one
    of `until` is on its stdout, it exits, or `deadline_s` passes; then kill it. Says which of
    `marks` and `until` it saw."""
    argv = [qemu, "-accel", "kvm", "-machine", "pc", "-cpu", "host", "-nodefaults", "-no-user-config",
            "-display", "none", "-monitor", "none", "-no-reboot", *args]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        proc.stdin.write(stdin)  # a few hundred bytes: the pipe holds them until QEMU reads
        proc.stdin.flush()
    except BrokenPipeError:
        pass  # QEMU already gone: its status and stderr say why
    out, err = proc.stdout.fileno(), proc.stderr.fileno()
    tail = {out: b"", err: b""}
    seen: set[bytes] = set()
    wanted = (*marks, *until)
    with selectors.DefaultSelector() as sel:
        for fd in tail:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map() and not seen.intersection(until):
            left = deadline_s - (time.monotonic() - t0)
            if left <= 0:
                break
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    tail[key.fd] = (tail[key.fd] + chunk)[-65536:]
                    if key.fd == out:
                        seen.update(m for m in wanted if m in tail[out])
                else:
                    sel.unregister(key.fd)
    took = time.monotonic() - t0
    exited = proc.poll()
    if exited is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    proc.stdin.close()
    proc.stdout.close()
    proc.stderr.close()
    errors = [ln for ln in tail[err].decode(errors="replace").splitlines() if ln.strip() and "warning" not in ln]
    return _Run(frozenset(seen), exited, errors[-1] if errors else "", took)


def boot_kernel_under_kvm(qemu: str, kernel: Path, deadline_s: float = PROBE_DEADLINE_S) -> Decision:
    """Boot `kernel` under KVM on PROBE_VCPUS virtual CPUs and wait up to `deadline_s` for it to
    finish its own start (one of `FINISHED`, on the serial console)."""
    vcpus = max(1, min(PROBE_VCPUS, os.cpu_count() or 1))
    r = _run_under_kvm(qemu, ["-m", "128", "-smp", str(vcpus), "-kernel", str(kernel), "-serial", "stdio",
                              "-append", "console=ttyS0 earlyprintk=ttyS0 panic=-1"], (STARTED,), FINISHED,
                       deadline_s)
    if r.seen.intersection(FINISHED):
        return Decision(Accelerator.KVM, Basis.BOOTED,
                        f"{kernel} started on {vcpus} virtual CPUs in {r.seconds:.1f} s")
    if r.exited is not None or r.error:
        where = "after its first line" if STARTED in r.seen else "before it printed"
        return Decision(Accelerator.TCG, Basis.QEMU_FAILED,
                        f"booting {kernel}, {where}: {r.error or f'exit status {r.exited}'}")
    if STARTED in r.seen:
        return Decision(Accelerator.TCG, Basis.KERNEL_HUNG,
                        f"{kernel} printed its first line, then did not finish starting within {deadline_s:g} s")
    return Decision(Accelerator.TCG, Basis.KERNEL_SILENT, f"{kernel}: nothing within {deadline_s:g} s")


# Reading the registers waits on the virtual CPU's own thread, behind the reset that loads them into KVM.
_READ_REGISTERS = (b'{"execute": "qmp_capabilities"}\n'
                   b'{"execute": "human-monitor-command", "arguments": {"command-line": "info registers"}}\n')


def start_under_kvm(qemu: str, access: KvmAccess, deadline_s: float = PROBE_DEADLINE_S) -> Decision:
    """Without a kernel: can QEMU make its KVM virtual CPU at all? It starts paused (`-S`: no guest
    code runs, so this proves nothing about guests) and reads the CPU's reset registers through its
    monitor. A QEMU that fails before they come back means TCG; one that gets there leaves KVM unproven."""
    r = _run_under_kvm(qemu, ["-m", "16", "-S", "-serial", "none", "-qmp", "stdio"], (), (b"EAX=",), deadline_s,
                       _READ_REGISTERS)
    if r.seen:
        return Decision(Accelerator.KVM, Basis.UNPROVEN, f"no direct-boot image and no readable host kernel; "
                        f"QEMU starts under KVM, and {access}")
    if r.exited is not None or r.error:
        why = r.error or f"exit status {r.exited}"
    else:
        why = f"no registers within {deadline_s:g} s"
    return Decision(Accelerator.TCG, Basis.QEMU_FAILED, f"QEMU with no guest to boot: {why}")


def _read_file(cache_file: Path) -> dict[str, dict[str, str]]:
    try:
        data = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def _write_file(cache_file: Path, key: str, d: Decision, boot: str) -> None:
    """Keep `d` under `key` beside this boot's other entries; a write that fails costs only a re-probe."""
    data = {k: v for k, v in _read_file(cache_file).items() if k.startswith(f"{boot}:")}
    data[key] = {"accelerator": d.accelerator.value, "basis": d.basis.value, "detail": d.detail}
    tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(cache_file)  # whole or not at all: a builder and a runner may write at once
    except OSError:
        tmp.unlink(missing_ok=True)


def _from_file(cache_file: Path, key: str) -> Decision | None:
    entry = _read_file(cache_file).get(key)
    if entry is None:
        return None
    try:
        d = Decision(Accelerator(entry["accelerator"]), Basis(entry["basis"]), str(entry["detail"]), cached=True)
    except (TypeError, KeyError, ValueError):
        return None
    return d if d.basis.kept else None


def decide(kernel: Path | None = None, cache_file: Path | None = None, *, force: str | None = None,
           remember: bool = True, deadline_s: float = PROBE_DEADLINE_S) -> Decision:
    """The accelerator for this host's guests, and what the choice stands on (blocking).

    `kernel`: a Linux kernel to boot under KVM (else this host's, when readable). `cache_file`: where
    the verdict is kept for this boot (a file in the caller's state or cache directory; its
    directory must exist). `force`: "kvm" or "tcg" from the caller's configuration, which wins.
    `remember=False` reads what is kept but keeps nothing new (doctor, which may run as another user
    than the runner whose state directory it reads). Logs one warning when it falls back to TCG.
    """
    if force in tuple(Accelerator):
        return Decision(Accelerator(force), Basis.FORCED, f"{force} asked for")
    qemu = qemu_binary()
    if qemu is None:
        return Decision(Accelerator.TCG, Basis.NO_QEMU, f"none of {', '.join(QEMU_BINARIES)} is installed")
    access: KvmAccess = kvm_device_access(None)
    if not access.opens:
        return _said(Decision(Accelerator.TCG, Basis.NO_DEVICE, str(access)))
    boot = boot_id()
    key = f"{boot}:{qemu}:probe{PROBE_VERSION}"
    memo = (boot, qemu)
    if (d := _kept.get(memo)) is not None:
        return d
    if cache_file is not None and (d := _from_file(cache_file, key)) is not None:
        _kept[memo] = d
        return d
    kernel = kernel or host_kernel()
    if kernel is None:
        d = _said(start_under_kvm(qemu, access, deadline_s))
    else:
        d = _said(boot_kernel_under_kvm(qemu, kernel, deadline_s))
    if remember and d.basis.kept:
        _kept[memo] = Decision(d.accelerator, d.basis, d.detail, cached=True)
        if cache_file is not None:
            _write_file(cache_file, key, d, boot)
    return d


def _said(d: Decision) -> Decision:
    if d.accelerator is Accelerator.TCG:
        log.warning("KVM is not usable, guests run under TCG (much slower)", reason=d.reason)
    return d


async def choose_accelerator(cache_file: Path | None = None, *, kernel: Path | None = None,
                             force: str | None = None) -> Decision:
    """`decide` for async callers (the provider's start), in a worker thread."""
    return await asyncio.to_thread(decide, kernel, cache_file, force=force)
