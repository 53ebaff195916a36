"""Fixtures for the runner daemon tests: a started test peer and a daemon factory that always
stops what it started (even when the test fails)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from gh_runner.config import RunnerConfig
from gh_runner.daemon import Daemon

from .doubles import FakeProvider, ScriptedAttempt
from .peer import Peer


@pytest.fixture
async def peer() -> AsyncIterator[Peer]:
    p = Peer()
    await p.start()
    try:
        yield p
    finally:
        p.kill()
        await p.stop()


def runner_config(url: str, state_dir: Path, **kw: Any) -> RunnerConfig:
    values: dict[str, Any] = dict(
        server=url, token=SecretStr(Peer.token), name="test-runner", labels=["lab", "lenovo"], slots=2,
        state_dir=state_dir, images_dir=state_dir.parent / "images", reconnect_min=0.05, reconnect_max=0.4,
        result_resend=0.5, reap_interval=3600, drain_grace=5,
    )
    values.update(kw)
    return RunnerConfig(**values)


class Running:
    def __init__(self, daemon: Daemon, task: asyncio.Task[int], provider: FakeProvider) -> None:
        self.daemon = daemon
        self.task = task
        self.provider = provider

    async def stop(self, force: bool = False) -> int:
        if force:
            self.daemon.force_stop()
        else:
            self.daemon.request_stop()
        return await asyncio.wait_for(asyncio.shield(self.task), 60)


@pytest.fixture
async def start_daemon(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    started: list[Running] = []

    async def start(url: str, *, provider: FakeProvider | None = None, state_dir: Path | None = None,
                    attempt_factory: Any = ScriptedAttempt, observers: Any = (), jobs: Any = None,
                    **kw: Any) -> Running:
        provider = provider or FakeProvider()
        session_sleep = kw.pop("session_sleep", None)
        tick_interval = kw.pop("tick_interval", 1.0)
        probe_interval = kw.pop("probe_interval", 10.0)
        library = kw.pop("library", None)  # a registry's side (gh_runner.library.Library), or a double of it
        cfg = runner_config(url, state_dir or tmp_path / "state", **kw)
        d = Daemon(cfg, provider, attempt_factory=attempt_factory, observers=observers, jobs=jobs,
                   session_sleep=session_sleep, tick_interval=tick_interval, probe_interval=probe_interval,
                   library=library)
        r = Running(d, asyncio.create_task(d.run()), provider)
        started.append(r)
        return r

    yield start
    for r in started:
        if not r.task.done():
            r.daemon.force_stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(r.task, 60)
