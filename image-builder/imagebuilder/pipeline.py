"""The steps every image build shares: boot the build VM, wait for its guest channel, provision,
seal, shut down cleanly, convert to a compressed qcow2, and publish the image directory with its
manifest atomically (a runner reading the images dir never sees a half-written image)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from providers.manifest import MANIFEST_NAME, ImageManifest, ManifestError, dump_manifest, load_manifest

__all__ = ["dump_manifest"]

from . import proc
from .errors import BuildError
from .qga import ExecResult
from .vm import BuildVM

INPUTS_FILE = "build-inputs.json"


def log(msg: str) -> None:
    print(f"[image-builder] {msg}", file=sys.stderr, flush=True)


class GuestChannel(Protocol):
    """How provisioning reaches the guest: the QEMU guest agent, or WinRM for a Windows build."""

    def wait_ready(self, timeout: float) -> float: ...
    def run_script(self, shell: str, script: str, timeout: float = 120.0) -> ExecResult: ...
    def shutdown(self) -> None: ...


@dataclass(frozen=True)
class Script:
    name: str
    body: str
    timeout: float = 300.0
    report: bool = False  # its output goes to the build's log (a measurement)


@dataclass
class BootPlan:
    """What to do with the guest once it is up. `check` runs on the host after provisioning and
    before sealing (e.g. the linux-tiny console test). When `guest_powers_off`, the last seal
    script turns the machine off itself (sysprep), so the build only waits for QEMU to exit."""

    shell: str
    provision: list[Script]
    seal: list[Script]
    ready_timeout: float
    shutdown_timeout: float
    check: Callable[[BuildVM], None] | None = None
    guest_powers_off: bool = False
    timings: dict[str, float] = field(default_factory=dict)


def describe(plan: BootPlan, channel_name: str) -> list[str]:
    lines = [f"boot the build VM and wait for {channel_name} (up to {plan.ready_timeout:.0f} s)"]
    lines += [f"provision: {s.name} (timeout {s.timeout:.0f} s)" for s in plan.provision]
    if plan.check is not None:
        lines.append(f"check: {(plan.check.__doc__ or plan.check.__name__).strip().splitlines()[0]}")
    lines += [f"seal: {s.name} (timeout {s.timeout:.0f} s)" for s in plan.seal]
    how = "wait for the guest to power itself off" if plan.guest_powers_off else "shut the guest down"
    lines.append(f"{how} and wait for QEMU to exit (up to {plan.shutdown_timeout:.0f} s)")
    return lines


def boot_provision_seal(vm: BuildVM, channel: GuestChannel, plan: BootPlan) -> None:
    """Run the guest through the plan; on any failure the VM is killed and the error carries the
    tail of its serial console, which is where a guest that did not boot says why."""
    t0 = time.monotonic()
    try:
        with vm:
            log(f"booting ({vm.accel}): {vm.command_line()}")
            plan.timings["ready_s"] = channel.wait_ready(plan.ready_timeout)
            log(f"guest channel answered after {plan.timings['ready_s']:.1f} s")
            _run_scripts(channel, plan.shell, plan.provision)
            if plan.check is not None:
                plan.check(vm)
            _run_scripts(channel, plan.shell, plan.seal)
            if not plan.guest_powers_off:
                channel.shutdown()
            if not vm.wait_exit(plan.shutdown_timeout):
                raise BuildError(f"the guest did not power off within {plan.shutdown_timeout:.0f} s")
    except BuildError as e:
        tail = vm.serial_tail()
        qemu = vm.qemu_output()
        extra = f"\n--- serial console (tail) ---\n{tail}" if tail else ""
        extra += f"\n--- qemu ---\n{qemu}" if qemu else ""
        raise BuildError(f"{e}{extra}") from None
    plan.timings["vm_total_s"] = time.monotonic() - t0


def _run_scripts(channel: GuestChannel, shell: str, scripts: list[Script]) -> None:
    for script in scripts:
        t = time.monotonic()
        res = channel.run_script(shell, script.body, timeout=script.timeout)
        if res.exit_code != 0:
            # The output is the guest's, never the script body (which may carry a credential).
            output = (res.stderr or res.stdout).strip()[-800:]
            raise BuildError(f"step {script.name!r} failed with exit code {res.exit_code}: {output}")
        log(f"{script.name}: ok ({time.monotonic() - t:.1f} s)")
        if script.report and res.stdout.strip():
            log(f"{script.name}:\n{res.stdout.strip()[-2000:]}")


def convert_compressed(src: Path, src_format: str, dest: Path, *, compression: str = "zlib") -> None:
    """A compressed qcow2 of `src`. zstd (QEMU >= 5.1) compresses a desktop's disk 5x faster than
    zlib and smaller (measured on linux-desktop's 1.6 GB: 20 s against 107 s, 550 against 569 MB),
    and a machine reading its base image decompresses faster too."""
    tmp = dest.with_name(dest.name + ".part")
    proc.run(["qemu-img", "convert", "-c", "-f", src_format, "-O", "qcow2", "-o", f"compression_type={compression}",
              src, tmp], timeout=7200)
    os.replace(tmp, dest)


def inputs_digest(inputs: dict[str, object]) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def up_to_date(image_dir: Path, digest: str, key: str = "digest") -> ImageManifest | None:
    """The existing image when it was built from exactly these inputs and its files verify."""
    try:
        recorded = json.loads((image_dir / INPUTS_FILE).read_text())
        if recorded.get(key) != digest:
            return None
        return load_manifest(image_dir, verify_checksum=True)
    except (OSError, ValueError, ManifestError):
        return None


@contextlib.contextmanager
def build_lock(out: Path, name: str, timeout: float = 3600.0) -> Iterator[None]:
    """One build of an image per images dir at a time (setup.sh may run in several shells); a
    second build waits, then usually finds the image up to date."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f".{name}.lock", "w") as f:
        deadline = time.monotonic() + timeout
        waited = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited:
                    log(f"another build of {name} is running in {out}; waiting for it")
                    waited = True
                if time.monotonic() > deadline:
                    raise BuildError(f"another build of {name} in {out} held its lock for {timeout:.0f} s") from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def staging_dir(out: Path, name: str) -> Path:
    """A fresh `<out>/.building-*/<name>` directory: on the same filesystem as the final one, so
    publishing is a rename, and under the final name, so the manifest validates before that."""
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, os.stat(out).st_mode | 0o755)
    parent = Path(tempfile.mkdtemp(prefix=f".building-{name}-", dir=out))
    os.chmod(parent, 0o755)
    d = parent / name
    d.mkdir(mode=0o755)
    return d


def discard(staging: Path) -> None:
    shutil.rmtree(staging.parent, ignore_errors=True)


def record_quick_key(image_dir: Path, quick_key: str) -> None:
    """Remember a cheaper key for inputs already verified equal (apt lists touched, same packages)."""
    path = image_dir / INPUTS_FILE
    try:
        data = json.loads(path.read_text())
        data["quick_key"] = quick_key
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except (OSError, ValueError):
        pass


def publish(
    staging: Path, manifest: ImageManifest, inputs: dict[str, object], digest: str, quick_key: str | None = None
) -> Path:
    """Write the manifest and the inputs record, check the image validates, then swap it in."""
    record = {"digest": digest, "quick_key": quick_key, "inputs": inputs}
    (staging / INPUTS_FILE).write_text(json.dumps(record, indent=2, sort_keys=True))
    (staging / MANIFEST_NAME).write_text(dump_manifest(manifest))
    for p in staging.iterdir():
        os.chmod(p, 0o644)
    try:
        load_manifest(staging, verify_checksum=True)
    except ManifestError as e:
        raise BuildError(f"the image just built does not validate: {e}") from None
    final = staging.parent.parent / manifest.name
    if final.exists():
        os.replace(final, staging.parent / f"{manifest.name}.old")
    os.replace(staging, final)
    shutil.rmtree(staging.parent, ignore_errors=True)
    return final
