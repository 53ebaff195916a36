"""`gh-runner doctor`: is this host ready to run attempts, and if not, what to type to fix it.

Each check prints one line, `OK`, `WARN` or `FAIL`, with what it found; a failure adds the command
that fixes it. The exit code is 1 when any check failed (warnings alone exit 0: a TCG-only host
works, slowly). Checks run in dependency order and a check whose prerequisite failed says so
instead of piling up confusing errors.

The provider reports its own host (for QEMU: libvirt, /dev/kvm as QEMU's user sees it, capability
probing, the images, and the accelerator decision the runner makes, with what it stands on:
`Provider.host_checks`, providers/qemu/hostchecks.py, providers/qemu/accel.py); this module adds
the runner's own checks (disk, state dir, server, clock) and prints them all.

Nothing here prints the token: the server check reports only the HTTP status or close code.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import os
import pwd
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TextIO
from urllib.parse import urlsplit, urlunsplit

from gh_runner import diskguard
from gh_runner.config import is_loopback
from providers.base import CheckLimits, CheckStatus, Provider
from providers.base import HostCheck as Check
from providers.manifest import MANIFEST_NAME, ImageManifest, ManifestError, load_manifest
from providers.qemu.hostcheck import QEMU_USER
from providers.qemu.hostchecks import qemu_can_traverse

GIB = 1024**3
MIB = 1024**2
# What one slot may write besides its memory image: overlay growth of one attempt (Windows updates,
# installers and page file make it large) plus a saved start state's disk delta.
OVERLAY_RESERVE = {"windows": 12 * GIB, "linux": 1 * GIB}
CLOCK_SKEW_FAIL = 30.0  # seconds; beyond this TLS, token lifetimes and result timestamps go wrong


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
    @property
    def disk_reserve_mib(self) -> int: ...


@dataclass
class Context:
    """What the runner's checks read."""

    config: DoctorConfig
    manifests: dict[str, ImageManifest] = field(default_factory=dict)  # for the disk a slot needs
    net_timeout: float = 15.0


def _secret(token: Any) -> str | None:
    if token is None:
        return None
    getter = getattr(token, "get_secret_value", None)
    return str(getter() if getter else token)


# ---------------------------------------------------------------------------------------------
# Files: images, disk space, state dir
# ---------------------------------------------------------------------------------------------


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
    if usage.free < need:
        fits = usage.free // per_slot
        fix = (f"free space under {probe}, or set slots: {fits} in the config" if fits >= 1
               else f"free at least {(need - usage.free) / GIB:.1f} GiB under {probe}")
        return Check("disk", CheckStatus.FAIL, f"not enough: {detail}", fix)
    configured = ctx.config.disk_reserve_mib * MIB
    reserve = diskguard.reserve_bytes(probe, configured)
    if reserve < configured:
        # The runner still runs here (the reserve scales down), but a guest that fills its overlay
        # fills the journal's disk too: worth a warning, not a failure.
        return Check("disk", CheckStatus.WARN,
                     f"{detail}; the filesystem ({usage.total / GIB:.1f} GiB) is small: the runner keeps "
                     f"{reserve // MIB} MiB free, not the configured disk_reserve_mib {configured // MIB}",
                     f"put the state dir on a filesystem of at least {configured * 10 / GIB:.0f} GiB")
    return Check("disk", CheckStatus.OK, detail)


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
        return Check("state", CheckStatus.FAIL, f"state dir {state} is not a directory", f"rm {state} && {own}")
    target = state
    if not state.exists():  # the runner creates it: the nearest existing parent must be writable
        target = state.parent
        while not target.exists() and target != target.parent:
            target = target.parent
    err = _writable(target)
    if err:
        what = state if target == state else f"{target} (to create {state})"
        return Check("state", CheckStatus.FAIL, f"state dir not writable by {user}: {what}: {err}",
                     f"chown -R {user} {state}" if target == state else own)
    ok, blocker = qemu_can_traverse(target)
    if not ok:
        return Check("state", CheckStatus.FAIL,
                     f"{QEMU_USER} cannot enter {blocker}: overlays under {state} would not boot",
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
        return Check("state", CheckStatus.FAIL, "; ".join(p for p, _ in problems), "; ".join(f for _, f in problems))
    note = "" if state.exists() else " (will be created)"
    return Check("state", CheckStatus.OK, f"{state} writable{note}; token file permissions fine")


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
        return Check("server", CheckStatus.WARN, "no server configured (fine for `gh-runner local`)",
                     "set server: wss://HOST in /etc/gh-runner/config.yaml")
    server = _connect_url(ctx.config.server.split(",")[0])  # the first of several: the one a runner tries first
    base = _http_base(server)
    t0 = time.monotonic()
    try:
        r = httpx.get(f"{base}/healthz", timeout=ctx.net_timeout, follow_redirects=False)
    except httpx.HTTPError as e:
        return Check("server", CheckStatus.FAIL, f"{base} unreachable: {type(e).__name__}: {e}",
                     f"curl -sS {base}/healthz   # check DNS, firewall, proxy and that gh-server is running")
    probe.rtt = time.monotonic() - t0
    date = r.headers.get("date")
    if date:
        with contextlib.suppress(TypeError, ValueError):
            probe.date = email.utils.parsedate_to_datetime(date)
    token = _secret(ctx.config.token)
    if not token:
        return Check("server", CheckStatus.FAIL,
                     f"{base} answers (HTTP {r.status_code}) but no runner token is configured",
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
                    return Check("server", CheckStatus.FAIL,
                                 f"{server}: token refused (close code 4001: unknown or revoked)",
                                 "issue a new runner token on the control plane and write it to /etc/gh-runner/token")
    except InvalidStatus as e:
        status = e.response.status_code
        if status in (401, 403):
            return Check("server", CheckStatus.FAIL, f"{server}: token refused (HTTP {status})",
                         "issue a new runner token on the control plane and write it to /etc/gh-runner/token")
        return Check("server", CheckStatus.FAIL, f"{server}: websocket handshake refused with HTTP {status}",
                     f"check the URL path (runners connect to /v1/runners/connect) and any proxy in front of {base}")
    except (OSError, TimeoutError, WebSocketException) as e:
        return Check("server", CheckStatus.FAIL, f"{server}: websocket handshake failed: {type(e).__name__}: {e}",
                     "a reverse proxy must pass websocket upgrades (Upgrade/Connection headers)")
    return Check("server", CheckStatus.OK, f"{base} reachable in {probe.rtt * 1000:.0f} ms; token accepted")


def check_registry(ctx: Context) -> Check:
    """The OCI registry for start states and images: reachable, its TLS trusted, our credentials taken."""
    import asyncio

    from gh_runner.registry import Registry, RegistryAuthError, RegistryError, RegistryTimeouts, load_credentials

    cfg = getattr(ctx.config, "registry", None)
    if cfg is None:
        return Check("registry", CheckStatus.SKIP,
                     "no registry configured: start states stay on the runner that saved them")
    try:
        creds = load_credentials(cfg.credentials_file, cfg.url) if cfg.credentials_file else None
    except RegistryError as e:
        return Check("registry", CheckStatus.FAIL, str(e),
                     "write `user:password` (chmod 600) or a Docker config.json with an auths entry for "
                     f"{urlsplit(cfg.url).netloc} to registry.credentials_file")

    async def ping() -> None:
        t = RegistryTimeouts(connect=ctx.net_timeout, io=ctx.net_timeout, call=ctx.net_timeout)
        async with Registry(cfg.url, credentials=creds, ca_file=cfg.ca_file, timeouts=t) as reg:
            await reg.ping()

    try:
        asyncio.run(ping())
    except RegistryAuthError as e:
        return Check("registry", CheckStatus.FAIL, f"{cfg.url}: {e}",
                     f"check the user and password in {cfg.credentials_file or 'registry.credentials_file'} "
                     "(htpasswd -v FILE USER on the registry host tells whether they match)")
    except (RegistryError, OSError, ValueError) as e:
        return Check("registry", CheckStatus.FAIL, f"{cfg.url}: {e}",
                     f"curl -sS {cfg.url}/v2/   # a self-signed registry needs registry.ca_file")
    return Check("registry", CheckStatus.OK,
                 f"{cfg.url} answers and takes our credentials (repository {cfg.repository})")


def check_clock(probe: ServerProbe) -> Check:
    if probe.date is None:
        return Check("clock", CheckStatus.SKIP, "no Date header from the server to compare with")
    # The server stamped Date somewhere within the round trip, with one-second resolution.
    now = datetime.now(UTC).timestamp() - probe.rtt / 2
    skew = now - probe.date.timestamp()
    if abs(skew) <= CLOCK_SKEW_FAIL:
        return Check("clock", CheckStatus.OK, f"within {max(abs(skew), 1):.0f} s of the server's clock")
    return Check("clock", CheckStatus.FAIL, f"this host's clock is {skew:+.0f} s off the server's",
                 "timedatectl set-ntp true   # or install chrony / systemd-timesyncd")


# ---------------------------------------------------------------------------------------------


def _manifests(images_dir: Path) -> dict[str, ImageManifest]:
    """The images' manifests (unverified: the provider's images check verifies them), for disk sizing."""
    out: dict[str, ImageManifest] = {}
    with contextlib.suppress(OSError):
        for d in sorted(images_dir.iterdir()):
            if (d / MANIFEST_NAME).is_file():
                with contextlib.suppress(ManifestError):
                    m = load_manifest(d, verify_checksum=False)
                    out[m.name] = m
    return out


def _qemu_provider(config: DoctorConfig) -> Provider:
    from providers.qemu import QemuProvider  # type: ignore[attr-defined]

    provider: Provider = QemuProvider(config.images_dir, config.state_dir, "doctor", config.libvirt_uri)
    return provider


def run_checks(ctx: Context, out: TextIO, provider: Provider, limits: CheckLimits) -> list[Check]:
    results: list[Check] = []

    def report(c: Check) -> None:
        results.append(c)
        detail = " ".join(c.detail.split())  # libvirt errors span lines; keep one line per check
        out.write(f"{c.status:<5} {c.name:<8} {detail}\n")
        if c.fix and c.status in (CheckStatus.FAIL, CheckStatus.WARN):
            out.write(f"{'':<14} fix: {c.fix}\n")
        out.flush()

    async def provider_checks() -> list[Check]:
        try:
            return await provider.host_checks(limits)
        finally:
            await provider.close()

    try:
        for c in asyncio.run(provider_checks()):
            report(c)
    except Exception as e:  # the provider's hook never raises; a bug in it must not hide the rest
        report(Check("provider", CheckStatus.FAIL, f"the provider's checks crashed: {type(e).__name__}: {e}"))
    ctx.manifests = _manifests(ctx.config.images_dir)
    probe = ServerProbe()
    steps: list[tuple[str, Callable[[], Check]]] = [
        ("disk", lambda: check_disk(ctx)),
        ("state", lambda: check_state(ctx)),
        ("server", lambda: check_server(ctx, probe)),
        ("clock", lambda: check_clock(probe)),
        ("registry", lambda: check_registry(ctx)),
    ]
    for name, step in steps:
        try:
            report(step())
        except Exception as e:  # a bug in one check must not hide the others
            report(Check(name, CheckStatus.FAIL, f"the check itself crashed: {type(e).__name__}: {e}"))
    return results


def main(config: DoctorConfig, *, out: TextIO | None = None, tcg_timeout: float = 60.0, net_timeout: float = 15.0,
         provider: Provider | None = None) -> int:
    """Run every check, print the report, return the process exit code (0 ok, 1 something failed)."""
    out = sys.stdout if out is None else out
    ctx = Context(config, net_timeout=net_timeout)
    limits = CheckLimits(fallback_s=tcg_timeout, call_s=net_timeout)
    results = run_checks(ctx, out, provider or _qemu_provider(config), limits)
    failed = [c.name for c in results if c.status == "FAIL"]
    warned = [c.name for c in results if c.status == "WARN"]
    if failed:
        out.write(f"\n{len(failed)} check(s) failed: {', '.join(failed)}\n")
        return 1
    out.write("\nready" + (f" (warnings: {', '.join(warned)})" if warned else "") + "\n")
    return 0
