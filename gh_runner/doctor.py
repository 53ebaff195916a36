"""`gh-runner doctor`: is this host ready to run attempts, and if not, what to type to fix it.

Each check prints one line, `OK`, `WARN` or `FAIL`, with what it found; a failure adds the command
that fixes it. The exit code is 1 when any check failed (warnings alone exit 0: a TCG-only host
works, slowly). Checks run in dependency order and a check whose prerequisite failed says so
instead of piling up confusing errors.

Nothing here prints the token: the server check reports only the HTTP status or close code.
"""

from __future__ import annotations

import contextlib
import email.utils
import grp
import os
import pwd
import secrets
import shutil
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol, TextIO, TypeVar
from urllib.parse import urlsplit, urlunsplit

from gh_runner.config import is_loopback
from providers.manifest import MANIFEST_NAME, DirectKernelBoot, ImageManifest, ManifestError, load_manifest
from providers.qemu.channels import routes_for
from providers.qemu.hostcheck import (
    KVM_DEVICE,
    KVM_DEVICE_FIX,
    QEMU_USER,
    describe_mode,
    kvm_device_problem,
    may,
    user_ids,
)

T = TypeVar("T")
Status = Literal["OK", "WARN", "FAIL", "SKIP"]

GIB = 1024**3
MIB = 1024**2
# What one slot may write besides its memory image: overlay growth of one attempt (Windows updates,
# installers and page file make it large) plus a saved start state's disk delta.
OVERLAY_RESERVE = {"windows": 12 * GIB, "linux": 1 * GIB}
CLOCK_SKEW_FAIL = 30.0  # seconds; beyond this TLS, token lifetimes and result timestamps go wrong
PROBE_PREFIX = "gh-doctor-"


class DoctorConfig(Protocol):
    """What doctor reads from the runner config (`gh_runner.config.RunnerConfig` has all of it)."""

    @property
    def server(self) -> str | None: ...
    @property
    def token(self) -> Any: ...  # pydantic SecretStr or None
    @property
    def token_file(self) -> Path | None: ...
    @property
    def slots(self) -> int: ...
    @property
    def images_dir(self) -> Path: ...
    @property
    def state_dir(self) -> Path: ...
    @property
    def libvirt_uri(self) -> str: ...


@dataclass
class Check:
    name: str
    status: Status
    detail: str
    fix: str | None = None


@dataclass
class Context:
    """What earlier checks learnt that later ones need."""

    config: DoctorConfig
    conn: Any = None  # libvirt.virConnect once the libvirt check passed
    manifests: dict[str, ImageManifest] = field(default_factory=dict)
    kvm_timeout: float = 20.0
    tcg_timeout: float = 60.0
    net_timeout: float = 15.0


def _secret(token: Any) -> str | None:
    if token is None:
        return None
    getter = getattr(token, "get_secret_value", None)
    return str(getter() if getter else token)


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


# ---------------------------------------------------------------------------------------------
# libvirt
# ---------------------------------------------------------------------------------------------


def check_libvirt(ctx: Context) -> Check:
    import libvirt

    uri = ctx.config.libvirt_uri
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
        return Check("libvirt", "FAIL", f"cannot reach libvirt at {uri}: {msg}", fix)
    ctx.conn = conn

    def dotted(v: int) -> str:
        return f"{v // 1_000_000}.{v // 1000 % 1000}.{v % 1000}"

    return Check("libvirt", "OK", f"{uri} answers (libvirt {dotted(ver)}, QEMU {dotted(hv)})")


# A 512-byte real-mode boot sector: cli; ds=0; store a 4-byte nonce at physical 0x600; hlt forever.
# Seeing the nonce in guest memory proves the accelerator ran guest code.
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


def probe_accelerator(conn: Any, accel: Literal["kvm", "tcg"], kernel: Path | None, timeout: float) -> ProbeResult:
    """Boot a throwaway libvirt domain under `accel` and watch for proof that guest code ran.

    Doctor uses it for the TCG fallback: the KVM decision itself is the provider's
    (`providers.qemu.accel.probe_kvm`), so there is one judge of KVM. This proves the whole path
    a machine takes (libvirtd, the libvirt-qemu user, file permissions) actually runs a guest.

    A probe domain stopped from outside (an operator's or a test suite's cleanup of gh-* domains)
    proves nothing either way, so that case is tried again, up to three times.
    """
    result = ProbeResult(False, 0.0, "not run")
    for _ in range(3):
        result = _probe_once(conn, accel, kernel, timeout)
        if not result.interrupted:
            break
    return result


def _probe_once(conn: Any, accel: Literal["kvm", "tcg"], kernel: Path | None, timeout: float) -> ProbeResult:
    """One probe domain.

    With a Linux kernel (a direct-kernel image's), the proof is "Linux version" on the serial
    port: nested KVM can run a boot sector yet hang in the kernel, which is what the runner boots.
    Without one, a boot sector that writes a nonce into guest memory is the best we have.
    """
    import libvirt

    name = f"{PROBE_PREFIX}{accel}-{secrets.token_hex(4)}"
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
        xml = f"""<domain type='{"kvm" if accel == "kvm" else "qemu"}'>
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


def _probe_kernel(ctx: Context) -> Path | None:
    for name, m in sorted(ctx.manifests.items()):
        if isinstance(m.boot, DirectKernelBoot):
            return ctx.config.images_dir / name / m.boot.kernel
    return None


def check_kvm_device(ctx: Context) -> Check:
    """/dev/kvm as the user QEMU runs as sees it (root can always open it, which proves nothing)."""
    if not KVM_DEVICE.exists():
        return Check("kvmdev", "SKIP", f"no {KVM_DEVICE}: guests run under TCG (see the kvm check)")
    problem = kvm_device_problem(QEMU_USER, KVM_DEVICE)
    if problem:
        return Check("kvmdev", "FAIL", problem, KVM_DEVICE_FIX)
    return Check("kvmdev", "OK", f"{KVM_DEVICE} is {describe_mode(KVM_DEVICE)}: {QEMU_USER} can open it")


CAPS_CACHE = Path("/var/cache/libvirt/qemu/capabilities")
CAPS_SLOW_S = 2.0  # a cached capability query answers in tens of milliseconds


def _caps_cache_mtimes() -> dict[str, int]:
    try:
        return {p.name: p.stat().st_mtime_ns for p in CAPS_CACHE.glob("*.xml")}
    except OSError:
        return {}


def check_capabilities(ctx: Context) -> Check:
    """libvirt's capability probing storm, named as such.

    libvirtd caches what each QEMU binary can do and re-probes QEMU (seconds) when it finds the
    cache stale. When it finds it stale on every call, as with a /dev/kvm its QEMU user cannot open,
    each query re-probes and rewrites the cache: that is the storm, and every createXML waits on it.
    The first query may legitimately re-probe once (after a QEMU upgrade), so the second one judges.
    """
    if ctx.conn is None:
        return Check("caps", "SKIP", "libvirt unreachable (see above)")
    if not ctx.config.libvirt_uri.startswith("qemu:///system"):
        return Check("caps", "SKIP", f"{ctx.config.libvirt_uri}: only the system daemon's cache is checked")
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
        return Check("caps", "OK", f"capability queries answer from libvirt's cache ({times[-1] * 1000:.0f} ms)")
    what = detail or f"a capability query took {times[-1]:.1f} s"
    if rewritten:
        what += " and rewrote libvirt's capability cache"
    cause = kvm_device_problem(QEMU_USER, KVM_DEVICE)
    fix = (f"{KVM_DEVICE_FIX}; then restart libvirtd" if cause else
           "restart libvirtd; if it goes on, set log_filters=\"1:qemu_capabilities\" in /etc/libvirt/libvirtd.conf "
           "and look for 'is not available now' in its log")
    return Check("caps", "FAIL", f"libvirt re-probes QEMU's capabilities on every call (a capability probing "
                 f"storm): {what}; every machine start waits as long" + (f"; cause: {cause}" if cause else ""), fix)


def check_kvm(ctx: Context) -> Check:
    """KVM as the runner will judge it (the provider's own probe, so doctor and the runner agree);
    when it fails, prove the TCG fallback really runs a guest through libvirt."""
    if ctx.conn is None:
        return Check("kvm", "SKIP", "libvirt unreachable (see above)")
    if not ctx.config.libvirt_uri.startswith("qemu"):
        return Check("kvm", "SKIP", f"{ctx.config.libvirt_uri} is not a QEMU driver")
    import asyncio

    from providers.qemu.accel import probe_kvm

    kernel = _probe_kernel(ctx)
    t0 = time.monotonic()
    works, reason = asyncio.run(probe_kvm(kernel, ctx.kvm_timeout))
    if works:
        return Check("kvm", "OK", f"{reason} in {time.monotonic() - t0:.1f} s")
    t = probe_accelerator(ctx.conn, "tcg", kernel, ctx.tcg_timeout)
    fix = ("enable VT-x/AMD-V in the firmware, `modprobe kvm_intel` (or kvm_amd), make /dev/kvm "
           "crw-rw---- root:kvm with the runner's user in group kvm; on a VM enable nested virtualization")
    if t.ran:
        return Check("kvm", "WARN", f"{reason}; the runner falls back to TCG (software emulation, "
                     f"several times slower; through libvirt {t.detail} in {t.seconds:.1f} s)", fix)
    return Check("kvm", "FAIL", f"{reason}; the TCG fallback does not run a guest either: {t.detail}",
                 "apt-get install --reinstall qemu-system-x86; see /var/log/libvirt/qemu/ for the probe's log")


# ---------------------------------------------------------------------------------------------
# Files: images, disk space, state dir
# ---------------------------------------------------------------------------------------------


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


def check_images(ctx: Context) -> Check:
    images = ctx.config.images_dir
    build = f"image-builder/build linux-tiny --out {images}"
    if not images.is_dir():
        return Check("images", "FAIL", f"images directory {images} does not exist",
                     f"mkdir -p {images} && {build}")
    ok, blocker = qemu_can_traverse(images)
    if not ok:
        return Check("images", "FAIL", f"{QEMU_USER} (the user QEMU runs as) cannot enter {blocker}; "
                     "machines would fail with 'Permission denied'", f"chmod o+x {blocker}   # or move the images")
    dirs = sorted(d for d in images.iterdir() if d.is_dir() and (d / MANIFEST_NAME).is_file())
    if not dirs:
        return Check("images", "FAIL", f"no images in {images} (no */{MANIFEST_NAME}): the runner has nothing to boot",
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
        return Check("images", "FAIL", "; ".join(bad),
                     f"rebuild or re-copy the broken image (e.g. {build}), or remove its directory")
    return Check("images", "OK", f"{len(good)} valid, checksums match: {', '.join(good)}")


def slot_bytes(manifests: dict[str, ImageManifest]) -> int:
    """Disk one slot may need: overlay growth plus a saved memory image, for the largest image."""
    if not manifests:
        return OVERLAY_RESERVE["linux"]
    return max(OVERLAY_RESERVE.get(m.os, GIB) + m.memory_mib * MIB for m in manifests.values())


def check_disk(ctx: Context) -> Check:
    where = ctx.config.state_dir
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    per_slot = slot_bytes(ctx.manifests)
    slots = ctx.config.slots
    need = per_slot * slots
    detail = (f"{usage.free / GIB:.1f} GiB free on the filesystem of {where}; {slots} slot(s) x "
              f"{per_slot / GIB:.1f} GiB = {need / GIB:.1f} GiB")
    if usage.free >= need:
        return Check("disk", "OK", detail)
    fits = usage.free // per_slot
    fix = (f"free space under {probe}, or set slots: {fits} in the config" if fits >= 1
           else f"free at least {(need - usage.free) / GIB:.1f} GiB under {probe}")
    return Check("disk", "FAIL", f"not enough: {detail}", fix)


def _writable(d: Path) -> str | None:
    try:
        fd, tmp = tempfile.mkstemp(prefix=".doctor-", dir=d)
        os.close(fd)
        os.unlink(tmp)
        return None
    except OSError as e:
        return e.strerror or str(e)


def _token_paths(ctx: Context) -> list[Path]:
    paths = []
    if ctx.config.token_file is not None:
        paths.append(Path(ctx.config.token_file))
    cred = os.environ.get("CREDENTIALS_DIRECTORY")
    if cred:
        paths.append(Path(cred) / "gh-runner-token")
    service_token = Path("/etc/gh-runner/token")
    if service_token.exists():
        paths.append(service_token)
    return paths


def check_state(ctx: Context) -> Check:
    state = ctx.config.state_dir
    user = pwd.getpwuid(os.geteuid()).pw_name
    own = f"install -d -o {user} -m 0755 {state}"
    if state.exists() and not state.is_dir():
        return Check("state", "FAIL", f"state dir {state} is not a directory", f"rm {state} && {own}")
    target = state
    if not state.exists():  # the runner creates it: the nearest existing parent must be writable
        target = state.parent
        while not target.exists() and target != target.parent:
            target = target.parent
    err = _writable(target)
    if err:
        what = state if target == state else f"{target} (to create {state})"
        return Check("state", "FAIL", f"state dir not writable by {user}: {what}: {err}",
                     f"chown -R {user} {state}" if target == state else own)
    ok, blocker = qemu_can_traverse(target)
    if not ok:
        return Check("state", "FAIL", f"{QEMU_USER} cannot enter {blocker}: overlays under {state} would not boot",
                     f"chmod o+x {blocker}")
    problems = []
    for tp in _token_paths(ctx):
        try:
            mode = stat.S_IMODE(tp.stat().st_mode)
        except OSError as e:
            problems.append((f"token file {tp}: {e.strerror or e}", f"ls -l {tp}"))
            continue
        if mode & 0o077:
            problems.append((f"token file {tp} is mode {mode:04o}: other users can read the runner token",
                             f"chmod 600 {tp}"))
    if problems:
        return Check("state", "FAIL", "; ".join(p for p, _ in problems), "; ".join(f for _, f in problems))
    note = "" if state.exists() else " (will be created)"
    return Check("state", "OK", f"{state} writable{note}; token file permissions fine")


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


def check_credentials(ctx: Context) -> Check:
    """A WinRM image's credentials file must be readable by the runner and by nobody else: a build
    run with sudo leaves it root-only, and the runner then cannot give any machine its password."""
    refs = {m.name: m.winrm.credentials for m in ctx.manifests.values() if m.winrm is not None}
    if not refs:
        return Check("creds", "SKIP", "no image uses WinRM credentials")
    try:
        runner = pwd.getpwnam(SERVICE_USER)  # the service reads them, whoever runs doctor
    except KeyError:
        runner = pwd.getpwuid(os.geteuid())
    problems: list[tuple[str, str]] = []
    for name, ref in sorted(refs.items()):
        path = ctx.config.images_dir / ref
        fix = f"chgrp {SERVICE_USER} {path} && chmod 0640 {path}"
        try:
            st = path.stat()
        except OSError as e:
            problems.append((f"{name}: credentials file {path}: {e.strerror or e}",
                             f"rebuild {name} with image-builder/build windows-10 --out {ctx.config.images_dir}"))
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
        return Check("creds", "FAIL", "; ".join(p for p, _ in problems), "; ".join(f for _, f in problems))
    return Check("creds", "OK", f"credentials readable by {runner.pw_name} only: {', '.join(sorted(refs))}")


def _name(lookup: Callable[[int], Any], ident: int) -> str:
    try:
        return str(lookup(ident)[0])
    except KeyError:
        return str(ident)


# ---------------------------------------------------------------------------------------------
# Control plane: reachable, token accepted, clock
# ---------------------------------------------------------------------------------------------


def _connect_url(server: str) -> str:
    # RunnerConfig already normalises; a bare ws://host:port from elsewhere gets the runner path.
    u = urlsplit(server)
    scheme = {"https": "wss", "http": "ws"}.get(u.scheme, u.scheme)
    path = u.path if u.path not in ("", "/") else "/v1/runners/connect"
    return urlunsplit((scheme, u.netloc, path, u.query, ""))


def _http_base(ws_url: str) -> str:
    u = urlsplit(ws_url)
    return urlunsplit(("https" if u.scheme == "wss" else "http", u.netloc, "", "", ""))


@dataclass
class ServerProbe:
    date: datetime | None = None
    rtt: float = 0.0


def check_server(ctx: Context, probe: ServerProbe) -> Check:
    import httpx
    from websockets.exceptions import InvalidStatus, WebSocketException
    from websockets.sync.client import connect

    if not ctx.config.server:
        return Check("server", "WARN", "no server configured (fine for `gh-runner local`)",
                     "set server: wss://HOST in /etc/gh-runner/config.yaml")
    server = _connect_url(ctx.config.server.split(",")[0])  # the first of several: the one a runner tries first
    base = _http_base(server)
    t0 = time.monotonic()
    try:
        r = httpx.get(f"{base}/healthz", timeout=ctx.net_timeout, follow_redirects=False)
    except httpx.HTTPError as e:
        return Check("server", "FAIL", f"{base} unreachable: {type(e).__name__}: {e}",
                     f"curl -sS {base}/healthz   # check DNS, firewall, proxy and that gh-server is running")
    probe.rtt = time.monotonic() - t0
    date = r.headers.get("date")
    if date:
        with contextlib.suppress(TypeError, ValueError):
            probe.date = email.utils.parsedate_to_datetime(date)
    token = _secret(ctx.config.token)
    if not token:
        return Check("server", "FAIL", f"{base} answers (HTTP {r.status_code}) but no runner token is configured",
                     "put the token in /etc/gh-runner/token (chmod 600), or pass --token-file")
    try:
        with connect(server, additional_headers={"Authorization": f"Bearer {token}"},
                     open_timeout=ctx.net_timeout, close_timeout=2,
                     proxy=None if is_loopback(urlsplit(server).hostname or "") else True) as ws:  # as the session
            # A server may accept the handshake and then close with 4001 for a revoked token. We
            # never send hello, so a runner already connected with this token is not displaced.
            try:
                ws.recv(timeout=1.0)
            except TimeoutError:
                pass
            except WebSocketException:
                code = ws.close_code
                if code == 4001:
                    return Check("server", "FAIL", f"{server}: token refused (close code 4001: unknown or revoked)",
                                 "issue a new runner token on the control plane and write it to /etc/gh-runner/token")
    except InvalidStatus as e:
        status = e.response.status_code
        if status in (401, 403):
            return Check("server", "FAIL", f"{server}: token refused (HTTP {status})",
                         "issue a new runner token on the control plane and write it to /etc/gh-runner/token")
        return Check("server", "FAIL", f"{server}: websocket handshake refused with HTTP {status}",
                     f"check the URL path (runners connect to /v1/runners/connect) and any proxy in front of {base}")
    except (OSError, TimeoutError, WebSocketException) as e:
        return Check("server", "FAIL", f"{server}: websocket handshake failed: {type(e).__name__}: {e}",
                     "a reverse proxy must pass websocket upgrades (Upgrade/Connection headers)")
    return Check("server", "OK", f"{base} reachable in {probe.rtt * 1000:.0f} ms; token accepted")


def check_clock(probe: ServerProbe) -> Check:
    if probe.date is None:
        return Check("clock", "SKIP", "no Date header from the server to compare with")
    # The server stamped Date somewhere within the round trip, with one-second resolution.
    now = datetime.now(UTC).timestamp() - probe.rtt / 2
    skew = now - probe.date.timestamp()
    if abs(skew) <= CLOCK_SKEW_FAIL:
        return Check("clock", "OK", f"within {max(abs(skew), 1):.0f} s of the server's clock")
    return Check("clock", "FAIL", f"this host's clock is {skew:+.0f} s off the server's",
                 "timedatectl set-ntp true   # or install chrony / systemd-timesyncd")


# ---------------------------------------------------------------------------------------------


def run_checks(ctx: Context, out: TextIO) -> list[Check]:
    results: list[Check] = []

    def report(c: Check) -> None:
        results.append(c)
        detail = " ".join(c.detail.split())  # libvirt errors span lines; keep one line per check
        out.write(f"{c.status:<5} {c.name:<8} {detail}\n")
        if c.fix and c.status in ("FAIL", "WARN"):
            out.write(f"{'':<14} fix: {c.fix}\n")
        out.flush()

    probe = ServerProbe()
    steps: list[tuple[str, Callable[[], Check]]] = [
        ("libvirt", lambda: check_libvirt(ctx)),
        ("kvmdev", lambda: check_kvm_device(ctx)),
        ("caps", lambda: check_capabilities(ctx)),
        ("images", lambda: check_images(ctx)),  # before kvm: the probe boots an image's kernel if there is one
        ("creds", lambda: check_credentials(ctx)),
        ("kvm", lambda: check_kvm(ctx)),
        ("disk", lambda: check_disk(ctx)),
        ("state", lambda: check_state(ctx)),
        ("server", lambda: check_server(ctx, probe)),
        ("clock", lambda: check_clock(probe)),
    ]
    for name, step in steps:
        try:
            report(step())
        except Exception as e:  # a bug in one check must not hide the others
            report(Check(name, "FAIL", f"the check itself crashed: {type(e).__name__}: {e}"))
    if ctx.conn is not None:
        with contextlib.suppress(Exception):
            ctx.conn.close()
    return results


def main(config: DoctorConfig, *, out: TextIO | None = None, kvm_timeout: float = 20.0,
         tcg_timeout: float = 60.0, net_timeout: float = 15.0) -> int:
    """Run every check, print the report, return the process exit code (0 ok, 1 something failed)."""
    out = sys.stdout if out is None else out
    ctx = Context(config, kvm_timeout=kvm_timeout, tcg_timeout=tcg_timeout, net_timeout=net_timeout)
    results = run_checks(ctx, out)
    failed = [c.name for c in results if c.status == "FAIL"]
    warned = [c.name for c in results if c.status == "WARN"]
    if failed:
        out.write(f"\n{len(failed)} check(s) failed: {', '.join(failed)}\n")
        return 1
    out.write("\nready" + (f" (warnings: {', '.join(warned)})" if warned else "") + "\n")
    return 0
