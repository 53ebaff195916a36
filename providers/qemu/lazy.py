"""Lazy restore: a machine's RAM mapped copy-on-write from its snapshot's RAM file, not read.

How (QEMU 7.2, libvirt 9.0), as Kata's VM templating does it:
- The snapshot machine boots with its RAM in a file (`memory-backend-file share=on`), so the RAM
  file holds the guest's memory. Its device state is saved with the `x-ignore-shared` migration
  capability: RAM in shared files is left out, and the stream is a few hundred KB.
- A new machine maps that file `share=off` (a private mapping: pages load on first touch, writes
  stay in the machine, N machines share what none of them wrote), starts with `-incoming defer`,
  and takes the device state through `migrate-incoming` with `x-ignore-shared` on.

What libvirt cannot do, so QMP does it (through libvirt's monitor passthrough, the domain tainted
"custom-monitor"): libvirt 9.0's `<memoryBacking><source type='file'/>` puts the file at a path of
its own choosing (memory_backing_dir/<domain id>-<name>/pc.ram, removed when the domain stops), so
the RAM backend is added as `<qemu:commandline>` args instead; libvirt knows no `x-ignore-shared`
and QEMU 7.2 has no `-global migration.x-ignore-shared`, so the capability is set by QMP; libvirt
cannot start a domain waiting for an incoming stream except through its own restore (which reads
the whole stream), so `-incoming defer` is an arg too, and `migrate-incoming` gets its fd by
`getfd` (qemuMonitorCommandWithFiles, libvirt >= 8.2): QEMU's seccomp sandbox forbids `exec:`.
"""

from __future__ import annotations

import json
import os
import pwd
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import libvirt

from providers.errors import ProviderError
from providers.qemu.connection import Connection
from providers.qemu.handle import Domain

QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
RAM_ID = "gh.ram"  # the RAM block's name: the same in the snapshot machine and every copy
RAM_FILE = "ram"
DEVSTATE_FILE = "devstate"
FD_NAME = "gh-migration"
QEMU_USER = "libvirt-qemu"
POLL_S = 0.005


def has_lazy(snapshot_dir: Path) -> bool:
    return (snapshot_dir / RAM_FILE).is_file() and (snapshot_dir / DEVSTATE_FILE).is_file()


def make_ram_file(path: Path, size_bytes: int) -> None:
    """A sparse RAM file QEMU (running as libvirt-qemu) can open read-write: QEMU opens a backend
    file O_RDWR whatever `share` is; with share=off nothing is ever written back."""
    with path.open("wb") as f:
        f.truncate(size_bytes)
    try:
        qemu = pwd.getpwnam(QEMU_USER)
    except KeyError:
        raise ProviderError(f"no user {QEMU_USER}: lazy restore needs qemu:///system") from None
    os.chown(path, qemu.pw_uid, qemu.pw_gid)
    path.chmod(0o600)


def with_ram_file(xml: str, ram: Path, size_mib: int, *, share: bool, incoming: bool) -> str:
    """The domain XML with its RAM in `ram` (and, for a copy, waiting for an incoming stream)."""
    ET.register_namespace("qemu", QEMU_NS)
    root = ET.fromstring(xml)
    args = ["-object", f"memory-backend-file,id={RAM_ID},size={size_mib}M,mem-path={ram},"
                       f"share={'on' if share else 'off'}",
            "-machine", f"memory-backend={RAM_ID}"]
    if incoming:
        args += ["-incoming", "defer"]
    cl = ET.SubElement(root, f"{{{QEMU_NS}}}commandline")
    for a in args:
        ET.SubElement(cl, f"{{{QEMU_NS}}}arg", value=a)
    return ET.tostring(root, encoding="unicode")


def standalone_ram(xml: str) -> str:
    """A saved XML of a machine whose RAM was a snapshot's file, made for a full restore: the RAM
    becomes anonymous memory under the same block name (the stream carries all of it), so the
    restore neither writes into nor depends on the file lazy copies map, and the `-incoming` arg
    goes (libvirt's restore adds its own)."""
    ET.register_namespace("qemu", QEMU_NS)
    root = ET.fromstring(xml)
    changed = False
    for cl in root.findall(f"{{{QEMU_NS}}}commandline"):
        args = cl.findall(f"{{{QEMU_NS}}}arg")
        for i, arg in enumerate(args):
            v = arg.get("value", "")
            if v.startswith(f"memory-backend-file,id={RAM_ID},"):
                size = next((p for p in v.split(",") if p.startswith("size=")), "")
                arg.set("value", f"memory-backend-ram,id={RAM_ID},{size}")
                changed = True
            elif v == "-incoming" and i + 1 < len(args):
                cl.remove(arg)
                cl.remove(args[i + 1])
                changed = True
    return ET.tostring(root, encoding="unicode") if changed else xml


def _qmp(dom: libvirt.virDomain, cmd: str, args: dict[str, Any] | None = None, fd: int | None = None) -> Any:
    import libvirt_qemu

    msg: dict[str, Any] = {"execute": cmd}
    if args:
        msg["arguments"] = args
    if fd is not None:
        out, _ = libvirt_qemu.qemuMonitorCommandWithFiles(dom, json.dumps(msg), [fd], 0)
    else:
        out = libvirt_qemu.qemuMonitorCommand(dom, json.dumps(msg), 0)
    reply = json.loads(out)
    if "error" in reply:
        raise ProviderError(f"QEMU refused {cmd}: {reply['error'].get('desc', reply['error'])}")
    return reply.get("return")


def _ignore_shared(dom: libvirt.virDomain, on: bool) -> None:
    _qmp(dom, "migrate-set-capabilities", {"capabilities": [{"capability": "x-ignore-shared", "state": on}]})


def _wait_migration(dom: libvirt.virDomain, deadline: float, what: str) -> None:
    while True:
        info = _qmp(dom, "query-migrate") or {}
        status = info.get("status")
        if status == "completed":
            return
        if status in ("failed", "cancelled"):
            raise ProviderError(f"{what} {status}: {info.get('error-desc', 'no reason given')}")
        if time.monotonic() > deadline:
            raise ProviderError(f"{what} did not finish in time (status {status})")
        time.sleep(POLL_S)


def save_devstate_blocking(domain: Domain, dest: Path, timeout: float) -> None:
    """Write the paused machine's device state, without its file-backed RAM, to `dest`; the machine
    stays paused and can still be saved in full by libvirt afterwards."""
    deadline = time.monotonic() + timeout

    def go(_c: libvirt.virConnect, dom: libvirt.virDomain) -> None:
        _ignore_shared(dom, True)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # QEMU gets fds, not the path
        try:
            _qmp(dom, "getfd", {"fdname": FD_NAME}, fd=fd)
        finally:
            os.close(fd)
        _qmp(dom, "migrate", {"uri": f"fd:{FD_NAME}"})
        try:
            _wait_migration(dom, deadline, "saving the device state")
        finally:
            _ignore_shared(dom, False)  # libvirt's own save after this must carry the RAM

    domain.call_blocking(go, retry=False)


def qemu_started_ago(name: str) -> float | None:
    """Seconds since the domain's QEMU process started (10 ms resolution), from libvirt's pid file:
    how a start splits into libvirt's work before the exec and after it."""
    try:
        pid = Path(f"/run/libvirt/qemu/{name}.pid").read_text().strip()
        start_ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
    return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")


def restore_blocking(conn: Connection, xml: str, devstate: Path, timeout: float,
                     resume: bool = True) -> dict[str, float]:
    """Start a domain from `xml` (made by `with_ram_file(..., incoming=True)`), feed it the device
    state, and resume it (or leave it paused); returns seconds per step. On failure the half-made
    domain is left for the caller to destroy."""
    deadline = time.monotonic() + timeout
    steps: dict[str, float] = {}

    def go(c: libvirt.virConnect) -> None:
        t0 = time.monotonic()
        dom = c.createXML(xml, libvirt.VIR_DOMAIN_START_PAUSED)
        t1 = time.monotonic()
        ago = qemu_started_ago(dom.name())
        if ago is not None:  # libvirt before QEMU's exec, and from the exec until createXML returned
            steps["libvirt_before_exec"] = round(max(0.0, (t1 - t0) - ago), 3)
            steps["qemu_start_to_paused"] = round(min(ago, t1 - t0), 3)
        steps["start_paused"] = round(t1 - t0, 3)
        _ignore_shared(dom, True)
        fd = os.open(devstate, os.O_RDONLY)
        try:
            _qmp(dom, "getfd", {"fdname": FD_NAME}, fd=fd)
        finally:
            os.close(fd)
        _qmp(dom, "migrate-incoming", {"uri": f"fd:{FD_NAME}"})
        _wait_migration(dom, deadline, "restoring the device state")
        # Off again: a later libvirt save of this machine (a start state) must carry all its RAM,
        # and a stream marked x-ignore-shared is refused by the restore that reads it back.
        _ignore_shared(dom, False)
        t2 = time.monotonic()
        steps["device_state"] = round(t2 - t1, 3)
        if resume:
            dom.resume()
            steps["resume"] = round(time.monotonic() - t2, 3)

    conn.call(go, retry=False)
    return steps
