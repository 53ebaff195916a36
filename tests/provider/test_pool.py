"""The hot pool on the real thing: a lease takes a paused machine that is as fresh as a cold one
(nothing the previous machine wrote, the host's clock), becomes the attempt's (the reaper keeps
it), the pool refills, and a crashed runner's pool is reaped by the next process without leaks."""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path
from typing import Any

import libvirt
import pytest
from kit.libvirt import LIBVIRT_URI, domains, ensure_libvirtd
from kit.poll import until

from providers.base import MachineOrigin, MachineSource
from providers.errors import MachineNotReady
from providers.qemu import QemuMachine, QemuProvider
from providers.qemu.guest_agent import GuestAgent
from providers.qemu.pool import PoolConfig

from .conftest import BOOT_TIMEOUT, our_domains

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

TINY = MachineSource(image="linux-tiny")
POOL = PoolConfig(per_source=1, total_mib=512, keep=frozenset({TINY}))  # hot from the start


def pooled(p: QemuProvider) -> int:
    assert p.pool is not None
    return p.pool.counts().get(TINY, 0)


async def test_a_lease_takes_a_fresh_paused_machine_and_a_restart_reaps_the_pool(
        images_dir: Path, state_root: Path, runner_name: str) -> None:
    ensure_libvirtd()
    sd = state_root / f"pool-{secrets.token_hex(3)}"
    sd.mkdir(mode=0o755)
    p = QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI, warm_snapshots=True, pool=POOL)
    await p.start()
    assert await p.pooled_sources() == [TINY]
    made: list[QemuMachine] = []
    try:
        await until(lambda: pooled(p) == 1, BOOT_TIMEOUT * 3, "the pool to fill")
        # Counted only once primed: its guest answered after the restore, and it is paused again.
        assert p.pool is not None
        entry = p.pool._ready[TINY][0]
        assert entry.primed_s > 0
        dom = p.conn.call(lambda c: c.lookupByName(entry.machine.domain_name))
        assert dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED
        a = await p.create_machine("at_pool_a", TINY, timeout=BOOT_TIMEOUT)
        assert isinstance(a, QemuMachine)
        made.append(a)
        assert a.origin == MachineOrigin.POOLED and a.machine_id == "at_pool_a"
        await a.wait_ready(BOOT_TIMEOUT)
        res = await a.run_script("echo a > /root/a-was-here; echo a > /dev/shm/a-mem; sync", timeout=30)
        assert res.exit_code == 0, res.stderr
        # It is the attempt's now: the daemon's reaper, keeping only live attempts, leaves it alone.
        assert await p.reap({"at_pool_a"}) == []
        assert (await a.run_script("true", timeout=30)).exit_code == 0

        await until(lambda: pooled(p) == 1, BOOT_TIMEOUT * 2, "the pool to refill")
        b = await p.create_machine("at_pool_b", TINY, timeout=BOOT_TIMEOUT)
        assert isinstance(b, QemuMachine)
        made.append(b)
        assert b.origin == MachineOrigin.POOLED and b.domain_name != a.domain_name
        await b.wait_ready(BOOT_TIMEOUT)
        # Paused since it was made: its clock would lag by the time it waited, unless set on resume.
        before = time.time()
        guest = float((await b.run_script("date +%s", timeout=30)).stdout)
        assert before - 2.0 <= guest <= time.time() + 2.0  # bracketed: a loaded host answers late
        res = await b.run_script("ls /root/a-was-here /dev/shm/a-mem 2>&1", timeout=30)
        assert res.stdout.count("No such file") == 2, res.stdout
        for m in made:
            await m.destroy()
        await until(lambda: pooled(p) == 1, BOOT_TIMEOUT * 2, "the pool to refill again")
        left_by_p = our_domains()
        assert len(left_by_p) == 1  # the pooled machine a crashed runner would leave

        # "Crash": the process is gone without closing; the next one reaps its pool and fills its own.
        p2 = QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI, warm_snapshots=True, pool=POOL)
        try:
            await p2.start()
            reaped = await p2.reap(set())
            assert len(reaped) >= 1 and all(r.startswith("pool-") for r in reaped)
            await until(lambda: pooled(p2) == 1 and not set(left_by_p) & set(our_domains()),
                        BOOT_TIMEOUT * 2, "the new pool")
            c = await p2.create_machine("at_pool_c", TINY, timeout=BOOT_TIMEOUT)
            try:
                assert c.origin == MachineOrigin.POOLED
                await c.wait_ready(BOOT_TIMEOUT)
            finally:
                await c.destroy()
        finally:
            await p2.close()
    finally:
        for m in made:
            await m.destroy()
        await p.close()
    assert our_domains() == []
    assert list((sd / "machines").iterdir()) == []


async def test_a_machine_whose_guest_does_not_answer_is_never_pooled(
        images_dir: Path, state_root: Path, runner_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault is injected at the guest-agent boundary (the pool's guests stay silent); the pool,
    libvirt and the cleanup are real."""
    ensure_libvirtd()
    silent: list[str] = []
    answer = GuestAgent.wait_ready

    async def pool_guests_silent(self: GuestAgent, timeout: float, **kw: Any) -> None:
        if "-pool-" not in self.domain_name:
            return await answer(self, timeout, **kw)
        silent.append(self.domain_name)
        raise MachineNotReady("the guest agent did not answer (test: a guest that stays silent)")

    monkeypatch.setattr(GuestAgent, "wait_ready", pool_guests_silent)
    sd = state_root / f"pool-silent-{secrets.token_hex(3)}"
    sd.mkdir(mode=0o755)
    p = QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI, warm_snapshots=True, pool=POOL)
    try:
        await p.start()  # the pool builds the warm snapshot, restores a machine, and primes it
        assert p.pool is not None
        pool = p.pool
        await until(lambda: TINY in pool._failed_at, BOOT_TIMEOUT * 3, "the pool to give up on its machine")
        assert len(silent) == 1 and pooled(p) == 0
        await until(lambda: not our_domains(), 30, "the silent machine to be destroyed")
        # A lease finds no pooled machine and makes its own.
        m = await p.create_machine("at_pool_own", TINY, timeout=BOOT_TIMEOUT)
        try:
            assert m.origin == MachineOrigin.LAZY
            await m.wait_ready(BOOT_TIMEOUT)
        finally:
            await m.destroy()
    finally:
        await p.close()
    assert our_domains() == []
    assert list((sd / "machines").iterdir()) == []


async def test_closing_while_a_machine_is_primed_leaves_nothing(
        images_dir: Path, state_root: Path, runner_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """close() while the pool waits for a new machine's guest: that machine is in no list yet, and
    must still go (the wait is held at the guest-agent boundary; libvirt and QEMU are real)."""
    ensure_libvirtd()
    priming = asyncio.Event()
    answer = GuestAgent.wait_ready

    async def pool_guests_hang(self: GuestAgent, timeout: float, **kw: Any) -> None:
        if "-pool-" not in self.domain_name:
            return await answer(self, timeout, **kw)
        priming.set()
        await asyncio.Event().wait()  # until cancelled

    monkeypatch.setattr(GuestAgent, "wait_ready", pool_guests_hang)
    sd = state_root / f"pool-close-{secrets.token_hex(3)}"
    sd.mkdir(mode=0o755)
    p = QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI, warm_snapshots=True, pool=POOL)
    try:
        await p.start()
        await asyncio.wait_for(priming.wait(), BOOT_TIMEOUT * 3)
        assert len(our_domains()) == 1
    finally:
        await p.close()
    assert our_domains() == []
    assert list((sd / "machines").iterdir()) == []


def all_domains() -> list[str]:
    return domains("", check=True)


async def test_deleting_a_version_destroys_its_pooled_machines_first(
        images_dir: Path, state_root: Path, runner_name: str) -> None:
    """A start state's versions pooled (warm snapshots off: only they are), then v1 deleted as the
    server's `delete` job and the registry cache's eviction delete it (`delete_version`): its paused
    machine goes before its files; v2's stays. v2's files then removed behind the pool's back: the next
    fill pass drops its machine too."""
    ensure_libvirtd()
    ssid = "ss_pooldel" + secrets.token_hex(2)
    sd = state_root / f"pool-del-{secrets.token_hex(3)}"
    sd.mkdir(mode=0o755)
    maker = QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI)
    await maker.start()
    try:
        m = await maker.create_machine("at_pool_saver", TINY, timeout=BOOT_TIMEOUT)
        try:
            await m.wait_ready(BOOT_TIMEOUT)
            await m.save(ssid, 1)
            await m.save(ssid, 2)
        finally:
            await m.destroy()
    finally:
        await maker.close()
    v1, v2 = (MachineSource(image="linux-tiny", start_state_id=ssid, version=v) for v in (1, 2))
    p = QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI,
                     pool=PoolConfig(per_source=1, total_mib=512, keep=frozenset({v1, v2})))
    try:
        await p.start()
        assert p.pool is not None
        pool = p.pool
        await until(lambda: pool.counts() == {v1: 1, v2: 1}, BOOT_TIMEOUT * 2, "both versions pooled")
        d1, d2 = (pool._ready[v][0].machine.domain_name for v in (v1, v2))
        assert {d1, d2} <= set(all_domains())

        await p.delete_version(ssid, 1)
        assert d1 not in all_domains()
        assert not (sd / "states" / ssid / "v1").exists()
        assert d2 in all_domains() and pool.counts() == {v2: 1}

        await asyncio.to_thread(p.states.delete, ssid, 2)
        pool.wake()
        await until(lambda: d2 not in all_domains(), BOOT_TIMEOUT, "v2's machine to be dropped")
        assert pool.counts() == {}
        assert our_domains() == []
    finally:
        await p.close()
    assert our_domains() == []
    assert list((sd / "machines").iterdir()) == []
