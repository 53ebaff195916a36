"""windows-10: a packer-style unattended build of Windows 10 22H2 from the operator's ISO and the
virtio-win ISO, on the same machinery as linux-tiny (boot, wait for the guest channel, provision,
seal, shut down, compress, publish with a manifest).

The answer file and the provisioning scripts ride on a small config ISO (label GHCONFIG). Setup
installs with virtio storage/network drivers from WinPE, creates a local administrator that logs
on automatically, and its first logon enables WinRM; the build then provisions over WinRM on an
isolated network (QEMU user networking with `restrict=on`, only the WinRM port forwarded to
127.0.0.1). The account's password is generated per build, written only to the credentials file
beside the image (mode 0600) and, encoded, to the answer file, which the seal step deletes.
"""

from __future__ import annotations

import argparse
import base64
import grp
import hashlib
import os
import pwd
import secrets
import shlex
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

import yaml

from providers.manifest import DiskFile, FirmwareBoot, ImageManifest, WinRMChannel, sha256_file
from providers.qemu.accel import image_kernel

from . import pipeline, proc
from .accel import build_accelerator
from .debs import DEFAULT_CACHE
from .domain_xml import domain_xml
from .errors import BuildError
from .pipeline import BootPlan, Script, log
from .unattend_schema import check_unattend
from .vm import BuildVM, Drive, MachineSpec
from .winrm_channel import WinRMBuildChannel

NAME = "win10-22h2"
ASSETS = Path(__file__).parent / "assets" / "windows-10"
CREDENTIALS_FILE = f"{NAME}.credentials.yaml"
SERVICE_GROUP = "gh-runner"  # the runner service's group (systemd/gh-runner.sysusers)
# Microsoft's published generic key for Windows 10 Pro: it selects the edition, it does not activate.
GENERIC_PRO_KEY = "VK7JG-NPHTM-C97JM-9MPGT-3V66T"
DISK_GIB = 64
MEMORY_MIB = 4096
VCPUS = 2
WINRM_PORT = 5985
# virtio-win drivers WinPE needs (disk, network) plus the serial port the guest agent talks over.
VIRTIO_DRIVERS = ["viostor", "vioscsi", "NetKVM", "vioserial", "Balloon"]
# The installer, virtio-win and config ISOs are SATA CD-ROMs; WinPE letters them from D: on.
DRIVE_LETTERS = "DEFG"
REDACTED = "(redacted: generated at build time, see the credentials file)"

PROVISION = [
    ("install virtio drivers and the QEMU guest agent", "install-guest-agent.ps1", 900),
    ("boot drivers for virtio and SATA disks", "storage-boot-drivers.ps1", 60),
    ("power: never sleep, no lock screen or screen saver", "power-and-screen.ps1", 120),
    ("Windows Update off", "windows-update-off.ps1", 120),
    ("telemetry minimal, no consumer features", "telemetry-minimal.ps1", 120),
]
SEAL = [
    ("clean up: cached answer file, temp files, superseded components", "cleanup.ps1", 3600),
    ("zero the free space (TRIM, then overwrite)", "zero-free-space.ps1", 3600),
]


@dataclass(frozen=True)
class Settings:
    locale: str = "en-US"
    time_zone: str = "UTC"
    edition: str = "Windows 10 Pro"
    product_key: str = GENERIC_PRO_KEY
    computer_name: str = "GH-WIN10"
    username: str = "gh"


def encode_password(password: str, suffix: str = "Password") -> str:
    """Answer-file password encoding (PlainText=false): base64 of UTF-16LE password + suffix."""
    return base64.b64encode((password + suffix).encode("utf-16-le")).decode()


def _driver_paths() -> str:
    items = []
    key = 1
    for letter in DRIVE_LETTERS:
        for drv in VIRTIO_DRIVERS:
            items.append(
                f'        <PathAndCredentials wcm:action="add" wcm:keyValue="{key}">'
                f"<Path>{letter}:\\{drv}\\w10\\amd64</Path></PathAndCredentials>"
            )
            key += 1
    return "\n".join(items)


def render_autounattend(settings: Settings, password: str | None, *, passes: set[str] | None = None) -> str:
    """The answer file; `password=None` renders a redacted copy for printing. `passes` keeps only
    those configuration passes (the sysprep answer file needs specialize and oobeSystem)."""
    text = (ASSETS / "autounattend.xml").read_text()
    values = {
        "LOCALE": settings.locale, "TIME_ZONE": settings.time_zone, "EDITION": settings.edition,
        "PRODUCT_KEY": settings.product_key, "COMPUTER_NAME": settings.computer_name,
        "USERNAME": settings.username,
        "PASSWORD_ENCODED": encode_password(password) if password is not None else REDACTED,
    }
    for k, v in values.items():
        text = text.replace("{{" + k + "}}", escape(v))
    text = text.replace("{{DRIVER_PATHS}}", _driver_paths())
    if passes is not None:
        import re

        def keep(m: re.Match[str]) -> str:
            return m.group(0) if m.group(1) in passes else ""

        text = re.sub(r'  <settings pass="(\w+)">.*?</settings>\n', keep, text, flags=re.S)
    return text


def provisioning(sysprep: bool) -> tuple[list[Script], list[Script]]:
    def load(name: str, file: str, timeout: float) -> Script:
        return Script(name, (ASSETS / "scripts" / file).read_text(), timeout)

    provision = [load(*p) for p in PROVISION]
    seal = [load(*s) for s in SEAL]
    if sysprep:
        seal.append(load("sysprep /generalize /oobe (powers off)", "sysprep.ps1", 600))
    return provision, seal


def script_files() -> list[str]:
    return sorted(p.name for p in (ASSETS / "scripts").glob("*.ps1"))


def machine_spec(work: Path, iso: Path, virtio_iso: Path, host_port: int) -> MachineSpec:
    return MachineSpec(
        name=NAME, machine="q35", memory_mib=MEMORY_MIB, vcpus=VCPUS, video="vga", firmware="bios",
        drives=[
            Drive(work / "disk.qcow2", "qcow2", "disk", "virtio"),
            Drive(iso, "raw", "cdrom", "sata"),
            Drive(virtio_iso, "raw", "cdrom", "sata"),
            Drive(work / "config.iso", "raw", "cdrom", "sata"),
        ],
        tablet="usb", hyperv=True, network="user", host_forwards=[(host_port, WINRM_PORT)], qga_channel=True,
    )


def runtime_spec(images_dir: Path) -> MachineSpec:
    """The machine the finished image is made for (what the provider's domain should match)."""
    return MachineSpec(
        name=NAME, machine="q35", memory_mib=MEMORY_MIB, vcpus=VCPUS, video="vga", firmware="bios",
        drives=[Drive(images_dir / NAME / "disk.qcow2", "qcow2", "disk", "virtio")],
        tablet="usb", hyperv=True, network="isolated", qga_channel=True,
    )


def manifest(version: str, disk_sha256: str, virtual_size: int | None) -> ImageManifest:
    return ImageManifest(
        name=NAME, os="windows", version=version,
        description="Windows 10 22H2, unattended build; WinRM (HTTP, NTLM) and the QEMU guest agent",
        shell="powershell", guest_channels=["winrm", "qemu-ga"], boot=FirmwareBoot(kind="bios"),
        machine="q35", memory_mib=MEMORY_MIB, vcpus=VCPUS, video="vga",
        disk=DiskFile(file="disk.qcow2", sha256=disk_sha256, virtual_size=virtual_size),
        network="isolated", tablet="usb", hyperv=True,
        winrm=WinRMChannel(port=WINRM_PORT, transport="ntlm", credentials=CREDENTIALS_FILE),
    )


def write_credentials(path: Path, username: str, password: str) -> None:
    """The image's account, readable by the runner's service user and nobody else: group
    `gh-runner`, mode 0640 (a build run with sudo would otherwise leave a root-only file the
    service cannot read). Without that group (a developer host), owner-only 0600."""
    try:
        gid: int | None = grp.getgrnam(SERVICE_GROUP).gr_gid
    except KeyError:
        gid = None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
        if gid is not None:
            os.fchown(fd, -1, gid)  # before any secret is written, and before the mode opens to the group
            os.fchmod(fd, 0o640)
        with os.fdopen(fd, "w") as f:
            fd = -1
            yaml.safe_dump({"username": username, "password": password}, f)
    finally:
        if fd != -1:
            os.close(fd)
    if gid is None:
        log(f"warning: no group {SERVICE_GROUP!r} here: {path.name} is 0600, readable only by "
            f"{pwd.getpwuid(os.getuid()).pw_name}; on a lab host run `chgrp {SERVICE_GROUP} FILE && chmod 0640 FILE`")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sha256_big(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
    return h.hexdigest()


def make_config_iso(work: Path, answer: str, sysprep_answer: str | None) -> Path:
    src = work / "config"
    src.mkdir(mode=0o700)
    (src / "scripts").mkdir()
    (src / "autounattend.xml").write_text(answer, encoding="utf-8")
    (src / "gh-config.txt").write_text("gh-runner image build configuration\r\n")
    if sysprep_answer is not None:
        (src / "sysprep-unattend.xml").write_text(sysprep_answer, encoding="utf-8")
    for f in (ASSETS / "scripts").glob("*.ps1"):
        shutil.copy2(f, src / "scripts" / f.name)
    out = work / "config.iso"
    proc.run(["genisoimage", "-quiet", "-J", "-r", "-V", "GHCONFIG", "-o", out, src], timeout=120)
    # The answer file carries the account password (encoded, not encrypted): only the build (root,
    # which runs QEMU directly) may read it.
    os.chmod(out, 0o600)
    shutil.rmtree(src)
    return out


def steps(args: argparse.Namespace, plan: BootPlan) -> list[str]:
    out = args.out
    return [
        f"check the ISOs exist and hash them (inputs of the image version): {args.iso}, {args.virtio_iso}",
        f"generate the '{Settings().username}' account password (kept only in {out / CREDENTIALS_FILE}, mode 0600)",
        "render autounattend.xml and check it against the answer-file schema "
        f"({len(check_unattend(render_autounattend(Settings(), None)))} problems now)",
        "make config.iso (label GHCONFIG): autounattend.xml, gh-config.txt, scripts/*.ps1"
        + (", sysprep-unattend.xml" if args.sysprep else ""),
        f"qemu-img create -f qcow2 disk.qcow2 {DISK_GIB}G",
        "boot the installer (Setup reads autounattend.xml from the config ISO; WinPE loads viostor/NetKVM; "
        "partitions, installs, reboots, OOBE skipped, autologon, first logon enables WinRM)",
        *pipeline.describe(plan, "WinRM on 127.0.0.1 (forwarded to the guest's 5985)"),
        f"qemu-img convert -c -O qcow2 disk.qcow2 {out / NAME / 'disk.qcow2'}",
        f"write {out / NAME / 'image.yaml'} (win10-22h2, os windows, shell powershell, channels winrm + qemu-ga) "
        f"and {out / CREDENTIALS_FILE}",
    ]


def format_argv(argv: list[str]) -> str:
    """One option and its value per line, shell-quoted: copy-pasteable and readable."""
    lines = [shlex.quote(argv[0])]
    i = 1
    while i < len(argv):
        if argv[i].startswith("-") and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            lines.append(f"{shlex.quote(argv[i])} {shlex.quote(argv[i + 1])}")
            i += 2
        else:
            lines.append(shlex.quote(argv[i]))
            i += 1
    return " \\\n    ".join(lines)


def dry_run(args: argparse.Namespace) -> int:
    provision, seal = provisioning(args.sysprep)
    plan = BootPlan("powershell", provision, seal, ready_timeout=3 * 3600, shutdown_timeout=1800,
                    check=_check_guest_agent, guest_powers_off=args.sysprep)
    work = Path("/var/tmp/gh-build-win10-XXXX")
    spec = machine_spec(work, args.iso, args.virtio_iso, 55985)
    answer = render_autounattend(Settings(), None)
    problems = check_unattend(answer)
    print(f"# windows-10 build plan (dry run: nothing is created or started)\n# output: {args.out / NAME}/")
    for p in (args.iso, args.virtio_iso):
        if not p.is_file():
            print(f"# note: {p} does not exist here; a real build needs it")
    accel = build_accelerator(image_kernel(args.out), None)  # a dry run writes nothing, not even the verdict
    print(f"# accelerator: kvm when a Linux kernel boots under it, else tcg (this host: {accel})\n")
    print("## steps")
    for i, s in enumerate(steps(args, plan), 1):
        print(f"{i:2}. {s}")
    print("\n## QEMU command line of the build VM (kvm)")
    print(format_argv(spec.argv("kvm", work)))
    print("\n## libvirt domain the image is made for")
    print(domain_xml(runtime_spec(args.out)))
    print("\n## image.yaml (checksum and version are filled in by the build)")
    print(pipeline.dump_manifest(manifest("22h2-<inputs hash>", "0" * 64, DISK_GIB << 30)))
    print("## autounattend.xml (password redacted)")
    print(answer)
    print(f"## answer-file schema check: {'passed' if not problems else 'FAILED'}")
    for p in problems:
        print(f"  - {p}")
    print("\n## provisioning scripts (run over WinRM, in order)")
    for script in [*provision, *seal]:
        print(f"  - {script.name} (timeout {script.timeout:.0f} s)")
    print("  - enable-winrm.ps1 runs earlier, from FirstLogonCommands")
    return 1 if problems else 0


def _check_guest_agent(vm: BuildVM) -> None:
    """the QEMU guest agent answers on its virtio-serial channel"""
    log(f"guest agent answered after {vm.qga.wait_ready(600):.1f} s")


def build(args: argparse.Namespace) -> int:
    out: Path = args.out.absolute()
    started = time.monotonic()
    settings = Settings()
    record: dict[str, object] = {
        "iso_sha256": _sha256_big(args.iso), "virtio_iso_sha256": _sha256_big(args.virtio_iso),
        "sources": hashlib.sha256(b"".join(p.read_bytes() for p in sorted(ASSETS.rglob("*")) if p.is_file()))
        .hexdigest(),
        "settings": settings.__dict__, "sysprep": args.sysprep, "disk_gib": DISK_GIB,
    }
    digest = pipeline.inputs_digest(record)
    version = f"22h2-{digest[:12]}"
    if not args.force and (existing := pipeline.up_to_date(out / NAME, digest)) is not None:
        if (out / CREDENTIALS_FILE).is_file():
            log(f"{NAME} {existing.version} is up to date in {out / NAME}")
            return 0
    password = secrets.token_urlsafe(18)
    work = Path(tempfile.mkdtemp(prefix="gh-build-win10-", dir="/var/tmp"))
    os.chmod(work, 0o755)
    staging: Path | None = None
    cred_tmp = out / f".{CREDENTIALS_FILE}.tmp"
    try:
        answer = render_autounattend(settings, password)
        problems = check_unattend(answer)
        if problems:
            raise BuildError("the answer file fails the schema check: " + "; ".join(problems))
        sysprep_answer = render_autounattend(settings, password, passes={"specialize", "oobeSystem"}) \
            if args.sysprep else None
        make_config_iso(work, answer, sysprep_answer)
        proc.run(["qemu-img", "create", "-q", "-f", "qcow2", work / "disk.qcow2", f"{DISK_GIB}G"], timeout=60)
        port = _free_port()
        # Windows is no Linux kernel: the decision boots one of the images beside it, or this host's.
        accel = build_accelerator(image_kernel(out), DEFAULT_CACHE)
        if accel != "kvm":
            log("warning: no usable KVM here; a Windows build under TCG takes many hours")
        vm = BuildVM(machine_spec(work, args.iso.absolute(), args.virtio_iso.absolute(), port), accel, work)
        channel = WinRMBuildChannel("127.0.0.1", port, settings.username, password)
        provision, seal = provisioning(args.sysprep)
        plan = BootPlan("powershell", provision, seal, ready_timeout=3 * 3600, shutdown_timeout=1800,
                        check=_check_guest_agent, guest_powers_off=args.sysprep)
        pipeline.boot_provision_seal(vm, channel, plan)
        staging = pipeline.staging_dir(out, NAME)
        pipeline.convert_compressed(work / "disk.qcow2", "qcow2", staging / "disk.qcow2")
        m = manifest(version, sha256_file(staging / "disk.qcow2"), DISK_GIB << 30)
        write_credentials(cred_tmp, settings.username, password)
        pipeline.publish(staging, m, record, digest)
        staging = None
        os.replace(cred_tmp, out / CREDENTIALS_FILE)
        log(f"{NAME} {version} written to {out / NAME} in {(time.monotonic() - started) / 60:.0f} min")
        return 0
    finally:
        if staging is not None:
            pipeline.discard(staging)
        cred_tmp.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)


def main(args: argparse.Namespace) -> int:
    if args.iso is None or args.virtio_iso is None:
        raise BuildError("windows-10 needs --iso (Windows 10 22H2) and --virtio-iso (virtio-win)")
    if args.dry_run:
        return dry_run(args)
    for p, flag in ((args.iso, "--iso"), (args.virtio_iso, "--virtio-iso")):
        if not p.is_file():
            raise BuildError(f"{flag} {p}: no such file")
    if shutil.which("genisoimage") is None:
        raise BuildError("genisoimage is not installed (apt-get install genisoimage)")
    with pipeline.build_lock(args.out.absolute(), NAME):
        return build(args)
