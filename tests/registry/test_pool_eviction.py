"""A pulled version evicted from the registry cache takes its hot-pool machines with it.

The real QEMU provider with a hot pool, the linux-tiny guest, the real library and a real registry
(docker-registry on loopback): runner A saves two versions and pushes them; runner B pulls v1 (its
pool restores and pauses a machine of it), then pulls v2 into a cache too small for both, which evicts
v1: v1's paused machine is destroyed before its files are removed, not left until B closes.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from pathlib import Path

import pytest
from kit.libvirt import LIBVIRT_URI, domains
from kit.poll import until

from gh_runner.config import Registry as RegistrySettings
from gh_runner.library import Library, open_registry
from providers.base import MachineSource
from providers.qemu import QemuProvider  # type: ignore[attr-defined]
from providers.qemu.pool import PoolConfig
from registry.server import RegistryProcess

pytestmark = [pytest.mark.libvirt, pytest.mark.slow]

WAIT = 300.0  # a loaded 2-core host under TCG


def library(reg: RegistryProcess, provider: QemuProvider, state: Path, cache_mib: int) -> Library:
    settings = RegistrySettings(url=reg.url, repository="gh-pool", cache_mib=cache_mib)
    return Library(provider, open_registry(settings), settings, state)


async def test_an_evicted_version_loses_its_pooled_machines(plain_registry: RegistryProcess,
                                                            images_dir: Path) -> None:
    ssid = "ss_evict" + secrets.token_hex(2)
    name_a, name_b = (f"regpool{x}{secrets.token_hex(2)}" for x in "ab")
    root = Path(tempfile.mkdtemp(prefix="gh-registry-pool-", dir="/var/tmp"))
    try:
        root.chmod(0o755)  # noqa: ASYNC240 - set-up: libvirt-qemu must traverse it
        a = QemuProvider(images_dir, root / "a", name_a, LIBVIRT_URI)
        b = QemuProvider(images_dir, root / "b", name_b, LIBVIRT_URI,
                         pool=PoolConfig(per_source=1, total_mib=512,  # v1 as if leased: hot once pulled
                                         keep=frozenset({MachineSource(image="linux-tiny", start_state_id=ssid,
                                                                       version=1)})))
        lib_a = library(plain_registry, a, root / "a", cache_mib=4096)
        # 64 MiB (the least allowed) against ~73 MiB a version: pulling v2 evicts v1 (a lone version over
        # the size is still pulled).
        lib_b = library(plain_registry, b, root / "b", cache_mib=64)
        try:
            await evict_a_pooled_version(ssid, name_b, root, a, b, lib_a, lib_b)
        finally:
            await lib_b.close()
            await lib_a.close()
            await b.close()
            await a.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert domains(f"gh-{name_a}-", check=True) == [] and domains(f"gh-{name_b}-", check=True) == []


async def evict_a_pooled_version(ssid: str, name_b: str, root: Path, a: QemuProvider, b: QemuProvider,
                                 lib_a: Library, lib_b: Library) -> None:
    await a.start()
    m = await a.create_machine("at_saver", MachineSource(image="linux-tiny"), timeout=WAIT)
    try:
        await m.wait_ready(WAIT)
        await m.save(ssid, 1)
        await m.save(ssid, 2)
    finally:
        await m.destroy()
    for v in (1, 2):
        await lib_a.publish(ssid, v)

    await b.start()
    assert b.pool is not None
    pool = b.pool
    checksum = next(i.checksum for i in await b.list_images() if i.name == "linux-tiny")
    v1 = MachineSource(image="linux-tiny", start_state_id=ssid, version=1)
    assert await lib_b.acquire(ssid, 1, "linux-tiny", checksum) > 0
    lib_b.release(ssid, 1)
    await until(lambda: pool.counts() == {v1: 1}, WAIT, "the pulled version to be pooled", every=0.2)
    pooled = pool._ready[v1][0].machine.domain_name
    assert pooled in domains(f"gh-{name_b}-", check=True)

    assert await lib_b.acquire(ssid, 2, "linux-tiny", checksum) > 0  # evicts v1
    lib_b.release(ssid, 2)
    assert (ssid, 1) not in set(await b.held_versions())
    assert not (root / "b" / "states" / ssid / "v1").exists()
    assert pooled not in domains("gh-", check=True)
    assert v1 not in pool.counts()
