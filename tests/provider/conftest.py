"""Fixtures for the provider tests: a provider on a private state dir, machines always destroyed.

State lives in a scratch dir QEMU can reach (tests/kit/scratch.py). Each test module shares one booted
machine where tests do not conflict: the whole project's CI runs on 2 cores.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from kit.libvirt import LIBVIRT_URI, domains, ensure_libvirtd, leak_check, started
from kit.scratch import scratch_dir

from providers.base import MachineSource
from providers.qemu import QemuMachine, QemuProvider

BOOT_TIMEOUT = float(os.environ.get("GH_TEST_BOOT_TIMEOUT", "120"))
RUNNER_NAME = f"provtest{secrets.token_hex(3)}"


@pytest.fixture(scope="session")
def state_root() -> Iterator[Path]:
    with scratch_dir("gh-provider-test-") as d:
        yield d


def our_domains() -> list[str]:
    return domains(f"gh-{RUNNER_NAME}-")


_no_domains_left_behind = leak_check(f"gh-{RUNNER_NAME}-", "the provider tests")


@pytest.fixture(scope="session")
def runner_name() -> str:
    return RUNNER_NAME


def make_provider(images_dir: Path, state_root: Path, runner_name: str, sub: str) -> QemuProvider:
    sd = state_root / sub
    sd.mkdir(mode=0o755, exist_ok=True)
    return QemuProvider(images_dir, sd, runner_name, LIBVIRT_URI)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def provider(images_dir: Path, state_root: Path, runner_name: str) -> AsyncIterator[QemuProvider]:
    ensure_libvirtd()
    async with started(make_provider(images_dir, state_root, runner_name, secrets.token_hex(3))) as p:
        yield p


class Machines:
    """Creates machines and destroys every one of them at the end, whatever happened."""

    def __init__(self, provider: QemuProvider) -> None:
        self.provider = provider
        self.made: list[QemuMachine] = []

    async def create(self, source: MachineSource | None = None, *, machine_id: str | None = None,
                     ready: bool = True) -> QemuMachine:
        mid = machine_id or f"at_{secrets.token_hex(4)}"
        m = await self.provider.create_machine(mid, source or MachineSource(image="linux-tiny"), timeout=BOOT_TIMEOUT)
        assert isinstance(m, QemuMachine)
        self.made.append(m)
        if ready:
            await m.wait_ready(BOOT_TIMEOUT)
        return m

    async def destroy_all(self) -> None:
        for m in self.made:
            await m.destroy()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def shared_machine(provider: QemuProvider) -> AsyncIterator[QemuMachine]:
    ms = Machines(provider)
    try:
        yield await ms.create()
    finally:
        await ms.destroy_all()


@pytest_asyncio.fixture(loop_scope="module")
async def machines(provider: QemuProvider) -> AsyncIterator[Machines]:
    ms = Machines(provider)
    try:
        yield ms
    finally:
        await ms.destroy_all()
