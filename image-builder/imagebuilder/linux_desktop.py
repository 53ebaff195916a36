"""linux-desktop: a signed-in XFCE desktop on Debian 12, built offline from Debian's packages.

The root is made by Debian's own `mmdebstrap` (variant `important` plus the desktop's packages),
configured by its customize hook (`assets/linux-desktop/customize.sh`: the user `user`, uid 1000,
with passwordless sudo and the usual folders; lightdm signing it in to XFCE at boot; no screen
saver, lock or display power management; no first-start questions), and put on an ext4 disk with
`mkfs.ext4 -d` (no mounts, no loop devices). The machine boots the disk's own kernel and
initramfs directly (Debian's generic kernel: bochs-drm draws QEMU's standard VGA, and usbhid drives
QEMU's USB tablet, an absolute pointer X maps 1:1 to the screen).

The build boots it once and proves it, or fails: the guest agent answers; the session is up
(xfce4-panel running, `xfconf-query` answering as the user); the screen shows a desktop, not a
console (many colours); keys typed through the hypervisor reach a focused GUI text field; a click
lands where it was aimed (within 2 px). The first boot stays in the image (the session's first
start is done once, here, not on every machine).

Version and cache: the version is a digest of the exact package closure apt resolves for this
package list (name and version of each), the builder sources and the display size. A second
build whose apt lists have not changed returns at once (`quick_key`); one whose lists changed
but resolve to the same packages records the new lists and returns in about half a minute.

Profiles: an image that is this desktop with more on it (osworld_desktop.py) is a `Profile` of
this builder: more packages, its own customize hook and files run after this one's, its own proofs,
files staged into the root on every build, and its own sources in its version. linux-desktop's
version never reads another profile's inputs.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from providers.manifest import DesktopSession, DirectKernelBoot, DiskFile, Display, ImageManifest, sha256_file

from . import debs, pipeline, proc, pyautogui
from .accel import build_accelerator
from .errors import BuildError
from .pipeline import BootPlan, Script, log
from .vm import BuildVM, Drive, MachineSpec

NAME = "linux-desktop"
ASSETS = Path(__file__).parent / "assets" / "linux-desktop"
SUITE = "bookworm"
VARIANT = "important"
# Beyond `important`: the kernel and its init, X on QEMU's display, XFCE 4.18 with the usual
# applications, sound as a setting (PulseAudio: with no sound card it plays into a null sink whose
# volume and mute are real settings), the guest agent, sudo, the display manager, and what the
# proofs and tests read the desktop with (python3-tk, xdotool, x11-utils, python3-pyatspi).
PACKAGES = [
    "linux-image-amd64", "systemd-sysv", "udev", "dbus", "dbus-user-session", "libpam-systemd",
    "xserver-xorg-core", "xserver-xorg-input-libinput", "xserver-xorg-video-fbdev", "x11-xserver-utils",
    "x11-xkb-utils", "x11-utils", "xdotool",
    "lightdm", "lightdm-gtk-greeter",
    "xfce4-session", "xfwm4", "xfce4-panel", "xfdesktop4", "xfce4-settings", "xfconf", "thunar",
    "mousepad", "xfce4-terminal", "xfce4-pulseaudio-plugin", "xfce4-notifyd", "xdg-user-dirs",
    "adwaita-icon-theme", "elementary-xfce-icon-theme", "fonts-dejavu-core", "librsvg2-common", "gvfs",
    "at-spi2-core", "pulseaudio", "pulseaudio-utils", "firefox-esr",
    "python3", "python3-tk", "qemu-guest-agent", "sudo", "procps",
    # The standard tools a desktop case's setup calls: gio and gsettings (libglib2.0-bin), xdg-open.
    "libglib2.0-bin", "xdg-utils",
    # The accessibility tree (GET {machine.url}/accessibility, docs/desktop-guests.md): the AT-SPI
    # bus (at-spi2-core, above), its Python reader (python3-pyatspi: gir1.2-atspi-2.0 and
    # python3-gi) and the schema whose toolkit-accessibility key turns the toolkits' bridge on.
    "python3-pyatspi", "gsettings-desktop-schemas",
    # pyautogui (agent kind osworld's actions; imagebuilder/pyautogui.py installs it from PyPI) drives X
    # with these.
    *pyautogui.DEBIAN_PACKAGES,
]
USER = "user"
UID = 1000
HOME = "/home/user"
DEFAULT_DISPLAY = (1280, 800)
# Measured in this build's proof: the booted session uses about 600 MiB; Firefox another 300-500.
MEMORY_MIB = 2048
# The standard VGA: bochs-drm drives it, X's modesetting driver draws on it, and QEMU's screendump
# reads it. (A session's FIRST start under TCG paints nothing for a minute or more: GTK and xfwm4
# build their caches; a black screen then is a session still starting, not a display fault. The
# build waits for the painted desktop, and that first start stays in the image.)
VIDEO = "vga"
VCPUS = 2
DISK_MIB = 6144
# usbcore.autosuspend=-1: the kernel suspends an idle USB tablet and QEMU's wake-up loses the
# reports that follow (measured: after a few idle seconds no move or click reached the guest).
CMDLINE = ("root=/dev/vda rw quiet console=ttyS0 loglevel=3 "
           "cryptomgr.notests tsc=reliable no_timer_check random.trust_cpu=on 8250.nr_uarts=1 "
           "usbcore.autosuspend=-1")
SESSION_ENV = {
    "DISPLAY": ":0",
    "XAUTHORITY": f"{HOME}/.Xauthority",
    "XDG_RUNTIME_DIR": f"/run/user/{UID}",
    "DBUS_SESSION_BUS_ADDRESS": f"unix:path=/run/user/{UID}/bus",
    "XDG_SESSION_TYPE": "x11",
    "XDG_CURRENT_DESKTOP": "XFCE",
}
# True once the desktop is the user's: the panel runs and xfconf (on the session bus) answers.
SESSION_READY = "pgrep -u user -x xfce4-panel >/dev/null && pgrep -u user -x xfdesktop >/dev/null " \
                "&& xfconf-query -c xfwm4 -p /general/theme >/dev/null"
# The session's first start paints its desktop well after its processes run (measured under TCG on
# 2 loaded cores: 70 s after xfdesktop started; a second boot paints at once).
FIRST_PAINT_TIMEOUT = 420.0
TYPING_TRIES = 3
SIZE_LIMIT = 1536 * 1024 * 1024  # the compressed disk
_SOURCES = ["linux_desktop.py", "pyautogui.py"]
_REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Profile:
    """One image this builder makes. Its hooks and files (`assets`: directories with a
    customize.sh and a rootfs/) apply in order over the root; `sources` are the builder's own files
    in its version; `inputs` (computed before building: cheap) and `stage` (the root, the cache:
    files put into the configured root on every build) are a profile's extra inputs and files;
    `proofs` are guest scripts run after the desktop's own, given the profile's `as_user`."""

    name: str
    packages: tuple[str, ...]
    assets: tuple[Path, ...]
    sources: tuple[Path, ...]
    memory_mib: int
    disk_mib: int
    size_limit: int
    session_env: Mapping[str, str]
    description: str
    inputs: Callable[[], dict[str, object]] = field(default=lambda: {})
    stage: Callable[[Path, Path], None] | None = None
    proofs: Callable[[Callable[[str], str]], list[Script]] = field(default=lambda as_user: [])
    extra_disk_mib: Callable[[], int] = field(default=lambda: 0)

    def as_user(self, command: str) -> str:
        return as_user(command, self.session_env)


def linux_desktop_profile() -> Profile:
    return Profile(
        name=NAME, packages=tuple(PACKAGES), assets=(ASSETS,),
        sources=tuple(Path(__file__).parent / s for s in _SOURCES), stage=pyautogui.install,
        memory_mib=MEMORY_MIB, disk_mib=DISK_MIB, size_limit=SIZE_LIMIT, session_env=SESSION_ENV,
        description="Debian 12 XFCE 4.18 desktop",
    )


def _digest_files(h: hashlib._Hash, files: list[tuple[str, Path]]) -> None:
    for rel, f in files:
        h.update(rel.encode() + b"\0")
        h.update(f"{stat.S_IMODE(f.stat().st_mode):o}".encode() + b"\0" + f.read_bytes() + b"\0")


def _source_digest(*, hook_only: bool = False, profile: Profile | None = None) -> str:
    """The builder's files in an image's version: its sources and every file of its assets (with
    `hook_only`, what the cached root is a function of: the customize hooks). Each file is named
    by where it is in its assets dir or the repository, so a checkout's place does not matter."""
    profile = profile or linux_desktop_profile()
    h = hashlib.sha256()
    for a in profile.assets:
        hooks = [a / "customize.sh"] if (a / "customize.sh").is_file() else []
        files = hooks if hook_only else sorted(p for p in a.rglob("*") if p.is_file())
        _digest_files(h, [(f"{a.name}/{f.relative_to(a).as_posix()}", f) for f in files])
    if not hook_only:
        _digest_files(h, [(f.resolve().relative_to(_REPO).as_posix() if f.resolve().is_relative_to(_REPO)
                           else f.name, f) for f in profile.sources])
    return h.hexdigest()


def resolve_closure(packages: list[str], timeout: float = 300.0) -> list[str]:
    """`name=version` of every package the root will hold, as apt resolves it from the host's
    lists for an empty system (what mmdebstrap installs): the variant's priorities plus the list."""
    with tempfile.NamedTemporaryFile(prefix="gh-empty-status-") as empty:
        cp = proc.run(
            ["apt-get", "-s", "-o", f"Dir::State::status={empty.name}", "-o", "APT::Install-Recommends=false",
             "install", "?and(?priority(required),?architecture(native))",
             "?and(?priority(important),?architecture(native))", *packages],
            timeout=timeout, check=False)
    out = cp.stdout.decode(errors="replace")
    found = sorted(f"{m[1]}={m[2]}" for m in re.finditer(r"^Inst (\S+) \((\S+)", out, re.M))
    if cp.returncode != 0 or not found:
        err = cp.stderr.decode(errors="replace").strip()
        raise BuildError(f"apt cannot resolve the desktop's packages: {err[-400:]} (run apt-get update first)")
    return found


def mmdebstrap(root: Path, cache: Path, size: str, profile: Profile, timeout: float = 1800.0) -> None:
    """The root, from Debian's packages; downloads are kept in `cache` for the next build."""
    cache.mkdir(parents=True, exist_ok=True)
    hooks = [f"--customize-hook={a / 'customize.sh'} \"$1\" {a} {size}" for a in profile.assets]
    proc.run(
        ["mmdebstrap", f"--variant={VARIANT}", "--include=" + ",".join(profile.packages),
         "--aptopt=APT::Install-Recommends \"false\"",
         "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
         "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/locale/*",
         "--dpkgopt=path-include=/usr/share/locale/locale.alias",
         "--skip=download/empty", "--skip=essential/unlink",
         "--setup-hook=mkdir -p \"$1\"/var/cache/apt/archives/",
         f"--setup-hook=sync-in {cache} /var/cache/apt/archives/",
         f"--customize-hook=sync-out /var/cache/apt/archives {cache}",
         *hooks,
         SUITE, root],
        timeout=timeout)


def root_cache_key(closure: list[str], size: str, profile: Profile | None = None) -> str:
    """What the configured root is a function of: the packages and the hook (not the boot settings)."""
    profile = profile or linux_desktop_profile()
    return pipeline.inputs_digest({"packages": closure, "hook": _source_digest(hook_only=True, profile=profile),
                                   "suite": SUITE, "variant": VARIANT, "include": list(profile.packages),
                                   "display": size})[:16]


def cached_root(cache: Path, key: str, size: str, profile: Profile | None = None) -> Path:
    """The configured root for these packages and this hook: built by mmdebstrap once and kept, so a
    build that failed later (or `--force`) does not install 500 packages again. Older roots are
    removed (one is about 1.3 GB). The downloaded packages are one cache for every profile."""
    profile = profile or linux_desktop_profile()
    base = cache / f"{profile.name}-root"
    done = base / key
    if (done / "etc" / "gh-display").is_file():
        log(f"reusing the root built for these packages ({done})")
        return done
    partial = base / f"{key}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    base.mkdir(parents=True, exist_ok=True)
    mmdebstrap(partial, cache / "linux-desktop-debs", size, profile)
    for old in base.iterdir():
        if old.name != f"{key}.partial":
            shutil.rmtree(old, ignore_errors=True)
    partial.rename(done)
    return done


ROOTFS_LIST = "etc/gh-rootfs-files"  # in the root: the image files the last build put there


def apply_files(root: Path, size: str, assets: tuple[Path, ...] | None = None) -> None:
    """The image's own files (assets/linux-desktop/rootfs, then a profile's) over the cached root, on
    every build: a change to one of them needs no new root (the hook copies them too, for a root
    built alone). A file the last build put there and the assets no longer have is removed, so the
    cached root never keeps what the sources dropped."""
    srcs = [a / "rootfs" for a in (assets or (ASSETS,)) if (a / "rootfs").is_dir()]
    now = sorted({p.relative_to(src).as_posix() for src in srcs for p in src.rglob("*")
                  if p.is_file() or p.is_symlink()})
    listed = root / ROOTFS_LIST
    before = listed.read_text().split("\n") if listed.is_file() else []
    for gone in sorted(set(filter(None, before)) - set(now)):
        (root / gone).unlink(missing_ok=True)
    for src in srcs:
        proc.run(["cp", "-a", "--no-preserve=ownership", f"{src}/.", f"{root}/"], timeout=120)
    listed.write_text("\n".join(now) + "\n")
    (root / "etc" / "gh-display").write_text(size + "\n")
    os.chmod(root / "etc" / "sudoers.d" / "gh-user", 0o440)


def make_ext4(root: Path, image: Path, disk_mib: int = DISK_MIB, label: str = NAME) -> None:
    with image.open("wb") as f:
        f.truncate(disk_mib * 1024 * 1024)
    proc.run(["mkfs.ext4", "-q", "-F", "-L", label[:16], "-b", "4096", "-m", "0", "-E", "root_owner=0:0", "-d", root,
              image], timeout=900)


def as_user(command: str, session_env: Mapping[str, str] = SESSION_ENV) -> str:
    """A shell line that runs `command` as the signed-in user inside its session's environment
    (what the provider does for every script on this image)."""
    env = " ".join(f"{k}={v}" for k, v in session_env.items())
    return (f"setpriv --reuid={UID} --regid={UID} --init-groups env HOME={HOME} USER={USER} LOGNAME={USER} "
            f"{env} bash -c {_sh_quote(command)}")


def _sh_quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def provisioning(version: str, size: str, profile: Profile | None = None) -> tuple[list[Script], list[Script]]:
    profile = profile or linux_desktop_profile()
    as_user = profile.as_user
    provision = [
        Script("record the image version", f"set -e\necho {version} > /etc/gh-image-version\n", 30),
        Script(
            "wait for the signed-in XFCE session",
            # The first start of a session under TCG takes a minute or two on a loaded host.
            f"i=0; until {as_user(SESSION_READY)}; do i=$((i + 1)); "
            "if [ $i -gt 600 ]; then echo 'the XFCE session did not come up within 10 minutes' >&2; "
            "systemctl --no-pager status lightdm >&2; tail -30 /var/log/lightdm/*.log >&2; exit 1; fi; "
            "sleep 1; done\n",
            660,
        ),
        Script(
            "check the session's screen, pointer, folders and sudo",
            "set -e\n"
            + as_user(f"xdpyinfo | grep -q 'dimensions: *{size} pixels'")
            + f" || {{ echo 'the screen is not {size}:' >&2; "
            + as_user("xdpyinfo | grep dimensions") + " >&2; exit 1; }\n"
            "grep -q 'QEMU USB Tablet' /proc/bus/input/devices || { echo 'no USB tablet' >&2; exit 1; }\n"
            + as_user("test -d ~/Desktop && test -d ~/Documents && test -d ~/Downloads && sudo -n true") + "\n"
            "systemctl is-active --quiet qemu-guest-agent\n",
            120,
        ),
        Script(
            "check gio and gsettings in the session",
            # A setting written by one gsettings is read by the next (dconf on the session bus), and
            # gio reaches the user's files through GVfs: what a case's setup calls them for.
            "set -e\n"
            + as_user("gio info ~/Documents >/dev/null && gio trash --list >/dev/null && "
                      "gsettings set org.gtk.Settings.FileChooser show-hidden true && "
                      "test \"$(gsettings get org.gtk.Settings.FileChooser show-hidden)\" = true && "
                      "gsettings reset org.gtk.Settings.FileChooser show-hidden && "
                      "command -v xdg-open >/dev/null") + "\n",
            120,
        ),
        Script("check pyautogui drives the session's display", as_user(pyautogui.PROOF) + "\n", 120),
        *profile.proofs(as_user),
    ]
    seal = [Script(
        "seal: clear temporary files and logs, flush the disk",
        "rm -rf /tmp/gh-* /root/.bash_history /var/log/journal/* /var/lib/apt/lists/*; "
        "find /var/log -type f -name '*.log' -exec truncate -s 0 {} +; fstrim -a 2>/dev/null; sync\n", 120)]
    return provision, seal


def _screen_colours(vm: BuildVM) -> int:
    """Distinct colours in a sample of the screen (a text console has two or three)."""
    shot = vm.workdir / "screen.ppm"
    vm.screendump(shot)
    data = shot.read_bytes()
    parts = data.split(maxsplit=4)
    if len(parts) < 5 or parts[0] != b"P6":
        raise BuildError("the screen dump is not a PPM image")
    pixels = parts[4]
    return len({pixels[i: i + 3] for i in range(0, len(pixels) - 2, 3 * 31)})


def _probe(vm: BuildVM, mode: str, out: str, count: int, timeout: float) -> None:
    """Start gh-desktop-probe as the user and wait until its window has the keyboard focus."""
    vm.qga.run_script("/bin/sh", f"rm -f {out} {out}.ready; "
                      f"{as_user(f'setsid gh-desktop-probe {mode} {out} {count} >/tmp/gh-probe.log 2>&1 &')}\n",
                      timeout=30)
    _wait_guest(vm, f"test -e {out}.ready", timeout, f"the {mode} probe window never got the focus")


def _wait_guest(vm: BuildVM, condition: str, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while vm.qga.run_script("/bin/sh", condition + "\n", timeout=30).exit_code != 0:
        if time.monotonic() > deadline:
            raise BuildError(what)
        time.sleep(0.3)


def _move(vm: BuildVM, x: int, y: int, size: tuple[int, int]) -> None:
    def axis(v: int, n: int) -> int:
        return round(max(0, min(v, n - 1)) * 32767 / (n - 1))

    move = [{"type": "abs", "data": {"axis": "x", "value": axis(x, size[0])}},
            {"type": "abs", "data": {"axis": "y", "value": axis(y, size[1])}}]
    vm.qmp.execute("input-send-event", {"events": move})


def _click(vm: BuildVM, x: int, y: int, size: tuple[int, int]) -> None:
    _move(vm, x, y, size)
    time.sleep(0.05)  # NOTE: one HID report per state; the press must not share the move's report
    for down in (True, False):
        vm.qmp.execute("input-send-event", {"events": [{"type": "btn", "data": {"down": down, "button": "left"}}]})
        time.sleep(0.05)


def check_desktop(size: tuple[int, int]):  # type: ignore[no-untyped-def]
    def check(vm: BuildVM, timeout: float = 180.0) -> None:
        """The screen shows a desktop, typed keys reach a GUI text field, clicks land where aimed."""
        started = time.monotonic()
        while (colours := _screen_colours(vm)) < 24:
            if time.monotonic() - started > FIRST_PAINT_TIMEOUT:
                raise BuildError(f"the screen still shows {colours} colours {FIRST_PAINT_TIMEOUT:.0f} s after the "
                                 "session came up: a blank screen or a console, not a desktop")
            time.sleep(1.0)
        log(f"the screen shows a desktop ({colours} colours in a sample) "
            f"{time.monotonic() - started:.0f} s after the session came up")
        # Up to TYPING_TRIES fresh text fields: on a host loaded by other machines the first start's
        # late windows (a notification, the panel's plugins) have taken the keyboard focus from the
        # field between its ready and the keys (seen once in four builds under load 10). Every try
        # is logged; the field must get the whole text, exactly.
        for attempt in range(1, TYPING_TRIES + 1):
            _probe(vm, "entry", "/tmp/gh-typed", 1, timeout)
            vm.type_text("Typed Through QEMU 123\n")
            try:
                _wait_guest(vm, "grep -qx 'Typed Through QEMU 123' /tmp/gh-typed", 60,
                            "keys typed through QEMU never reached the focused text field")
                break
            except BuildError:
                typed = vm.qga.run_script("/bin/sh", "cat /tmp/gh-typed 2>/dev/null; pkill -f 'bin/gh-[d]esktop-probe'",
                                        timeout=30).stdout.strip()
                if attempt == TYPING_TRIES:
                    raise
                log(f"typing try {attempt}: the text field got {typed!r}; trying a fresh one")
        log("keys typed through QEMU reach a focused GUI text field")
        w, h = size
        targets = [(0, 0), (w - 1, 0), (0, h - 1), (w - 1, h - 1), (w // 2, h // 2), (w // 3, 2 * h // 3)]
        # The tablet's first report must not be (0, 0): the guest kernel drops an absolute value
        # equal to the one it holds (0 on a tablet that never moved). The provider parks it the same way.
        _move(vm, w // 2, h // 2, size)
        _probe(vm, "click", "/tmp/gh-clicks", len(targets), timeout)
        for x, y in targets:
            _click(vm, x, y, size)
            time.sleep(0.3)  # NOTE: clicks a person makes; back to back, one was lost under load (measured)
        _wait_guest(vm, f"[ $(wc -l < /tmp/gh-clicks) -ge {len(targets)} ]", 60, "clicks never reached the window")
        got = vm.qga.run_script("/bin/sh", "cat /tmp/gh-clicks", timeout=30).stdout.split("\n")
        for (x, y), line in zip(targets, got, strict=False):
            gx, gy, button = (int(v) for v in line.split())
            if abs(gx - x) > 2 or abs(gy - y) > 2 or button != 1:
                raise BuildError(f"a left click aimed at ({x}, {y}) landed at ({gx}, {gy}) button {button}")
        log(f"clicks land where aimed: {', '.join(f'({x},{y})' for x, y in targets)}")
        vm.qga.run_script("/bin/sh", "rm -f /tmp/gh-typed* /tmp/gh-clicks* /tmp/gh-probe.log", timeout=30)

    return check


def version_inputs(profile: Profile, size: str) -> dict[str, object]:
    """What an image's version is a function of besides apt's package closure: its settings, the
    builder's sources and assets, and the profile's own inputs (never another profile's)."""
    return {"suite": SUITE, "variant": VARIANT, "packages": list(profile.packages), "display": size,
            "cmdline": CMDLINE, "memory_mib": profile.memory_mib, "vcpus": VCPUS,
            "disk_mib": profile.disk_mib + profile.extra_disk_mib(), "video": VIDEO,
            "sources": _source_digest(profile=profile), **profile.inputs()}


def build(out: Path, cache: debs.DebCache, *, display: tuple[int, int] = DEFAULT_DISPLAY,
          force: bool = False, profile: Profile | None = None) -> Path:
    profile = profile or linux_desktop_profile()
    name = profile.name
    started = time.monotonic()
    size = f"{display[0]}x{display[1]}"
    inputs = version_inputs(profile, size)
    disk_mib = profile.disk_mib + profile.extra_disk_mib()
    quick_key = pipeline.inputs_digest({"apt": debs.apt_state(), **inputs})
    if not force and (existing := pipeline.up_to_date(out / name, quick_key, key="quick_key")) is not None:
        log(f"{name} {existing.version} is up to date in {out / name} ({time.monotonic() - started:.1f} s)")
        return out / name
    if shutil.which("mmdebstrap") is None:
        raise BuildError("mmdebstrap is not installed (apt-get install mmdebstrap, or run scripts/setup.sh)")
    try:
        closure = resolve_closure(list(profile.packages))
    except BuildError as e:
        if os.geteuid() != 0:
            raise
        log(f"{e}; refreshing apt's package lists and retrying")
        proc.run(["apt-get", "update", "-qq"], timeout=900)
        closure = resolve_closure(list(profile.packages))
    record: dict[str, object] = {**inputs, "closure": closure}
    digest = pipeline.inputs_digest(record)
    version = digest[:16]
    if not force and (existing := pipeline.up_to_date(out / name, digest)) is not None:
        pipeline.record_quick_key(out / name, quick_key)
        log(f"{name} {existing.version} is up to date in {out / name} ({time.monotonic() - started:.1f} s)")
        return out / name
    if os.geteuid() != 0:
        raise BuildError(f"building {name} needs root (mmdebstrap installs packages into a chroot)")

    work = Path(tempfile.mkdtemp(prefix=f"gh-build-{name}-", dir="/var/tmp"))
    os.chmod(work, 0o755)  # QEMU may run as another user on some hosts
    staging: Path | None = None
    timings: dict[str, float] = {}
    try:
        t = time.monotonic()
        root_key = root_cache_key(closure, size, profile)
        root = cached_root(cache.root, root_key, size, profile)
        apply_files(root, size, profile.assets)
        if profile.stage is not None:
            profile.stage(root, cache.root)
        timings["mmdebstrap_s"] = time.monotonic() - t
        log(f"root ready ({timings['mmdebstrap_s']:.0f} s)")
        kernels = sorted((root / "boot").glob("vmlinuz-*"))
        if not kernels:
            raise BuildError("the root has no /boot/vmlinuz-*")
        kver = kernels[-1].name.removeprefix("vmlinuz-")
        staging = pipeline.staging_dir(out, name)
        shutil.copy2(root / "boot" / f"vmlinuz-{kver}", staging / "vmlinuz")
        shutil.copy2(root / "boot" / f"initrd.img-{kver}", staging / "initrd.img")
        raw = work / "root.ext4"
        t = time.monotonic()
        make_ext4(root, raw, disk_mib, name)
        timings["mkfs_s"] = time.monotonic() - t

        spec = MachineSpec(
            name=name, machine="pc", memory_mib=profile.memory_mib, vcpus=VCPUS, video=VIDEO,
            kernel=staging / "vmlinuz", initrd=staging / "initrd.img", cmdline=CMDLINE,
            drives=[Drive(raw, "raw")], tablet="usb", qga_channel=True,
        )
        provision, seal = provisioning(version, size, profile)
        plan = BootPlan("/bin/sh", provision, seal, ready_timeout=600, shutdown_timeout=180,
                        check=check_desktop(display))
        vm = BuildVM(spec, build_accelerator(spec.kernel, cache.root), work)
        pipeline.boot_provision_seal(vm, vm.qga, plan)
        timings.update(plan.timings)

        t = time.monotonic()
        pipeline.convert_compressed(raw, "raw", staging / "disk.qcow2", compression="zstd")
        timings["compress_s"] = time.monotonic() - t
        disk_bytes = (staging / "disk.qcow2").stat().st_size
        if disk_bytes > profile.size_limit:
            raise BuildError(f"{name}'s disk is {disk_bytes / 2**20:.0f} MiB, over the "
                             f"{profile.size_limit / 2**20:.0f} MiB budget")
        manifest = ImageManifest(
            name=name, os="linux", version=version,
            description=f"{profile.description}, user '{USER}' signed in at {size}; kernel {kver}",
            shell="bash", guest_channels=["qemu-ga"],
            boot=DirectKernelBoot(
                kernel="vmlinuz", initrd="initrd.img", cmdline=CMDLINE,
                kernel_sha256=sha256_file(staging / "vmlinuz"), initrd_sha256=sha256_file(staging / "initrd.img"),
            ),
            machine="pc", memory_mib=profile.memory_mib, vcpus=VCPUS, video=VIDEO,
            disk=DiskFile(file="disk.qcow2", sha256=sha256_file(staging / "disk.qcow2"),
                          virtual_size=disk_mib * 1024 * 1024),
            network="none", tablet="usb",
            display=Display(width=display[0], height=display[1]),
            session=DesktopSession(user=USER, uid=UID, home=HOME, env=dict(profile.session_env),
                                   ready_check=SESSION_READY,
                                   elevation="sudo"),
        )
        record["kernel"] = kver
        timings["total_s"] = time.monotonic() - started
        record["build_timings"] = {k: round(v, 1) for k, v in timings.items()}
        final = pipeline.publish(staging, manifest, record, digest, quick_key=quick_key)
        staging = None
        total = sum(p.stat().st_size for p in final.iterdir() if p.is_file())
        log(f"{name} {version} written to {final}: {total / 2**20:.0f} MiB "
            f"(disk {disk_bytes / 2**20:.0f} MiB), build {time.monotonic() - started:.0f} s "
            f"({', '.join(f'{k} {v:.0f}' for k, v in timings.items())})")
        return final
    finally:
        if staging is not None:
            pipeline.discard(staging)
        shutil.rmtree(work, ignore_errors=True)
