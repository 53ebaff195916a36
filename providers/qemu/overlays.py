"""qcow2 files through qemu-img: O(1) overlays, start-state version disks, and a checked delete."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

from providers.errors import ProviderError
from providers.qemu import fileperms

QEMU_IMG = "qemu-img"


async def run_cmd(argv: list[str], *, timeout: float, what: str, stdin: bytes | None = None,
                  missing: str | None = None) -> str:
    """Run a host command with a deadline (feeding it `stdin`); a failure becomes a ProviderError
    carrying its stderr. `missing` replaces the reason given when the command is not installed."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE if stdin is not None else None, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True
        )
    except FileNotFoundError:
        raise ProviderError(f"{what}: {missing or f'{argv[0]} is not installed'}") from None
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate(stdin)
    except TimeoutError:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await proc.wait()
        raise ProviderError(f"{what}: {argv[0]} did not finish within {timeout:g}s") from None
    if proc.returncode != 0:
        reason = err.decode(errors="replace").strip().splitlines()
        raise ProviderError(f"{what}: {reason[-1] if reason else f'exit code {proc.returncode}'}")
    return out.decode(errors="replace")


async def create_overlay(base: Path, overlay: Path, *, timeout: float = 30) -> None:
    """A copy-on-write qcow2 over `base`: constant time whatever the base's size."""
    overlay.parent.mkdir(parents=True, exist_ok=True)
    await run_cmd(
        [QEMU_IMG, "create", "-q", "-f", "qcow2", "-b", str(base), "-F", "qcow2", str(overlay)],
        timeout=timeout, what=f"creating overlay {overlay.name}",
    )
    await asyncio.to_thread(fileperms.disk_file, overlay)


async def image_info(path: Path, *, timeout: float = 30) -> dict[str, object]:
    out = await run_cmd([QEMU_IMG, "info", "-U", "--output=json", str(path)], timeout=timeout,
                        what=f"reading {path.name}")
    info = json.loads(out)
    if not isinstance(info, dict):
        raise ProviderError(f"reading {path.name}: unexpected qemu-img output")
    return info


async def write_version_disk(overlay: Path, base: Path, dest: Path, *, flatten: bool, timeout: float = 600) -> None:
    """Write an immutable disk for a start-state version (the machine must be paused or stopped).

    `flatten=False` (what the provider uses) writes a depth-1 overlay over the image's base: a copy
    of the machine's overlay, then a safe `qemu-img rebase` onto `base`, which pulls in whatever an
    intermediate version held. Cost follows what changed, and versions never depend on each other,
    so deleting one never breaks another. (`qemu-img convert -B` is not usable here: it copies only
    the top layer and silently drops an intermediate version's data.) `flatten=True` writes a
    standalone copy whose cost follows the whole disk; bench/provider_start.py measures both.
    """
    tmp = dest.with_name(dest.name + ".partial")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        if flatten:
            await run_cmd([QEMU_IMG, "convert", "-U", "-O", "qcow2", str(overlay), str(tmp)],
                          timeout=timeout, what=f"writing version disk {dest}")
        else:
            await run_cmd(["cp", "--sparse=always", str(overlay), str(tmp)], timeout=timeout,
                          what=f"copying overlay for {dest}")
            # -U: the layers under the copy may still be held by the machine's QEMU (a live save's frozen
            # overlay, one a block commit wrote into), though none is written any more.
            await run_cmd([QEMU_IMG, "rebase", "-U", "-q", "-b", str(base), "-F", "qcow2", str(tmp)],
                          timeout=timeout, what=f"writing version disk {dest}")
        fileperms.disk_file(tmp, read_only=True)
        tmp.rename(dest)
    finally:
        tmp.unlink(missing_ok=True)
