"""The library's cache and single flight against a real registry; the provider is a double that keeps
version files in a directory (the boundary: the QEMU provider's import is covered by test_two_runners)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from gh_runner.config import Registry as RegistrySettings
from gh_runner.library import FetchRefused, Library, open_registry
from gh_wire.protocol import LeaseRefusal
from providers.base import MachineSource, Provider, ProviderError, VersionBundle
from registry.server import RegistryProcess

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
