"""Which accelerator really runs a guest here: KVM when it executes code, else TCG.

`/dev/kvm` existing is not enough: under broken nested virtualisation a KVM guest can run its
(real/protected mode) firmware and still hang before a Linux kernel prints anything. So the probe
boots a real kernel (an image's direct-boot kernel) under KVM with the serial port on stdout and
waits briefly for "Linux version"; with no kernel at hand it falls back to SeaBIOS's banner on its
debug port, which is weaker and says so. The answer is cached in memory and in a file
keyed by the host's boot id (a reboot or a kernel change re-probes).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
from pathlib import Path

import structlog

log = structlog.get_logger("providers.qemu.accel")

QEMU_BINARIES = ("qemu-system-x86_64", "/usr/libexec/qemu-kvm")
PROBE_DEADLINE_S = 5.0
_cached: dict[str, tuple[str, str]] = {}


def _boot_id() -> str:
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


def _kvm_device_problem() -> str | None:
    if not os.path.exists("/dev/kvm"):
        return "/dev/kvm does not exist (no hardware virtualisation, or the kvm module is not loaded)"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "/dev/kvm is not accessible to this user"
    return None


def _read_cache(cache_file: Path) -> dict[str, str]:
    try:
        data = json.loads(cache_file.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(cache_file: Path, data: dict[str, str]) -> None:
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        cache_file.write_text(json.dumps(data))
    except OSError:
        pass


async def probe_kvm(kernel: Path | None = None, deadline_s: float = PROBE_DEADLINE_S) -> tuple[bool, str]:
    """(works, reason). Boots a kernel (or only firmware) under KVM and waits for it to print."""
    problem = await asyncio.to_thread(_kvm_device_problem)
    if problem:
        return False, problem
    binary = qemu_binary()
    if binary is None:
        return False, "qemu-system-x86_64 is not installed"
    argv = [binary, "-accel", "kvm", "-machine", "pc", "-nodefaults", "-no-user-config", "-display", "none",
            "-monitor", "none", "-no-reboot"]
    if kernel is not None:
        argv += ["-m", "128", "-kernel", str(kernel), "-serial", "stdio",
                 "-append", "console=ttyS0 earlyprintk=serial,ttyS0,115200 panic=-1"]
        marks: tuple[bytes, ...] = (b"Linux version",)
    else:
        argv += ["-m", "16", "-serial", "none", "-chardev", "stdio,id=dbg",
                 "-device", "isa-debugcon,iobase=0x402,chardev=dbg"]
        marks = (b"SeaBIOS",)
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )
    assert proc.stdout is not None
    seen = b""
    killed = False
    try:
        async with asyncio.timeout(deadline_s):
            while not any(m in seen for m in marks):
                chunk = await proc.stdout.read(4096)
                if not chunk:
                    break
                seen += chunk
    except TimeoutError:
        pass
    finally:
        if proc.returncode is None:
            killed = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        err = b""
        try:
            async with asyncio.timeout(5):
                _, err = await proc.communicate()
        except TimeoutError:
            pass
    if any(m in seen for m in marks):
        if kernel is None:
            return True, "a KVM guest ran its firmware (no kernel to probe with: a weaker check)"
        return True, "a KVM guest booted a kernel"
    detail = [ln for ln in err.decode(errors="replace").strip().splitlines() if "warning" not in ln]
    if killed or not detail:
        why = f"no {'kernel' if kernel else 'firmware'} output within {deadline_s:g}s (nested KVM not working?)"
    else:
        why = detail[-1]
    return False, f"KVM did not run a guest: {why}"


async def choose_accelerator(cache_file: Path | None = None, *, kernel: Path | None = None,
                             force: str | None = None) -> tuple[str, str]:
    """("kvm" | "tcg", reason); logs one warning when falling back to TCG."""
    if force in ("kvm", "tcg"):
        return force, f"forced by configuration ({force})"
    # A firmware-only answer is weaker than a kernel boot: never let it stand in for one.
    key = f"{_boot_id()}:{'kernel' if kernel is not None else 'firmware'}"
    if key in _cached:
        return _cached[key]
    if cache_file is not None:
        data = await asyncio.to_thread(_read_cache, cache_file)
        if data.get("key") == key and data.get("accelerator") in ("kvm", "tcg"):
            _cached[key] = (data["accelerator"], data.get("reason", "cached"))
            return _cached[key]
    works, reason = await probe_kvm(kernel)
    result = ("kvm" if works else "tcg", reason)
    if not works:
        log.warning("KVM is not usable, guests run under TCG (much slower)", reason=reason)
    _cached[key] = result
    if cache_file is not None:
        await asyncio.to_thread(_write_cache, cache_file, {"key": key, "accelerator": result[0], "reason": reason})
    return result
