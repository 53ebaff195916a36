"""The build VM's accelerator: the one decision every guest of ours gets (providers/qemu/accel.py),
kept in the build cache, with GH_BUILD_ACCEL=kvm|tcg to force it."""

from __future__ import annotations

import os
from pathlib import Path

from providers.qemu.accel import CACHE_NAME, Decision, decide

from .pipeline import log


def build_accelerator(kernel: Path | None, cache_dir: Path | None) -> str:
    """"kvm" or "tcg" for a build VM, decided by booting `kernel` (the image's own, when it has one).
    The verdict is kept in `cache_dir` for the next build this boot (None: kept nowhere on disk)."""
    cache: Path | None = None
    if cache_dir is not None:
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            cache = cache_dir / CACHE_NAME
        except OSError:
            pass  # decided anyway, only not kept for the next build
    d: Decision = decide(kernel, cache, force=os.environ.get("GH_BUILD_ACCEL"))
    log(f"accelerator {d}")
    return d.accelerator.value
