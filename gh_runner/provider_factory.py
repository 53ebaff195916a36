"""The machine provider a runner uses: QEMU/KVM on libvirt, sized from the runner's config.

The daemon, `gh-runner images`/`selftest` and `gh-runner local` all make their provider here, so a
setting (the hot pool's plan, the per-machine write cap, warm snapshots) reaches every one of them.
"""

from __future__ import annotations

import importlib
import os

from gh_runner.config import RunnerConfig
from gh_runner.log import get_logger
from gh_runner.poolsize import plan_pool
from providers.base import Provider

MIB = 1024 * 1024
TEST_PROVIDER_ENV = "GH_RUNNER_TEST_PROVIDER"  # test-only: module:factory(config) -> Provider


def make_provider(config: RunnerConfig) -> Provider:
    """The QEMU provider, or (tests only) the factory named by GH_RUNNER_TEST_PROVIDER."""
    hook = os.environ.get(TEST_PROVIDER_ENV)
    if hook:
        module, _, attr = hook.partition(":")
        factory = getattr(importlib.import_module(module), attr or "make_provider")
        get_logger().warning("using a test provider: not for production", hook=hook)
        provider: Provider = factory(config)
        return provider
    from providers.base import MachineSource
    from providers.qemu import QemuProvider  # type: ignore[attr-defined]
    from providers.qemu.pool import PoolConfig

    plan = plan_pool(config)
    pool = PoolConfig(per_source=plan.per_source, total_mib=plan.total_mib, keep_leased_s=plan.keep_leased_s,
                      keep=frozenset(MachineSource(image=name) for name in plan.keep))
    qemu: Provider = QemuProvider(config.images_dir, config.state_dir, config.name, config.libvirt_uri,
                                  write_cap_bytes=config.machine_disk_cap_mib * MIB,
                                  warm_snapshots=config.warm_snapshots, pool=pool)
    return qemu
