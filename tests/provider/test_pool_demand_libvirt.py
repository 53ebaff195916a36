"""The hot pool by demand on the real thing: a provider whose images dir holds linux-tiny and a
second image (linux-tiny under another name) keeps hot only what its config keeps until a lease asks
for the other; that first lease gets a machine made as usual, the pool fills for its image, the next
lease of it is pooled, and once it is not leased for the idle time its paused machine is destroyed.
The pure policy is tested in tests/provider/test_pool_demand.py."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.poll import until

from providers.base import MachineOrigin, MachineSource
from providers.qemu import QemuProvider
from providers.qemu.pool import PoolConfig

from .conftest import BOOT_TIMEOUT, LIBVIRT_URI, ensure_libvirtd, our_domains

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

TINY = MachineSource(image="linux-tiny")
OTHER = MachineSource(image="linux-tiny-other")


@pytest.fixture
def two_images(images_dir: Path) -> Iterator[Path]:
    """An images dir with linux-tiny and the same image as linux-tiny-other (its files hard-linked)."""
    d = Path(tempfile.mkdtemp(prefix="gh-pool-demand-images-", dir="/var/tmp"))
    d.chmod(0o755)
    try:
        for name in (TINY.image, OTHER.image):
            dst = d / name
            dst.mkdir(mode=0o755)
            for f in (images_dir / TINY.image).iterdir():
                if f.name == "image.yaml":
                    (dst / f.name).write_text(f.read_text().replace(f"name: {TINY.image}\n", f"name: {name}\n"))
                else:
                    os.link(f, dst / f.name)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


async def test_only_the_kept_and_the_leased_are_hot_and_an_idle_source_is_dropped(
        two_images: Path, state_root: Path, runner_name: str) -> None:
    ensure_libvirtd()
    sd = state_root / f"pool-demand-{secrets.token_hex(3)}"
    sd.mkdir(mode=0o755)
    config = PoolConfig(per_source=1, total_mib=1024, refill_delay_s=0.5, keep=frozenset({TINY}))
    p = QemuProvider(two_images, sd, runner_name, LIBVIRT_URI, warm_snapshots=True, pool=config)
    try:
        assert {i.name for i in await p.list_images()} == {TINY.image, OTHER.image}
        await p.start()
        assert p.pool is not None
        pool = p.pool
        # The kept image is hot from the start; the other, leased by nobody, has no machine at all.
        await until(lambda: pool.counts() == {TINY: 1}, BOOT_TIMEOUT * 3, "the kept image to be pooled")
        # NOTE: a pass that pooled TINY would go on to make OTHER's at once (no await between them).
        assert pool._making is None and len(our_domains()) == 1
        assert await p.pooled_sources() == [TINY]

        # A first lease of the other image: a machine made as usual, and the pool starts filling for it.
        first = await p.create_machine("at_demand_1", OTHER, timeout=BOOT_TIMEOUT * 2)
        try:
            assert first.origin is not MachineOrigin.POOLED
            await first.wait_ready(BOOT_TIMEOUT)
        finally:
            await first.destroy()
        await until(lambda: pool.counts() == {TINY: 1, OTHER: 1}, BOOT_TIMEOUT * 3, "the pool to fill for it")
        assert set(await p.pooled_sources()) == {TINY, OTHER}
        second = await p.create_machine("at_demand_2", OTHER, timeout=BOOT_TIMEOUT)
        try:
            assert second.origin is MachineOrigin.POOLED
            await second.wait_ready(BOOT_TIMEOUT)
        finally:
            await second.destroy()

        # Not leased again: after the idle time (made short here; KEEP_LEASED_S is half an hour) the
        # other image's paused machine goes, refilled or being refilled; the kept image's stays.
        kept = pool._ready[TINY][0].machine.domain_name
        pool.demand.keep_leased_s = 1.0
        pool.wake()
        await until(lambda: pool.counts() == {TINY: 1} and pool._making is None and our_domains() == [kept],
                    BOOT_TIMEOUT * 2, "the idle image's machine to be destroyed")
        assert await p.pooled_sources() == [TINY]
    finally:
        await p.close()
    assert our_domains() == []
    assert list((sd / "machines").iterdir()) == []
