"""A running machine's memory and disk kept while the guest runs (a save point, a start state with memory).

libvirt 9.0's `virDomainSave` stops the domain for the whole memory write, so a save used to stop the
guest for seconds (4.4 s on linux-tiny, 4.8 s on linux-desktop under TCG: docs/start-states.md). Here
the save is a live external snapshot instead, in three phases, each with its own deadline:

1. `snapshot`: libvirt writes the memory image as a migration to a file while the guest runs (QEMU's
   pre-copy: dirty pages are sent again until what is left fits its downtime), then pauses the guest
   for the last pages and, at that same moment, makes the disk's current overlay a read-only backing
   file of a new, empty one the guest writes to from then on. If the guest dirties memory faster than
   it is written, the copy would not end: after `converge_s` the guest is paused so the rest is
   written (and resumed after). No snapshot metadata is kept (`NO_METADATA`): the domain is
   transient, and the files are ours.
2. `copy`: the frozen overlay, now read by nobody but its new child, is copied to the version's disk
   while the guest runs on.
3. `commit`: an active block commit folds the new overlay back into the old one and pivots the guest
   onto it, so the machine's chain is one overlay deep again and its file is the one it always had;
   the new overlay is then removed. If the commit fails, the save still stands: the machine just
   runs on the deeper chain, on the new file (`left_on` is told), and the next save folds it back
   first (`fold`), or fails saying why.

The memory image is the format `virDomainSave` writes (libvirt's save image), so restoring it is
what restoring any memory image is (starts.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import libvirt
import structlog

from providers.errors import ProviderError
from providers.qemu.handle import CALL_TIMEOUT, Domain

log = structlog.get_logger("providers.qemu")

# ATOMIC: a snapshot that fails leaves the guest on its overlay, so the new file can simply go.
SNAPSHOT_FLAGS = (libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_LIVE | libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_NO_METADATA
                  | libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_ATOMIC)
# Past this the guest is paused so its memory copy ends: a busy desktop under KVM can dirty pages
# faster than a disk takes them. Under TCG a guest dirties slowly; the copy ends well before.
CONVERGE_S = 30.0
COMMIT_POLL_S = 0.05
SNAPSHOT_TIMEOUT_S = 600.0
COMMIT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class LiveSave:
    """How a live save went: what the guest runs on now, and whether it was paused to end the copy."""

    forced_pause: bool  # the memory copy did not end on its own within converge_s
    snapshot_s: float  # memory written, disk switched (the guest paused only at its end)
    copy_s: float
    commit_s: float


def snapshot_xml(disk_target: str, memory: Path, next_overlay: Path) -> str:
    snap = ET.Element("domainsnapshot")
    ET.SubElement(snap, "memory", snapshot="external", file=str(memory))
    disks = ET.SubElement(snap, "disks")
    disk = ET.SubElement(disks, "disk", name=disk_target, snapshot="external", type="file")
    ET.SubElement(disk, "driver", type="qcow2")
    ET.SubElement(disk, "source", file=str(next_overlay))
    return ET.tostring(snap, encoding="unicode")


def disk_target(domain_xml: str, overlay: Path) -> str:
    """The target (vda, sda) of the disk whose source is `overlay`. Raises ProviderError."""
    for disk in ET.fromstring(domain_xml).iter("disk"):
        source, target = disk.find("source"), disk.find("target")
        if source is not None and target is not None and source.get("file") == str(overlay):
            return str(target.get("dev"))
    raise ProviderError(f"the machine's domain has no disk on {overlay}")


async def save_live(domain: Domain, overlay: Path, memory: Path, *,
                    copy_disk: Callable[[Path], Awaitable[None]], left_on: Callable[[Path], None],
                    converge_s: float = CONVERGE_S) -> LiveSave:
    """Write `memory` and (through `copy_disk(frozen_overlay)`) the disk of the running machine on `overlay`,
    the guest running on; `left_on(path)` when the guest runs on another file over `overlay` afterwards
    (the commit failed). Raises ProviderError when the snapshot or the copy failed (the machine runs on)."""
    xml = await domain.call("reading the machine's disks", lambda _c, dom: dom.XMLDesc(0))
    target = disk_target(xml, overlay)
    next_overlay = overlay.with_name(f"{overlay.stem}.next-{secrets.token_hex(3)}{overlay.suffix}")

    # -- phase: snapshot --------------------------------------------------------------------------
    t0 = time.monotonic()
    try:
        forced = await _snapshot(domain, snapshot_xml(target, memory, next_overlay), converge_s)
    except BaseException:
        await asyncio.to_thread(next_overlay.unlink, missing_ok=True)
        raise
    snapshot_s = time.monotonic() - t0

    # -- phase: copy ------------------------------------------------------------------------------
    t1 = time.monotonic()
    try:
        await copy_disk(overlay)
    finally:
        copy_s = time.monotonic() - t1
        # -- phase: commit (even when the copy failed: the chain goes back to one overlay) -----------
        t2 = time.monotonic()
        try:
            await fold(domain, overlay, next_overlay, target=target)
        except ProviderError as e:
            log.warning("the save's overlay could not be folded back; the machine runs on it", domain=domain.name,
                        overlay=str(next_overlay), reason=str(e))
            left_on(next_overlay)
        commit_s = time.monotonic() - t2
    log.info("machine saved live", domain=domain.name, forced_pause=forced, snapshot_s=round(snapshot_s, 3),
             copy_s=round(copy_s, 3), commit_s=round(commit_s, 3))
    return LiveSave(forced_pause=forced, snapshot_s=snapshot_s, copy_s=copy_s, commit_s=commit_s)


async def _snapshot(domain: Domain, xml: str, converge_s: float) -> bool:
    """The live snapshot; True when the guest had to be paused for its memory copy to end."""
    snap = asyncio.ensure_future(domain.call(
        "saving the machine while it runs", lambda _c, dom: dom.snapshotCreateXML(xml, SNAPSHOT_FLAGS),
        timeout=SNAPSHOT_TIMEOUT_S, retry=False))
    forced = False
    try:
        done, _ = await asyncio.wait({snap}, timeout=converge_s)
        if not done:
            forced = True
            log.warning("the machine's memory copy did not end while it ran; pausing it", domain=domain.name,
                        converge_s=converge_s)
            with contextlib.suppress(ProviderError):  # the copy may have ended meanwhile
                await domain.suspend("pausing the machine so its memory copy ends")
        await snap
    except BaseException:
        if not snap.done():
            snap.cancel()
        with contextlib.suppress(ProviderError):  # a snapshot past its deadline is still libvirt's job
            await domain.call("abandoning the machine's save", lambda _c, dom: dom.abortJob(), retry=False)
        raise
    finally:
        if forced:
            with contextlib.suppress(ProviderError):
                if await domain.state() == libvirt.VIR_DOMAIN_PAUSED:
                    await domain.resume("resuming the machine after its save")
    return forced


async def fold(domain: Domain, overlay: Path, top: Path, *, target: str | None = None) -> None:
    """Fold `top` (the guest's active file, over `overlay`) into `overlay` and pivot the guest onto it; `top`
    is removed. Raises ProviderError (the job abandoned: the guest runs on `top` as before)."""
    if target is None:
        target = disk_target(await domain.call("reading the machine's disks", lambda _c, dom: dom.XMLDesc(0)), top)

    def start(_c: libvirt.virConnect, dom: libvirt.virDomain) -> None:
        dom.blockCommit(target, None, None, 0,
                        libvirt.VIR_DOMAIN_BLOCK_COMMIT_ACTIVE | libvirt.VIR_DOMAIN_BLOCK_COMMIT_SHALLOW)

    def ready(_c: libvirt.virConnect, dom: libvirt.virDomain) -> bool:
        info = dom.blockJobInfo(target, 0)
        if not info:
            raise ProviderError("the block commit ended before its pivot")
        return bool(info["end"] > 0 and info["cur"] == info["end"])

    try:
        await domain.call("folding the save's overlay back", start, retry=False)
        # libvirt tells a job's end by an event only through an event loop thread, which nothing here
        # runs (diskcap.py says the same): the job's progress is polled instead.
        async with asyncio.timeout(COMMIT_TIMEOUT_S):
            while not await domain.call("watching the block commit", ready):  # noqa: ASYNC110
                await asyncio.sleep(COMMIT_POLL_S)
        await domain.call("pivoting onto the machine's overlay",
                          lambda _c, dom: dom.blockJobAbort(target, libvirt.VIR_DOMAIN_BLOCK_JOB_ABORT_PIVOT),
                          retry=False)
    except (ProviderError, TimeoutError) as e:
        with contextlib.suppress(ProviderError):
            await domain.call("abandoning the block commit", lambda _c, dom: dom.blockJobAbort(target, 0),
                              timeout=CALL_TIMEOUT, retry=False)
        raise ProviderError(f"folding {top.name} back into {overlay.name}: "
                            f"{str(e) or f'the block commit did not end within {COMMIT_TIMEOUT_S:g}s'}") from None
    await asyncio.to_thread(top.unlink, missing_ok=True)
