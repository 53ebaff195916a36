"""The libvirt/QEMU host checks `gh-runner doctor` prints (through `QemuProvider.host_checks`).

Each check returns one `HostCheck`, OK, WARN, FAIL or SKIP, with what it found and, when it
failed, the command that fixes it. They run in dependency order (`run_host_checks`) and a check
whose prerequisite failed says so instead of piling up confusing errors. They are blocking (run
them in a worker thread) and each bounds its waits.

`hostcheck.py` holds the facts these checks and the running provider share (the /dev/kvm check,
what QEMU's user may open, the slow-hypervisor notice), `accel.py` the accelerator decision; this
module holds the checks.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import secrets
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from providers.base import CheckLimits, CheckStatus, HostCheck
from providers.manifest import MANIFEST_NAME, DirectKernelBoot, ImageManifest, ManifestError, load_manifest
from providers.qemu.accel import Accelerator, Basis, decide, host_kernel
from providers.qemu.channels import routes_for
from providers.qemu.hostcheck import (
    KVM_DEVICE,
    KVM_DEVICE_FIX,
    QEMU_USER,
    KvmAccessStatus,
    kvm_device_access,
    may,
    user_ids,
)

T = TypeVar("T")

PROBE_PREFIX = "gh-doctor-"


@dataclass
class HostContext:
    """What the checks read, and what earlier checks learnt that later ones need."""

    libvirt_uri: str
    images_dir: Path
    limits: CheckLimits = field(default_factory=CheckLimits)
    conn: Any = None  # libvirt.virConnect once the libvirt check passed
    manifests: dict[str, ImageManifest] = field(default_factory=dict)
    accel_cache: Path | None = None  # where the runner keeps its accelerator verdict (providers/qemu/accel.py)

    @property
    def tcg_timeout(self) -> float:
        return self.limits.fallback_s

    @property
    def net_timeout(self) -> float:
        return self.limits.call_s


def _with_deadline(fn: Callable[[], T], timeout: float, what: str) -> T:
    """Run a blocking call (libvirt has no per-call timeout) in a daemon thread with a deadline."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=target, name=f"doctor-{what}", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"{what} did not answer within {timeout:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def check_libvirt(ctx: HostContext) -> HostCheck:
    import libvirt

    uri = ctx.libvirt_uri
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)  # errors come back as exceptions
    try:
        conn = _with_deadline(lambda: libvirt.open(uri), ctx.net_timeout, f"libvirt at {uri}")
        ver = conn.getLibVersion()
        hv = conn.getVersion()
    except (libvirt.libvirtError, TimeoutError) as e:
        msg = str(e)
        if "Permission denied" in msg:
            user = pwd.getpwuid(os.geteuid()).pw_name
            fix = f"usermod -aG libvirt {user}   # then log in again, or restart gh-runner"
        elif "No such file" in msg or "Connection refused" in msg or "Failed to connect" in msg:
            fix = "systemctl enable --now libvirtd   # hosts without systemd: libvirtd -d; virtlogd -d"
        else:
            fix = f"virsh -c '{uri}' version   # must answer; check libvirt_uri in the config"
        return HostCheck("libvirt", CheckStatus.FAIL, f"cannot reach libvirt at {uri}: {msg}", fix)
    ctx.conn = conn

    def dotted(v: int) -> str:
        return f"{v // 1_000_000}.{v // 1000 % 1000}.{v % 1000}"

    return HostCheck("libvirt", CheckStatus.OK, f"{uri} answers (libvirt {dotted(ver)}, QEMU {dotted(hv)})")


# A 512-byte real-mode boot sector: cli; ds=0; store a 4-byte nonce at physical 0x600; hlt forever.
# Seeing the nonce in guest memory proves TCG ran guest code through libvirt (see _probe_once).
def _boot_sector(nonce: bytes) -> bytes:
    code = bytes([0xFA, 0x31, 0xC0, 0x8E, 0xD8, 0xC7, 0x06, 0x00, 0x06]) + nonce[:2]
    code += bytes([0xC7, 0x06, 0x02, 0x06]) + nonce[2:4] + bytes([0xF4, 0xEB, 0xFD])
    return code.ljust(510, b"\0") + b"\x55\xaa"


@contextlib.contextmanager
def _probe_dir() -> Iterator[Path]:
    # qemu:///system runs QEMU as libvirt-qemu: the probe files need a path it can traverse.
    d = Path(tempfile.mkdtemp(prefix=PROBE_PREFIX, dir="/var/tmp"))
    try:
        d.chmod(0o755)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@dataclass
class ProbeResult:
    ran: bool
    seconds: float
    detail: str
    interrupted: bool = False  # the domain was stopped from outside before it could prove anything


def probe_tcg(conn: Any, kernel: Path | None, timeout: float) -> ProbeResult:
    """Boot a throwaway libvirt domain under TCG and watch for proof that guest code ran.

    Doctor runs it when the accelerator decision (providers/qemu/accel.py) is TCG: it does not
    judge KVM, it proves the path a machine takes (libvirtd, the libvirt-qemu user, file
    permissions) runs a guest under the accelerator the runner will use.

    A probe domain stopped from outside (an operator's or a test suite's cleanup of gh-* domains)
    proves nothing either way, so that case is tried again, up to three times.
    """
    result = ProbeResult(False, 0.0, "not run")
    for _ in range(3):
        result = _probe_once(conn, kernel, timeout)
        if not result.interrupted:
            break
    return result


def _probe_once(conn: Any, kernel: Path | None, timeout: float) -> ProbeResult:
    """One probe domain.

    With a Linux kernel (an image's, or this host's) the proof is "Linux version" on the serial
    port. Without one, a boot sector that writes a nonce into guest memory is proof enough: under
    TCG, code that runs at all runs a kernel too.
    """
    import libvirt

    name = f"{PROBE_PREFIX}tcg-{secrets.token_hex(4)}"
    nonce = secrets.token_bytes(4)
    with _probe_dir() as d:
        serial = d / "serial.log"
        serial.touch()
        serial.chmod(0o644)
        if kernel is not None:
            k = d / "vmlinuz"
            shutil.copyfile(kernel, k)  # a copy: libvirt relabels what it boots; leave the image alone
            k.chmod(0o644)
            boot = f"<kernel>{k}</kernel><cmdline>console=ttyS0 panic=-1</cmdline>"
            disk = ""
        else:
            img = d / "probe.img"
            img.write_bytes(_boot_sector(nonce))
            img.chmod(0o644)
            boot = "<boot dev='hd'/>"
            disk = (f"<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{img}'/>"
                    "<target dev='hda' bus='ide'/></disk>")
        xml = f"""<domain type='qemu'>
  <name>{name}</name><memory unit='MiB'>{256 if kernel else 16}</memory><vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type>{boot}</os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff><on_reboot>destroy</on_reboot><on_crash>destroy</on_crash>
  <devices>{disk}<serial type='file'><source path='{serial}'/><target port='0'/></serial>
    <memballoon model='none'/></devices>
</domain>"""
        t0 = time.monotonic()
        try:
            dom = _with_deadline(lambda: conn.createXML(xml, 0), 60, "starting the probe domain")
        except libvirt.libvirtError as e:
            return ProbeResult(False, 0.0, f"the probe domain did not start: {e}",
                               interrupted="terminating on signal" in str(e))
        try:
            while (elapsed := time.monotonic() - t0) < timeout:
                if kernel is not None:
                    if b"Linux version" in serial.read_bytes():
                        return ProbeResult(True, elapsed, "a Linux kernel booted")
                    if not dom_exists(conn, name):
                        return ProbeResult(False, elapsed, "the probe domain stopped before the kernel printed",
                                           interrupted=True)
                else:
                    try:
                        if dom.memoryPeek(0x600, 4, libvirt.VIR_MEMORY_PHYSICAL) == nonce:
                            return ProbeResult(True, elapsed, "a boot sector ran (no Linux image to boot)")
                    except libvirt.libvirtError as e:
                        if not dom_exists(conn, name):
                            return ProbeResult(False, elapsed, f"the probe domain stopped before it ran: {e}",
                                               interrupted=True)
                time.sleep(0.1)  # polling a file/guest memory: there is no event to wait on
            what = "print its first line" if kernel is not None else "run a boot sector"
            return ProbeResult(False, timeout, f"the guest did not {what} within {timeout:.0f} s")
        finally:
            with contextlib.suppress(libvirt.libvirtError):
                dom.destroy()


def dom_exists(conn: Any, name: str) -> bool:
    import libvirt

    try:
        conn.lookupByName(name)
        return True
    except libvirt.libvirtError:
        return False


def _probe_kernel(ctx: HostContext) -> Path | None:
    for name, m in sorted(ctx.manifests.items()):
        if isinstance(m.boot, DirectKernelBoot):
            return ctx.images_dir / name / m.boot.kernel
    return None


def check_kvm_device(ctx: HostContext) -> HostCheck:
    """/dev/kvm as the user QEMU runs as sees it (root can always open it, which proves nothing)."""
    access = kvm_device_access(QEMU_USER, KVM_DEVICE)
    if access.status is KvmAccessStatus.MISSING:
        return HostCheck("kvmdev", CheckStatus.SKIP, f"{access}: guests run under TCG (see the kvm check)")
    if access.status is KvmAccessStatus.NO_SUCH_USER:
        return HostCheck("kvmdev", CheckStatus.SKIP, str(access))
    if access.problem:
        return HostCheck("kvmdev", CheckStatus.FAIL, str(access), KVM_DEVICE_FIX)
    return HostCheck("kvmdev", CheckStatus.OK, str(access))


CAPS_CACHE = Path("/var/cache/libvirt/qemu/capabilities")
CAPS_SLOW_S = 2.0  # a cached capability query answers in tens of milliseconds


def _caps_cache_mtimes() -> dict[str, int]:
    try:
        return {p.name: p.stat().st_mtime_ns for p in CAPS_CACHE.glob("*.xml")}
    except OSError:
        return {}


def check_capabilities(ctx: HostContext) -> HostCheck:
    """libvirt's capability probing storm, named as such.

    libvirtd caches what each QEMU binary can do and re-probes QEMU (seconds) when it finds the
    cache stale. When it finds it stale on every call, as with a /dev/kvm its QEMU user cannot open,
    each query re-probes and rewrites the cache: that is the storm, and every createXML waits on it.
    The first query may legitimately re-probe once (after a QEMU upgrade), so the second one judges.
    """
    if ctx.conn is None:
        return HostCheck("caps", CheckStatus.SKIP, "libvirt unreachable (see above)")
    if not ctx.libvirt_uri.startswith("qemu:///system"):
        return HostCheck("caps", CheckStatus.SKIP, f"{ctx.libvirt_uri}: only the system daemon's cache is checked")
    times: list[float] = []
    mtimes = []
    for i in range(2):
        t0 = time.monotonic()
        try:
            _with_deadline(lambda: ctx.conn.getDomainCapabilities(None, None, None, None, 0), ctx.net_timeout * 4,
                           "a capability query")
        except TimeoutError as e:
            times.append(time.monotonic() - t0)
            mtimes.append(_caps_cache_mtimes())
            detail = f"{e} (query {i + 1})"
            break
        times.append(time.monotonic() - t0)
        mtimes.append(_caps_cache_mtimes())
    else:
        detail = ""
    rewritten = len(mtimes) == 2 and mtimes[0] and mtimes[0] != mtimes[1]
    slow = times[-1] >= CAPS_SLOW_S or bool(detail)
    if not slow and not rewritten:
        return HostCheck("caps", CheckStatus.OK,
                         f"capability queries answer from libvirt's cache ({times[-1] * 1000:.0f} ms)")
    what = detail or f"a capability query took {times[-1]:.1f} s"
    if rewritten:
        what += " and rewrote libvirt's capability cache"
    access = kvm_device_access(QEMU_USER, KVM_DEVICE)
    cause = str(access) if access.problem else ""
    fix = (f"{KVM_DEVICE_FIX}; then restart libvirtd" if cause else
           "restart libvirtd; if it goes on, set log_filters=\"1:qemu_capabilities\" in /etc/libvirt/libvirtd.conf "
           "and look for 'is not available now' in its log")
    return HostCheck("caps", CheckStatus.FAIL,
                     f"libvirt re-probes QEMU's capabilities on every call (a capability probing "
                     f"storm): {what}; every machine start waits as long" + (f"; cause: {cause}" if cause else ""), fix)


def check_kvm(ctx: HostContext) -> HostCheck:
    """The accelerator decision the runner makes (providers/qemu/accel.py, reading the runner's kept
    verdict when there is one), with what it stands on; when it is TCG, proof that TCG runs a guest
    through libvirt (libvirtd, the libvirt-qemu user, file permissions)."""
    if ctx.conn is None:
        return HostCheck("kvm", CheckStatus.SKIP, "libvirt unreachable (see above)")
    if not ctx.libvirt_uri.startswith("qemu"):
        return HostCheck("kvm", CheckStatus.SKIP, f"{ctx.libvirt_uri} is not a QEMU driver")
    kernel = _probe_kernel(ctx)
    d = decide(kernel, ctx.accel_cache, remember=False)
    again = (f"; to decide again: rm {ctx.accel_cache} and restart gh-runner"
             if d.cached and ctx.accel_cache is not None else "")
    if d.basis is Basis.UNPROVEN:
        return HostCheck("kvm", CheckStatus.WARN, f"{d}",
                         f"put an image with a Linux kernel (image-builder/build linux-tiny --out {ctx.images_dir}) "
                         "in the images directory, so the decision can boot it under KVM")
    if d.accelerator is Accelerator.KVM:
        return HostCheck("kvm", CheckStatus.OK, f"{d}")
    t = probe_tcg(ctx.conn, kernel or host_kernel(), ctx.tcg_timeout)
    fix = ("enable VT-x/AMD-V in the firmware, `modprobe kvm_intel` (or kvm_amd), make /dev/kvm "
           "crw-rw---- root:kvm with the runner's user in group kvm; on a VM enable nested virtualization" + again)
    if t.ran:
        return HostCheck("kvm", CheckStatus.WARN, f"{d}; the runner falls back to TCG (software emulation, "
                         f"several times slower; through libvirt {t.detail} in {t.seconds:.1f} s)", fix)
    return HostCheck("kvm", CheckStatus.FAIL, f"{d}; the TCG fallback does not run a guest either: {t.detail}",
                     "apt-get install --reinstall qemu-system-x86; see /var/log/libvirt/qemu/ for the probe's log")


def qemu_can_traverse(path: Path) -> tuple[bool, Path | None]:
    """Can libvirt-qemu reach `path`? Returns (ok, first directory that blocks it)."""
    ids = user_ids(QEMU_USER)
    if ids is None:
        return True, None  # another distro's QEMU user: cannot judge, do not cry wolf
    p = path.resolve()
    for d in [*reversed(p.parents), p]:
        try:
            st = d.stat()
        except OSError:
            return True, None  # missing: other checks say so
        if not may(ids, st, execute=True):
            return False, d
    return True, None


def check_images(ctx: HostContext) -> HostCheck:
    images = ctx.images_dir
    build = f"image-builder/build linux-tiny --out {images}"
    if not images.is_dir():
        return HostCheck("images", CheckStatus.FAIL, f"images directory {images} does not exist",
                     f"mkdir -p {images} && {build}")
    ok, blocker = qemu_can_traverse(images)
    if not ok:
        return HostCheck("images", CheckStatus.FAIL, f"{QEMU_USER} (the user QEMU runs as) cannot enter {blocker}; "
                     "machines would fail with 'Permission denied'", f"chmod o+x {blocker}   # or move the images")
    dirs = sorted(d for d in images.iterdir() if d.is_dir() and (d / MANIFEST_NAME).is_file())
    if not dirs:
        return HostCheck("images", CheckStatus.FAIL,
                         f"no images in {images} (no */{MANIFEST_NAME}): the runner has nothing to boot",
                     build)
    bad: list[str] = []
    good: list[str] = []
    for d in dirs:
        try:
            m = load_manifest(d, verify_checksum=True)
            routes_for(m)  # the provider refuses an image no guest channel can run: say so here too
        except ManifestError as e:
            bad.append(str(e))
            continue
        ctx.manifests[m.name] = m
        good.append(f"{m.name} {m.version}")
    if bad:
        return HostCheck("images", CheckStatus.FAIL, "; ".join(bad),
                     f"rebuild or re-copy the broken image (e.g. {build}), or remove its directory")
    return HostCheck("images", CheckStatus.OK, f"{len(good)} valid, checksums match: {', '.join(good)}")


SERVICE_USER = "gh-runner"  # the packaged service's user and group (systemd/gh-runner.sysusers)


def _can_read(st: os.stat_result, user: pwd.struct_passwd) -> bool:
    if user.pw_uid == 0:
        return True
    if st.st_uid == user.pw_uid:
        return bool(st.st_mode & stat.S_IRUSR)
    groups = {user.pw_gid} | {g.gr_gid for g in grp.getgrall() if user.pw_name in g.gr_mem}
    if st.st_gid in groups:
        return bool(st.st_mode & stat.S_IRGRP)
    return bool(st.st_mode & stat.S_IROTH)


def check_credentials(ctx: HostContext) -> HostCheck:
    """A WinRM image's credentials file must be readable by the runner and by nobody else: a build
    run with sudo leaves it root-only, and the runner then cannot give any machine its password."""
    refs = {m.name: m.winrm.credentials for m in ctx.manifests.values() if m.winrm is not None}
    if not refs:
        return HostCheck("creds", CheckStatus.SKIP, "no image uses WinRM credentials")
    try:
        runner = pwd.getpwnam(SERVICE_USER)  # the service reads them, whoever runs doctor
    except KeyError:
        runner = pwd.getpwuid(os.geteuid())
    problems: list[tuple[str, str]] = []
    for name, ref in sorted(refs.items()):
        path = ctx.images_dir / ref
        fix = f"chgrp {SERVICE_USER} {path} && chmod 0640 {path}"
        try:
            st = path.stat()
        except OSError as e:
            problems.append((f"{name}: credentials file {path}: {e.strerror or e}",
                             f"rebuild {name} with image-builder/build windows-10 --out {ctx.images_dir}"))
            continue
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o007:
            problems.append((f"{name}: credentials file {path} is mode {mode:04o}: every user can read it", fix))
        elif not _can_read(st, runner):
            owner = _name(pwd.getpwuid, st.st_uid)
            group = _name(grp.getgrgid, st.st_gid)
            problems.append((f"{name}: {runner.pw_name} cannot read the credentials file {path} "
                             f"({owner}:{group} {mode:04o})", fix))
    if problems:
        return HostCheck("creds", CheckStatus.FAIL, "; ".join(p for p, _ in problems),
                         "; ".join(f for _, f in problems))
    return HostCheck("creds", CheckStatus.OK,
                     f"credentials readable by {runner.pw_name} only: {', '.join(sorted(refs))}")


def _name(lookup: Callable[[int], Any], ident: int) -> str:
    try:
        return str(lookup(ident)[0])
    except KeyError:
        return str(ident)



def run_host_checks(ctx: HostContext) -> list[HostCheck]:
    """Every check in order (images before kvm: the probe boots an image's kernel if there is one).
    Never raises: a check that crashes is reported as failed, and the others still run."""
    steps: list[tuple[str, Callable[[HostContext], HostCheck]]] = [
        ("libvirt", check_libvirt), ("kvmdev", check_kvm_device), ("caps", check_capabilities),
        ("images", check_images), ("creds", check_credentials), ("kvm", check_kvm),
    ]
    results: list[HostCheck] = []
    try:
        for name, step in steps:
            try:
                results.append(step(ctx))
            except Exception as e:  # a bug in one check must not hide the others
                results.append(HostCheck(name, CheckStatus.FAIL, f"the check itself crashed: {type(e).__name__}: {e}"))
    finally:
        if ctx.conn is not None:
            with contextlib.suppress(Exception):
                ctx.conn.close()
            ctx.conn = None
    return results
