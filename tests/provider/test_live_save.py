"""A save with memory keeps the machine running: its memory is written while the guest runs and its disk
frozen at that moment (providers/qemu/livesave.py), on real libvirt and linux-tiny. The same QEMU process
carries on (a save used to stop the domain and restore it), the machine is back on its one overlay with
nothing beside it, and a machine made from the save holds what the guest held then and nothing after.
The two fallbacks run for real too: a guest paused so its memory copy ends, and a block commit that does
not end in time (the machine runs on the deeper chain, and its next save still holds everything)."""

from __future__ import annotations

import secrets
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from providers.base import MachineSource
from providers.qemu import QemuMachine, QemuProvider, livesave

from .conftest import Machines

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


def qemu_pid(m: QemuMachine) -> int:
    return int(Path(f"/run/libvirt/qemu/{m.domain_name}.pid").read_text())


async def disk_chain(m: QemuMachine) -> list[str]:
    """The files of the machine's disk, active first, down to the image's base."""
    xml = await m.domain.call("reading the disks", lambda _c, dom: dom.XMLDesc(0))
    disk = next(d for d in ET.fromstring(xml).iter("disk") if d.get("device") == "disk")
    chain, node = [], disk
    while node is not None and (src := node.find("source")) is not None:
        chain.append(str(src.get("file")))
        node = node.find("backingStore")
    return chain


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.suffix == ".qcow2")


async def restored_holds(machines: Machines, sp: str, script: str) -> str:
    m = await machines.create(MachineSource(image="linux-tiny", start_state_id=sp, version=1))
    assert m.restored
    out = (await m.run_script(script, timeout=60)).stdout
    await m.destroy()
    return out


async def test_a_save_with_memory_keeps_the_same_qemu_running_on_its_own_overlay(
        provider: QemuProvider, machines: Machines) -> None:
    m = await machines.create()
    await m.run_script("echo before > /root/mark; sync", timeout=60)
    pid, chain = qemu_pid(m), await disk_chain(m)
    sp = f"ss_live{secrets.token_hex(3)}"
    try:
        saved = await m.save(sp, 1, with_memory=True)
        assert saved.memory_image is not None and saved.memory_image.is_file()
        assert qemu_pid(m) == pid, "the domain was stopped and started again for the save"
        assert await disk_chain(m) == chain and files_in(m.dir) == ["disk.qcow2"]  # folded back, nothing beside
        after = await m.run_script("echo after > /root/mark; sync; cat /root/mark", timeout=60)
        assert after.stdout == "after\n"
        assert await restored_holds(machines, sp, "cat /root/mark") == "before\n"
    finally:
        await provider.delete_version(sp, 1)


async def test_a_guest_paused_to_end_its_memory_copy_runs_on_after_it(
        provider: QemuProvider, machines: Machines, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(livesave, "CONVERGE_S", 0.0)  # paused at once: the fallback for a guest dirtying fast
    m = await machines.create()
    await m.run_script("echo before > /root/mark; sync", timeout=60)
    sp = f"ss_live{secrets.token_hex(3)}"
    try:
        await m.save(sp, 1, with_memory=True)
        assert await m.domain.state() == 1, "the guest was left paused"  # VIR_DOMAIN_RUNNING
        assert (await m.run_script("cat /root/mark", timeout=60)).stdout == "before\n"
        assert await restored_holds(machines, sp, "cat /root/mark") == "before\n"
    finally:
        await provider.delete_version(sp, 1)


async def test_a_commit_that_does_not_end_leaves_the_machine_on_the_new_overlay_until_its_next_save(
        provider: QemuProvider, machines: Machines, monkeypatch: pytest.MonkeyPatch) -> None:
    m = await machines.create()
    await m.run_script("echo one > /root/one; sync", timeout=60)
    sp1, sp2 = f"ss_live{secrets.token_hex(3)}", f"ss_live{secrets.token_hex(3)}"
    try:
        monkeypatch.setattr(livesave, "COMMIT_TIMEOUT_S", 0.0)
        await m.save(sp1, 1, with_memory=True)  # the save stands; the guest runs on the file over its overlay
        chain = await disk_chain(m)
        assert chain[1] == str(m.overlay) and chain[0] != chain[1] and len(files_in(m.dir)) == 2, chain
        monkeypatch.undo()
        await m.run_script("echo two > /root/two; sync", timeout=60)
        await m.save(sp2, 1, with_memory=True)  # folds that file back first
        assert (await disk_chain(m))[0] == str(m.overlay) and files_in(m.dir) == ["disk.qcow2"]
        assert (await m.run_script("cat /root/one /root/two", timeout=60)).stdout == "one\ntwo\n"
        assert await restored_holds(machines, sp1, "cat /root/one; [ -e /root/two ] || echo no-two") == "one\nno-two\n"
        assert await restored_holds(machines, sp2, "cat /root/one /root/two") == "one\ntwo\n"
    finally:
        await provider.delete_version(sp1, 1)
        await provider.delete_version(sp2, 1)
