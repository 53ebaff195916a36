"""The library's cache and single flight against a real registry; the provider is a double that keeps
version files in a directory (the boundary: the QEMU provider's import is covered by test_two_runners)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from gh_runner.config import Registry as RegistrySettings
from gh_runner.library import FetchRefused, Library, LibraryTimeouts, open_registry
from gh_wire.protocol import LeaseRefusal
from providers.base import MachineSource, Provider, ProviderError, VersionBundle
from registry.server import RegistryProcess
from registry.slowlink import SlowLink

MIB = 1024 * 1024


class DirProvider(Provider):
    """Versions as directories under `root/<ssid>/v<N>`; import moves the staged dir there."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.imports = 0

    def _dir(self, ssid: str, v: int) -> Path:
        return self.root / ssid / f"v{v}"

    def add(self, ssid: str, v: int, size: int) -> None:
        d = self._dir(ssid, v)
        d.mkdir(parents=True)
        (d / "disk.qcow2").write_bytes(os.urandom(size))
        (d / "meta.json").write_text(json.dumps({"image": "linux-tiny", "image_checksum": "sha256:abc"}))

    async def export_version(self, start_state_id: str, version: int) -> VersionBundle:
        d = self._dir(start_state_id, version)
        return VersionBundle(start_state_id, version, "linux-tiny", "sha256:abc",
                             {p.name: p for p in d.iterdir()})

    async def import_version(self, start_state_id: str, version: int, staged: Path) -> int:
        self.imports += 1
        d = self._dir(start_state_id, version)
        d.parent.mkdir(parents=True, exist_ok=True)
        staged.rename(d)  # noqa: ASYNC240 - a test double
        return sum(p.stat().st_size for p in d.iterdir())

    async def held_versions(self) -> list[tuple[str, int]]:
        return sorted((p.parent.name, int(p.name[1:])) for p in self.root.glob("*/v*"))

    async def delete_version(self, start_state_id: str, version: int) -> None:
        shutil.rmtree(self._dir(start_state_id, version))

    async def list_images(self) -> list:  # type: ignore[type-arg]
        return []

    async def create_machine(self, machine_id: str, source: MachineSource, *, timeout: float):  # type: ignore[no-untyped-def]
        raise ProviderError("not here")

    async def reap(self, keep: set[str]) -> list[str]:
        return []


def library(reg: RegistryProcess, provider: Provider, state: Path, cache_mib: int = 64) -> Library:
    settings = RegistrySettings(url=reg.url, repository="gh-lib", cache_mib=cache_mib)
    return Library(provider, open_registry(settings), settings, state)


async def test_one_pull_per_version_and_lru_eviction_skips_versions_in_use(plain_registry: RegistryProcess,
                                                                         tmp_path: Path) -> None:
    a = DirProvider(tmp_path / "a")
    for v in (1, 2, 3):
        a.add("ss_lib", v, 25 * MIB)
    lib_a = library(plain_registry, a, tmp_path / "state-a")
    for v in (1, 2, 3):
        await lib_a.publish("ss_lib", v)
    await lib_a.close()

    b = DirProvider(tmp_path / "b")
    lib_b = library(plain_registry, b, tmp_path / "state-b", cache_mib=64)
    try:
        # Three leases wait on v1 at once: one pull.
        waited = await asyncio.gather(*(lib_b.acquire("ss_lib", 1, "linux-tiny", "sha256:abc", held=False)
                                        for _ in range(3)))
        assert b.imports == 1 and lib_b.pulls_done == 1 and all(s > 0 for s in waited)
        for _ in range(3):
            lib_b.release("ss_lib", 1)
        await lib_b.acquire("ss_lib", 2, "linux-tiny", "sha256:abc", held=False)  # v2 stays in use
        assert lib_b.in_use("ss_lib", 2) and not lib_b.in_use("ss_lib", 1)
        # v3 does not fit beside v1 and v2 (3 x 25 MiB > 64 MiB): v1, free and oldest, goes; v2, in use, stays.
        await lib_b.acquire("ss_lib", 3, "linux-tiny", "sha256:abc", held=False)
        assert await b.held_versions() == [("ss_lib", 2), ("ss_lib", 3)]
        assert set(lib_b.cached()) == {("ss_lib", 2), ("ss_lib", 3)}
        # Asked without saying whether it is held, the library asks the provider: v1 was evicted, so it
        # is pulled again; v3, held, is not.
        pulls = lib_b.pulls_done
        assert await lib_b.acquire("ss_lib", 3, "linux-tiny", "sha256:abc") == 0.0
        lib_b.release("ss_lib", 3)
        lib_b.release("ss_lib", 2)
        assert await lib_b.acquire("ss_lib", 1, "linux-tiny", "sha256:abc") > 0 and lib_b.pulls_done == pulls + 1
        lib_b.release("ss_lib", 1)
        # The index survives a restart of the runner.
        again = library(plain_registry, b, tmp_path / "state-b")
        assert ("ss_lib", 1) in set(again.cached()) and len(again.cached()) == 2
        await again.close()
    finally:
        await lib_b.close()


async def test_refusals_are_typed(plain_registry: RegistryProcess, tmp_path: Path) -> None:
    a = DirProvider(tmp_path / "a")
    a.add("ss_t", 1, 1000)
    lib = library(plain_registry, a, tmp_path / "state")
    try:
        await lib.publish("ss_t", 1)
        b = DirProvider(tmp_path / "b")
        lib_b = library(plain_registry, b, tmp_path / "state-b")
        with pytest.raises(FetchRefused) as e:
            await lib_b.acquire("ss_t", 9, "linux-tiny", "sha256:abc", held=False)
        assert e.value.code == LeaseRefusal.VERSION_MISSING
        with pytest.raises(FetchRefused) as e:
            await lib_b.acquire("ss_t", 1, "linux-tiny", "sha256:other", held=False)
        assert e.value.code == LeaseRefusal.IMAGE_MISSING
        assert not lib_b.in_use("ss_t", 1) and b.imports == 0
        await lib_b.close()
    finally:
        await lib.close()


async def test_a_pull_is_bounded_by_its_size_at_the_slowest_rate_waited_for(plain_registry: RegistryProcess,
                                                                          tmp_path: Path) -> None:
    """The bound is a floor plus the manifest's bytes at `registry.min_mib_per_s`: an 8 MiB version over a
    2 MiB/s link (about 4 s) is refused at the bound when 4 MiB/s is the slowest waited for (0.5 + 2 s),
    and arrives when 1 MiB/s is (0.5 + 8 s)."""
    a = DirProvider(tmp_path / "a")
    a.add("ss_slow", 1, 8 * MIB)
    lib_a = library(plain_registry, a, tmp_path / "state-a")
    try:
        await lib_a.publish("ss_slow", 1)
        # The defaults: a 50 MiB state is given 70 s, a 30 GiB Windows one 1 h 43 min (5 MiB/s).
        assert lib_a.pull_bound(50 * MIB) == pytest.approx(70.0)
        assert lib_a.pull_bound(30 * 1024 * MIB) == pytest.approx(60.0 + 6144.0)
    finally:
        await lib_a.close()
    link = SlowLink(plain_registry.port, 2 * MIB)
    await link.start()

    def over_link(name: str, min_mib_per_s: float) -> tuple[DirProvider, Library]:
        provider = DirProvider(tmp_path / name)
        settings = RegistrySettings(url=link.url, repository="gh-lib", min_mib_per_s=min_mib_per_s)
        return provider, Library(provider, open_registry(settings), settings, tmp_path / f"state-{name}",
                                 LibraryTimeouts(pull=0.5))

    b, lib_b = over_link("b", 4.0)
    c, lib_c = over_link("c", 1.0)
    try:
        assert lib_b.pull_bound(8 * MIB) == pytest.approx(2.5)
        started = time.monotonic()
        with pytest.raises(FetchRefused) as e:
            await lib_b.acquire("ss_slow", 1, "linux-tiny", "sha256:abc", held=False)
        took = time.monotonic() - started
        assert e.value.code == LeaseRefusal.REGISTRY_UNAVAILABLE
        assert "within 2.5 s" in e.value.reason and "min_mib_per_s = 4" in e.value.reason
        assert 2.5 <= took < 30.0  # the bound, long before a stalled socket's 30 s
        assert b.imports == 0 and not lib_b.in_use("ss_slow", 1) and lib_b.cached() == {}
        assert list((tmp_path / "state-b" / "fetch").iterdir()) == []

        waited = await lib_c.acquire("ss_slow", 1, "linux-tiny", "sha256:abc", held=False)
        assert waited > 2.5 and c.imports == 1  # longer than the other's bound, within its own
        assert await c.held_versions() == [("ss_slow", 1)]
        lib_c.release("ss_slow", 1)
    finally:
        await lib_b.close()
        await lib_c.close()
        await link.stop()
