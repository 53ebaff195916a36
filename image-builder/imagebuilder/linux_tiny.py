"""linux-tiny: the test and demo guest, built offline from Debian packages.

A Debian kernel, busybox-static and qemu-guest-agent (with the shared libraries it links) on an
ext4 root made by `mkfs.ext4 -d` (no mount, no root privileges on the image), booted directly
(kernel + initramfs) by QEMU. The build boots it once: the guest agent answering, the
provisioning script running, the tablet reaching /dev/input, the VGA console drawing and taking
typed keys are the proof the image works.

Kernel flavour: Debian's cloud kernel (default) is LZ4-compressed and reaches its first message
under TCG in under a second, but it is built without USB (CONFIG_USB unset), so its absolute pointer is a virtio
tablet (virtio_input); the manifest says `tablet: virtio` and the provider must give the domain
that device. `--kernel generic` gives a USB tablet instead, at a price measured here: its
XZ-compressed bzImage alone takes 6-9 s to decompress under TCG, over the 5 s boot budget.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path

from providers.manifest import DirectKernelBoot, DiskFile, ImageManifest, sha256_file

from . import cpio, debs, pipeline, proc
from .accel import build_accelerator
from .errors import BuildError
from .kmod import ModuleTree
from .pipeline import BootPlan, Script, log
from .vm import BuildVM, Drive, MachineSpec

NAME = "linux-tiny"
ASSETS = Path(__file__).parent / "assets" / "linux-tiny"
KERNEL_METAPACKAGES = {"generic": "linux-image-amd64", "cloud": "linux-image-cloud-amd64"}
TABLET = {"generic": "usb", "cloud": "virtio"}
# Beyond the root and consoles, each option takes work off a boot that runs under TCG:
# cryptomgr.notests skips the crypto self-tests (~0.4 s), tsc=reliable and no_timer_check skip the
# clocksource watchdog and timer check (and keep the cheap TSC when the host is loaded),
# random.trust_cpu=on seeds the RNG without waiting, 8250.nr_uarts=1 probes only ttyS0, and
# pci=noacpi routes PCI interrupts from the BIOS table instead of evaluating ACPI link objects in
# the AML interpreter, which took ~200 ms per virtio device (measured with initcall_debug). The
# image is for the `pc` machine (i440fx), whose SeaBIOS provides that table.
CMDLINE = (
    "console=tty1 console=ttyS0 root=/dev/vda rw quiet "
    "cryptomgr.notests tsc=reliable no_timer_check random.trust_cpu=on 8250.nr_uarts=1 pci=noacpi"
)
MEMORY_MIB = 256
VCPUS = 1
DISK_MIB = 256
SIZE_LIMIT = 40 * 1024 * 1024

# Block device and root filesystem, loaded by the initramfs in this order (the virtio chain first,
# each module after those it needs; crc32c_generic because ext4 asks the crypto API for "crc32c" at mount).
# Modules in OPTIONAL are skipped when a flavour has no such module (the cloud kernel has ext4
# built in and no USB at all).
INITRAMFS_MODULES = [
    "virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci", "virtio_blk",
    "crc32c_generic", "ext4",
]
# Loaded by the root's rcS: the guest-agent port first; then USB host controllers (ehci before
# uhci, as the kernel asks; xhci for q35) with HID for a USB tablet, virtio-input for a virtio
# tablet, evdev (/dev/input/event*) and mousedev (/dev/input/mice, as on any desktop).
ROOT_MODULES = ["virtio_console"]
ROOT_MODULES_LATE = [
    "ehci_hcd", "ehci_pci", "uhci_hcd", "xhci_hcd", "xhci_pci",
    "usbhid", "hid_generic", "evdev", "mousedev", "virtio_input",
]
OPTIONAL = {"crc32c_generic", "ext4", "ehci_hcd", "ehci_pci", "uhci_hcd", "xhci_hcd", "xhci_pci", "usbhid"}
GUEST_PACKAGES = ["busybox-static", "qemu-guest-agent"]
# The guest's programs of our own, compiled here with the host's gcc, no libc (their sources say
# why): gh-reseed reseeds its kernel's RNG after a memory restore (the qemu-ga wrapper's way),
# gh-execd is the resident script executor on its own port (providers/qemu/execd.py).
RESEED_SOURCE = ASSETS / "src" / "gh-reseed.c"
RESEED_PATH = "usr/sbin/gh-reseed"
EXECD_SOURCE = ASSETS / "src" / "gh-execd.c"
EXECD_PATH = "usr/sbin/gh-execd"
# Builder sources whose change changes the image (the VM/pipeline code only runs it).
_SOURCES = ["linux_tiny.py", "kmod.py", "cpio.py"]


class Inputs:
    """The resolved packages of one build; a package is extracted only when the build needs its
    files, so an up-to-date check extracts nothing but the small guest agent."""

    def __init__(
        self, debs: list[debs.Deb], kernel_flavour: str, kernel_package: str, paths: dict[str, Path],
        libs: list[tuple[str, str]], work: Path, extracted: dict[str, Path] | None = None,
    ) -> None:
        self.debs = debs
        self.kernel_flavour = kernel_flavour
        self.kernel_package = kernel_package
        self.paths = paths
        self.libs = libs  # (soname, package)
        self.work = work
        self._roots: dict[str, Path] = dict(extracted or {})

    def root(self, package: str) -> Path:
        if package not in self._roots:
            self._roots[package] = debs.extract(self.paths[package], self.work / "pkg" / package)
        return self._roots[package]

    def record(self) -> dict[str, object]:
        return {
            "packages": sorted(f"{d.filename} sha256:{d.sha256}" for d in self.debs),
            "sources": _source_digest(),
            "kernel_flavour": self.kernel_flavour,
            "cmdline": CMDLINE,
            "initramfs_modules": INITRAMFS_MODULES,
            "root_modules": ROOT_MODULES,
            "root_modules_late": ROOT_MODULES_LATE,
            "disk_mib": DISK_MIB,
            "memory_mib": MEMORY_MIB,
        }


def _source_digest() -> str:
    h = hashlib.sha256()
    files = [Path(__file__).parent / s for s in _SOURCES] + sorted(p for p in ASSETS.rglob("*") if p.is_file())
    for f in files:
        h.update(f.relative_to(Path(__file__).parent).as_posix().encode() + b"\0")
        h.update(f"{stat.S_IMODE(f.stat().st_mode):o}".encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _ldd(binary: Path) -> list[tuple[str, str]]:
    """(soname, host path) of every shared library the binary loads, the loader included."""
    out = proc.text(["ldd", binary], timeout=30)
    libs = []
    for line in out.splitlines():
        line = line.strip()
        if "not found" in line:
            raise BuildError(f"{binary.name} needs {line.split()[0]}, which this host lacks to resolve it")
        m = re.match(r"^(\S+) => (\S+) \(0x", line)
        if m:
            libs.append((m[1], m[2]))
        elif line.startswith("/"):
            path = line.split()[0]
            libs.append((path, path))  # the dynamic loader: its soname is its absolute path
    return libs


def _resolve_in(root: Path, rel: str) -> Path | None:
    """Follow symlinks inside an extracted package tree (absolute targets are relative to root),
    trying both sides of the /usr merge."""
    candidates = [rel.lstrip("/")]
    c = candidates[0]
    candidates.append(c[4:] if c.startswith("usr/") else "usr/" + c)
    for cand in candidates:
        p = root / cand
        for _ in range(20):
            if p.is_symlink():
                target = os.readlink(p)
                p = root / target.lstrip("/") if target.startswith("/") else p.parent / target
                continue
            break
        if p.is_file():
            return p
    return None


def gather_inputs(cache: debs.DebCache, work: Path, kernel_flavour: str) -> Inputs:
    kernel_package = debs.resolve_metapackage(KERNEL_METAPACKAGES[kernel_flavour])
    top = debs.resolve([kernel_package, *GUEST_PACKAGES])
    paths = cache.fetch(top)
    qga_root = debs.extract(paths["qemu-guest-agent"], work / "pkg" / "qemu-guest-agent")
    host_libs = _ldd(qga_root / "usr" / "sbin" / "qemu-ga")
    owners = debs.owning_packages([path for _, path in host_libs])
    by_lib = [(soname, owners[path]) for soname, path in host_libs]
    lib_debs = debs.resolve(sorted({pkg for _, pkg in by_lib}))
    paths.update(cache.fetch(lib_debs))
    return Inputs([*top, *lib_debs], kernel_flavour, kernel_package, paths, by_lib, work,
                  extracted={"qemu-guest-agent": qga_root})


def _kernel_version(kernel_root: Path) -> str:
    found = sorted((kernel_root / "boot").glob("vmlinuz-*"))
    if not found:
        raise BuildError("the kernel package has no /boot/vmlinuz-*")
    return found[0].name.removeprefix("vmlinuz-")


def _copy_assets(src: Path, dest: Path) -> None:
    for p in sorted(src.rglob("*")):
        target = dest / p.relative_to(src)
        if p.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink() or target.exists():
                target.unlink()
            shutil.copy2(p, target)


def build_rootfs(inputs: Inputs, kver: str, modules: ModuleTree, initramfs_loaded: set[str], root: Path) -> None:
    bb_src = inputs.root("busybox-static") / "bin" / "busybox"
    (root / "bin").mkdir(parents=True)
    shutil.copy2(bb_src, root / "bin" / "busybox")
    for applet in proc.text([bb_src, "--list-full"], timeout=30).split():
        link = root / applet
        if applet == "bin/busybox" or link.exists():
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("/bin/busybox")
    (root / "usr" / "sbin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(inputs.root("qemu-guest-agent") / "usr" / "sbin" / "qemu-ga", root / "usr" / "sbin" / "qemu-ga")
    libdir = root / "lib" / "x86_64-linux-gnu"
    libdir.mkdir(parents=True, exist_ok=True)
    for soname, pkg in inputs.libs:
        src = _resolve_in(inputs.root(pkg), soname if soname.startswith("/") else f"lib/x86_64-linux-gnu/{soname}")
        if src is None:
            raise BuildError(f"{soname} is not in package {pkg}")
        if soname.startswith("/"):
            (root / soname.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / soname.lstrip("/"))
            shutil.copy2(src, libdir / Path(soname).name)
        else:
            shutil.copy2(src, libdir / soname)
    moddir = root / "lib" / "modules" / kver
    early = modules.load_order(modules.available(ROOT_MODULES, OPTIONAL), already=initramfs_loaded)
    late = modules.load_order(modules.available(ROOT_MODULES_LATE, OPTIONAL), already=initramfs_loaded | set(early))
    (moddir / "modules.load").write_text("\n".join(modules.install(early, moddir, unsigned=True)) + "\n")
    (moddir / "modules.late").write_text("\n".join(modules.install(late, moddir, unsigned=True)) + "\n")
    _copy_assets(ASSETS / "rootfs", root)
    build_static(RESEED_SOURCE, root / RESEED_PATH)
    build_static(EXECD_SOURCE, root / EXECD_PATH)
    for d in ("proc", "sys", "dev", "run", "root", "var/log", "mnt"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir(exist_ok=True)
    os.chmod(root / "tmp", 0o1777)
    os.chmod(root / "root", 0o700)
    (root / "var" / "run").symlink_to("/run")


def build_static(source: Path, dest: Path) -> None:
    """One of our guest programs, static and without libc (x86-64 system calls only), so it needs
    nothing in the guest and nothing beyond gcc on the host."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    proc.run(["gcc", "-Os", "-static", "-nostdlib", "-fno-stack-protector", "-fno-asynchronous-unwind-tables",
              "-Wall", "-Wextra", "-Werror", "-s", "-o", dest, source], timeout=120)
    dest.chmod(0o755)


def build_initramfs(inputs: Inputs, modules: ModuleTree) -> tuple[bytes, set[str]]:
    order = modules.load_order(modules.available(INITRAMFS_MODULES, OPTIONAL))
    entries = [cpio.dir_entry(d) for d in ("bin", "dev", "proc", "sys", "newroot", "lib", "lib/modules")]
    entries.append(cpio.chardev_entry("dev/console", 5, 1))
    entries.append(cpio.file_entry("init", (ASSETS / "initramfs" / "init").read_bytes(), 0o755))
    bb = (inputs.root("busybox-static") / "bin" / "busybox").read_bytes()
    entries.append(cpio.file_entry("bin/busybox", bb, 0o755))
    entries.append(cpio.symlink_entry("bin/sh", "busybox"))
    with tempfile.TemporaryDirectory() as d:
        # unsigned: no RSA verification per module on the boot's critical path
        rels = modules.install(order, Path(d), unsigned=True)
        seen_dirs: set[str] = set()
        for rel in rels:
            parts = rel.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                sub = "lib/modules/" + "/".join(parts[:i])
                if sub not in seen_dirs:
                    seen_dirs.add(sub)
                    entries.append(cpio.dir_entry(sub))
            entries.append(cpio.file_entry(f"lib/modules/{rel}", (Path(d) / rel).read_bytes()))
    entries.append(cpio.file_entry("lib/modules/modules.load", ("\n".join(rels) + "\n").encode()))
    # Uncompressed: 2.2 MB instead of 1.7 MB, and the kernel copies it instead of inflating it
    # (~60 ms less under TCG).
    return cpio.newc(entries), set(order)


def make_ext4(root: Path, image: Path) -> None:
    with image.open("wb") as f:
        f.truncate(DISK_MIB * 1024 * 1024)
    proc.run(
        ["mkfs.ext4", "-q", "-F", "-L", NAME, "-b", "4096", "-N", "8192", "-m", "0",
         "-E", "root_owner=0:0", "-d", root, image],
        timeout=300,
    )


def provisioning(version: str, tablet: str) -> tuple[list[Script], list[Script]]:
    device = {"usb": "QEMU USB Tablet", "virtio": "QEMU Virtio Tablet"}[tablet]
    provision = [
        Script("record the image version", f"set -e\necho {version} > /etc/gh-image-version\n", 30),
        Script(
            "check the guest devices",
            "set -e\n"
            "test -x /bin/sh\n"
            "test -e /dev/virtio-ports/org.qemu.guest_agent.0\n"
            "pidof gh-execd >/dev/null || { echo 'gh-execd is not running' >&2; exit 1; }\n"
            # the input modules load in the background: give them 20 s
            f"i=0; until grep -q '{device}' /proc/bus/input/devices; do i=$((i + 1)); "
            f"[ $i -gt 200 ] && {{ echo 'no {device} in /dev/input' >&2; exit 1; }}; usleep 100000; done\n"
            "ls /dev/input/event* >/dev/null\n",
            60,
        ),
        # What a machine's first script after a restore runs (providers/qemu/guest_agent.py): the
        # kernel must take the bytes and reseed.
        Script("check that the guest's RNG reseeds",
               f"set -e\n/{RESEED_PATH} $(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n')\n", 30),
    ]
    seal = [Script("seal: clear temporary files and flush the disk", "rm -rf /tmp/* /root/.ash_history; sync\n", 60)]
    return provision, seal


# True once a shell has /dev/tty1 as its stdin: the console is ready for keys.
_TTY1_SHELL = """for p in /proc/[0-9]*; do
  [ "$(readlink $p/fd/0 2>/dev/null)" = /dev/tty1 ] && grep -q '^sh$' $p/comm 2>/dev/null && exit 0
done
exit 1
"""


def check_console(vm: BuildVM, timeout: float = 60.0) -> None:
    """The VGA console draws and takes keyboard input: type a command on tty1 with QMP send-key
    and see its effect through the guest agent."""
    deadline = time.monotonic() + timeout
    vm.wait_screen_text(timeout)
    while vm.qga.run_script("/bin/sh", _TTY1_SHELL, timeout=30).exit_code != 0:
        if time.monotonic() > deadline:
            raise BuildError("no shell on tty1: the VGA console has no prompt")
        time.sleep(0.2)
    vm.type_text("echo typed >/run/gh-typed\n")
    while vm.qga.run_script("/bin/sh", "grep -qx typed /run/gh-typed", timeout=30).exit_code != 0:
        if time.monotonic() > deadline:
            raise BuildError("keys typed on the VGA console never reached its shell")
        time.sleep(0.2)
    vm.qga.run_script("/bin/sh", "rm -f /run/gh-typed", timeout=30)
    log("VGA console shows a shell and takes keyboard input")


def build(out: Path, cache: debs.DebCache, *, kernel_flavour: str = "cloud", force: bool = False) -> Path:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gh-build-linux-tiny-", dir="/var/tmp"))
    os.chmod(work, 0o755)  # QEMU may run as another user on some hosts
    staging: Path | None = None
    try:
        # Fast path: same apt lists, same builder sources and flavour -> same packages, so the
        # image is current if it verifies; no apt call at all.
        quick_key = pipeline.inputs_digest(
            {"apt": debs.apt_state(), "sources": _source_digest(), "flavour": kernel_flavour}
        )
        if not force and (existing := pipeline.up_to_date(out / NAME, quick_key, key="quick_key")) is not None:
            log(f"{NAME} {existing.version} is up to date in {out / NAME} ({time.monotonic() - started:.1f} s)")
            return out / NAME
        try:
            inputs = gather_inputs(cache, work, kernel_flavour)
        except BuildError as e:
            # Empty lists on a fresh machine, or old ones naming files the mirror dropped: refresh once.
            if os.geteuid() != 0:
                raise
            log(f"{e}; refreshing apt's package lists and retrying")
            proc.run(["apt-get", "update", "-qq"], timeout=900)
            shutil.rmtree(work / "pkg", ignore_errors=True)
            inputs = gather_inputs(cache, work, kernel_flavour)
        record = inputs.record()
        digest = pipeline.inputs_digest(record)
        version = digest[:16]
        if not force and (existing := pipeline.up_to_date(out / NAME, digest)) is not None:
            pipeline.record_quick_key(out / NAME, quick_key)
            log(f"{NAME} {existing.version} is up to date in {out / NAME} ({time.monotonic() - started:.1f} s)")
            return out / NAME

        kroot = inputs.root(inputs.kernel_package)
        kver = _kernel_version(kroot)
        modules = ModuleTree.load(kroot, kver)
        staging = pipeline.staging_dir(out, NAME)
        shutil.copy2(kroot / "boot" / f"vmlinuz-{kver}", staging / "vmlinuz")
        initrd, loaded = build_initramfs(inputs, modules)
        (staging / "initrd.img").write_bytes(initrd)
        root = work / "root"
        build_rootfs(inputs, kver, modules, loaded, root)
        raw = work / "root.ext4"
        log(f"root filesystem, initramfs and kernel {kver} assembled ({time.monotonic() - started:.1f} s)")

        spec = MachineSpec(
            name=NAME, machine="pc", memory_mib=MEMORY_MIB, vcpus=VCPUS, video="vga",
            kernel=staging / "vmlinuz", initrd=staging / "initrd.img", cmdline=CMDLINE,
            drives=[Drive(raw, "raw")], tablet=TABLET[kernel_flavour], qga_channel=True,
        )
        provision, seal = provisioning(version, TABLET[kernel_flavour])
        plan = BootPlan("/bin/sh", provision, seal, ready_timeout=120, shutdown_timeout=60, check=check_console)
        make_ext4(root, raw)
        vm = BuildVM(spec, build_accelerator(spec.kernel, cache.root), work)
        pipeline.boot_provision_seal(vm, vm.qga, plan)

        pipeline.convert_compressed(raw, "raw", staging / "disk.qcow2")
        total = sum((staging / f).stat().st_size for f in ("vmlinuz", "initrd.img", "disk.qcow2"))
        if total > SIZE_LIMIT:
            raise BuildError(f"{NAME} is {total / 2**20:.1f} MiB, over the {SIZE_LIMIT / 2**20:.0f} MiB budget")
        manifest = ImageManifest(
            name=NAME, os="linux", version=version,
            description=f"busybox + qemu-guest-agent on Debian kernel {kver}; text console on tty1 and ttyS0",
            shell="sh", guest_channels=["qemu-ga", "gh-execd"],
            boot=DirectKernelBoot(
                kernel="vmlinuz", initrd="initrd.img", cmdline=CMDLINE,
                kernel_sha256=sha256_file(staging / "vmlinuz"), initrd_sha256=sha256_file(staging / "initrd.img"),
            ),
            machine="pc", memory_mib=MEMORY_MIB, vcpus=VCPUS, video="vga",
            disk=DiskFile(file="disk.qcow2", sha256=sha256_file(staging / "disk.qcow2"),
                          virtual_size=DISK_MIB * 1024 * 1024),
            network="none", tablet=TABLET[kernel_flavour],
        )
        record["kernel"] = kver
        record["build_timings"] = {k: round(v, 2) for k, v in plan.timings.items()}
        final = pipeline.publish(staging, manifest, record, digest, quick_key=quick_key)
        staging = None
        log(f"{NAME} {version} written to {final}: {total / 2**20:.1f} MiB, "
            f"guest ready {plan.timings['ready_s']:.1f} s after boot, build {time.monotonic() - started:.0f} s")
        return final
    finally:
        if staging is not None:
            pipeline.discard(staging)
        shutil.rmtree(work, ignore_errors=True)
