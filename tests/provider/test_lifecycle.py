"""Machines coming and going through real libvirt: isolation, readiness, warm start, reaping, errors."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import pytest
from kit.libvirt import LIBVIRT_URI, domains

from providers.base import CheckStatus, MachineSource
from providers.errors import MachineNotReady, ProviderError
from providers.qemu import QemuProvider

from .conftest import BOOT_TIMEOUT, Machines, make_provider

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


def domain_exists(name: str) -> bool:
    return name in domains(name)


async def test_two_machines_from_one_base_do_not_see_each_others_writes(machines: Machines) -> None:
    a, b = await asyncio.gather(machines.create(), machines.create())
    assert a.overlay != b.overlay
    wa = await a.run_script("echo from-a > /root/mark && sync && cat /root/mark", timeout=60)
    assert wa.stdout == "from-a\n"
    rb = await b.run_script("cat /root/mark 2>/dev/null || echo absent; echo from-b > /root/mark; sync", timeout=60)
    assert rb.stdout == "absent\n"
    ra = await a.run_script("cat /root/mark", timeout=60)
    assert ra.stdout == "from-a\n"


async def test_a_guest_agent_not_connected_yet_leaves_the_shared_connection_alone(
        provider: QemuProvider, machines: Machines) -> None:
    # A booting guest's agent answers "not connected": a normal answer, not a broken libvirt
    # connection. Treating it as one once closed the connection under other threads' calls, and a
    # machine start then failed with "domain ... is already active" (its createXML ran twice).
    conn = provider.conn.get()
    m = await machines.create(ready=False)
    with pytest.raises(ProviderError, match=r"not answering|not connected"):
        await m.agent.ping(timeout=2)
    assert provider.conn.get() is conn
    await m.wait_ready(BOOT_TIMEOUT)
    assert provider.conn.get() is conn


async def test_machines_started_while_another_boots_all_start(provider: QemuProvider, machines: Machines) -> None:
    # The failure above under load: one machine polling its agent while others start.
    booting = await machines.create(ready=False)
    polls = asyncio.create_task(booting.wait_ready(BOOT_TIMEOUT))
    more = await asyncio.gather(*(machines.create(ready=False) for _ in range(3)))
    await polls
    for m in more:
        await m.wait_ready(BOOT_TIMEOUT)


async def test_machine_that_does_not_answer_errors_after_the_ready_deadline(machines: Machines) -> None:
    m = await machines.create(ready=False)
    started = time.monotonic()
    with pytest.raises(MachineNotReady, match=r"did not answer within 0\.5s"):
        await m.wait_ready(0.5)
    assert time.monotonic() - started < 15


async def test_machine_whose_guest_agent_never_starts_errors_after_the_deadline(
        provider: QemuProvider, machines: Machines, tmp_path_factory: pytest.TempPathFactory) -> None:
    # An image copy whose kernel command line stops in the initramfs shell: qemu-ga never starts.
    src = provider.images_dir / "linux-tiny"
    broken_images = Path(provider.state_dir) / "broken-images"
    dst = broken_images / "linux-tiny"
    dst.mkdir(parents=True, exist_ok=True)
    for d in (broken_images, dst):
        d.chmod(0o755)
    for f in src.iterdir():
        if f.name != "image.yaml":
            (dst / f.name).symlink_to(f)
    text = (src / "image.yaml").read_text().replace("cmdline: ", "cmdline: rdinit=/bin/sh ", 1)
    (dst / "image.yaml").write_text(text)
    broken = QemuProvider(broken_images, provider.state_dir, provider.runner_name, LIBVIRT_URI)
    ms = Machines(broken)
    try:
        m = await ms.create(ready=False)
        started = time.monotonic()
        with pytest.raises(MachineNotReady):
            await m.wait_ready(20)
        assert time.monotonic() - started < 40
    finally:
        await ms.destroy_all()
        await broken.close()


async def test_warm_start_from_a_memory_image_is_faster_than_a_cold_boot(provider: QemuProvider,
                                                                          machines: Machines) -> None:
    started = time.monotonic()
    cold = await machines.create()
    cold_s = time.monotonic() - started
    await cold.run_script("echo saved-state > /root/state; sync", timeout=60)
    saved = await cold.save("ss_warmtest", 1, with_memory=True)
    assert saved.memory_image is not None and saved.memory_image.is_file() and saved.disk_path.is_file()
    assert ("ss_warmtest", 1) in await provider.held_versions()
    # The saved machine carries on running.
    assert (await cold.run_script("cat /root/state", timeout=60)).stdout == "saved-state\n"
    try:
        # Two warm machines from one version at once: each gets its own identity.
        t0 = time.monotonic()
        w1, w2 = await asyncio.gather(
            machines.create(MachineSource(image="linux-tiny", start_state_id="ss_warmtest", version=1)),
            machines.create(MachineSource(image="linux-tiny", start_state_id="ss_warmtest", version=1)))
        warm_s = time.monotonic() - t0
        assert w1.restored and w2.restored
        assert warm_s < cold_s, (warm_s, cold_s)
        for w in (w1, w2):
            r = await w.run_script("cat /root/state; date +%s", timeout=60)
            state, clock = r.stdout.split()
            assert state == "saved-state"
            assert abs(int(clock) - time.time()) < 30  # the guest clock was set after the restore
        await w1.run_script("echo w1 > /root/state; sync", timeout=60)
        assert (await w2.run_script("cat /root/state", timeout=60)).stdout == "saved-state\n"
    finally:
        await provider.delete_version("ss_warmtest", 1)
    assert ("ss_warmtest", 1) not in await provider.held_versions()
    with pytest.raises(ProviderError, match="not stored"):
        await provider.create_machine("at_gone", MachineSource(image="linux-tiny", start_state_id="ss_warmtest",
                                                               version=1), timeout=BOOT_TIMEOUT)


async def test_disk_only_version_boots_cold_with_the_saved_disk(provider: QemuProvider, machines: Machines) -> None:
    src = await machines.create()
    await src.run_script("echo disk-only > /root/state", timeout=60)
    saved = await src.save("ss_disktest", 3, with_memory=False)
    assert saved.memory_image is None
    with pytest.raises(ProviderError, match="immutable"):
        await src.save("ss_disktest", 3, with_memory=False)
    try:
        m = await machines.create(MachineSource(image="linux-tiny", start_state_id="ss_disktest", version=3))
        assert not m.restored
        assert (await m.run_script("cat /root/state", timeout=60)).stdout == "disk-only\n"
    finally:
        await provider.delete_version("ss_disktest", 3)


async def test_reap_removes_leftover_domains_and_overlays(images_dir: Path, state_root: Path) -> None:
    crashed = make_provider(images_dir, state_root, "provtestreap", "reap")
    ms = Machines(crashed)
    try:
        gone = await ms.create(machine_id="at_leftover", ready=False)
        kept = await ms.create(machine_id="at_kept", ready=False)
        zombie = crashed.machines_dir / "gh-provtestreap-at_zombie"
        zombie.mkdir()
        (zombie / "disk.qcow2").write_bytes(b"x")
        (zombie / "owner.json").write_text(json.dumps({"runner": "provtestreap", "machine_id": "at_zombie"}))
        # A restarted runner: a new provider object on the same state dir knows nothing in memory.
        restarted = make_provider(images_dir, state_root, "provtestreap", "reap")
        removed = await restarted.reap({"at_kept"})
        assert sorted(removed) == ["at_leftover", "at_zombie"]
        assert not domain_exists(gone.domain_name) and not gone.dir.exists() and not zombie.exists()
        assert domain_exists(kept.domain_name) and kept.overlay.is_file()
        await restarted.close()
    finally:
        await ms.destroy_all()
    assert not domain_exists(kept.domain_name) and not kept.dir.exists()


def domain_uuid(name: str) -> str:
    out = subprocess.run(["virsh", "-c", LIBVIRT_URI, "domuuid", name], capture_output=True, text=True, timeout=30)
    return out.stdout.strip()


async def test_a_dead_processs_leftover_with_the_same_id_is_replaced(images_dir: Path, state_root: Path) -> None:
    # A runner killed while starting an attempt's machine; the server re-leases that attempt (same id)
    # to the restarted runner, whose provider must replace the leftover rather than fail.
    dead, restarted = (make_provider(images_dir, state_root, "provtestdup", "dup") for _ in range(2))
    old_ms, new_ms = Machines(dead), Machines(restarted)
    try:
        old = await old_ms.create(machine_id="at_again", ready=False)
        old_uuid = await asyncio.to_thread(domain_uuid, old.domain_name)
        new = await new_ms.create(machine_id="at_again")
        assert new.domain_name == old.domain_name
        assert await asyncio.to_thread(domain_uuid, new.domain_name) not in ("", old_uuid)
        assert (await new.run_script("echo fresh", timeout=60)).stdout == "fresh\n"
    finally:
        await new_ms.destroy_all()
        await old_ms.destroy_all()
        await dead.close()
        await restarted.close()
    assert not domain_exists("gh-provtestdup-at_again")


async def test_errors_are_plain_and_destroy_is_idempotent(provider: QemuProvider, machines: Machines,
                                                          capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ProviderError, match="no image named 'nope'"):
        await provider.create_machine("at_x", MachineSource(image="nope"), timeout=30)
    m = await machines.create(ready=False)
    with pytest.raises(ProviderError, match="already exists"):
        await provider.create_machine(m.machine_id, MachineSource(image="linux-tiny"), timeout=30)
    await m.destroy()
    await m.destroy()
    assert not domain_exists(m.domain_name) and not m.dir.exists()
    with pytest.raises(ProviderError, match="destroyed"):
        await m.run_script("true", timeout=10)
    with pytest.raises(ProviderError) as ei:
        await m.screenshot()
    assert "does not exist" in str(ei.value) and "virDomain" not in str(ei.value)
    bad = QemuProvider(provider.images_dir, provider.state_dir, "provtestbad", "qemu+unix:///system?socket=/nonexistent")
    with pytest.raises(ProviderError, match="cannot connect to libvirt"):
        await bad.start()
    assert "libvirt:" not in capfd.readouterr().err  # no libvirt noise on stderr


async def test_host_checks_report_libvirt_the_accelerator_and_the_images(provider: QemuProvider) -> None:
    checks = {c.name: c for c in await provider.host_checks()}
    assert [*checks] == ["libvirt", "kvmdev", "caps", "images", "creds", "kvm"]
    assert checks["libvirt"].status is CheckStatus.OK and checks["images"].status is CheckStatus.OK
    assert checks["kvm"].status in (CheckStatus.OK, CheckStatus.WARN), checks["kvm"].detail
