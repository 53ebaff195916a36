"""What the resume tests through real processes share (tests/e2e/test_resume.py on linux-tiny,
tests/desktop/test_resume_registry_desktop.py on linux-desktop): a registry and a gh-runner config
pushing there, a command agent and the directory it shares with the test, the first runner's try once
its agent made its save point and said so, and a second runner whose only way to that save point is the
registry."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from agentfiles import agent_command
from registry.server import RegistryProcess

from .faults import Stack, leftovers
from .procs import Runner


def until(path: Path, timeout: float) -> str:
    """The text of `path` once it exists (written by an agent: another process, so polled)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout:.0f} s")
        time.sleep(0.5)
    return path.read_text()


def command_agent(work: Path, script: Path, agent_id: str, timeout: float) -> tuple[Path, dict[str, Any]]:
    """A command agent's settings running `script` with a directory it shares with the test (work/agent)."""
    shared = work / "agent"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # the agent runs with a uid of its own
    return shared, {"id": agent_id, "kind": "command", "timeout": timeout,
                    "command": agent_command(script, str(shared))}


def pushed(stack: Stack, attempt_id: str, timeout: float) -> str:
    """The attempt's first save point's registry reference, once its runner pushed it and said so."""
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {stack.server.api_key}"}
    while True:
        got = httpx.get(f"{stack.server.base_url}/v1/attempts/{attempt_id}", headers=headers, timeout=30).json()
        refs = [p.get("registry_ref") for p in got.get("save_points") or [] if p.get("registry_ref")]
        if refs:
            return str(refs[0])
        assert time.monotonic() < deadline, f"the save point was not pushed within {timeout:.0f} s: {got}"
        time.sleep(0.5)


def online(stack: Stack, name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not any(r.get("name") == name and r.get("status") == "online" for r in stack.api.runners.list()["data"]):
        assert time.monotonic() < deadline, f"runner {name} did not come online within {timeout:.0f} s"
        time.sleep(0.5)


@contextlib.contextmanager
def registry_config(work: Path, repository: str, settings: Mapping[str, Any] | None = None
                    ) -> Iterator[tuple[RegistryProcess, Path]]:
    """A registry (Debian's docker-registry on loopback) and a gh-runner config file that pulls and pushes
    there, with `settings` (more of the runner's config: a desktop's timeouts, say) beside it."""
    registry = RegistryProcess.start(work / "registry")
    try:
        config = work / "runner.yaml"
        config.write_text(yaml.safe_dump({**(settings or {}),
                                          "registry": {"url": registry.url, "repository": repository}}))
        yield registry, config
    finally:
        registry.stop()


@dataclass
class Other:
    """The second runner: its own state dir (the first one's disk is not there), the same registry."""

    name: str
    runner_id: str
    state: Path
    runner: Runner
    log: str = ""  # its log, once stopped
    left: list[str] = field(default_factory=list)  # what it left, once stopped


@contextlib.contextmanager
def other_runner(stack: Stack, images_dir: Path, config: Path, prefix: str) -> Iterator[Other]:
    name = prefix + secrets.token_hex(3)
    state = stack.work / f"{name}-state"
    state.mkdir(mode=0o755)
    made = stack.api.runners.create(name)
    other = Other(name, str(made["runner_id"]), state,
                  Runner(stack.server.base_url, made["token"], name, images_dir, state, slots=1, config=config))
    try:
        online(stack, name, timeout=300)
        yield other
    finally:
        other.runner.stop()
        other.log = Path(other.runner.log.name).read_text(errors="replace")
        other.left = leftovers(name, state)


@contextlib.contextmanager
def past_the_save_point(work: Path, images_dir: Path, name: str, *, grace_s: float, case: dict[str, Any],
                        agent: Path, told: str, agent_timeout: float = 1200, timeout: float = 900,
                        runner_settings: Mapping[str, Any] | None = None
                        ) -> Iterator[tuple[Stack, RegistryProcess, Path, str, str]]:
    """A registry, gh-server and a first runner pushing there, and a try of `case` by the command agent
    `agent` (id "resumer") on that runner once the agent wrote the file `told` in work/agent (it made its
    save point, and acts or waits as it was written to): the stack, registry, runner config, run, attempt."""
    shared, resumer = command_agent(work, agent, "resumer", agent_timeout)
    with registry_config(work, name, runner_settings) as (registry, config), \
            Stack(work, name + "a", images_dir, slots=1, runner_config=config,
                  server_settings={"runner_grace_seconds": grace_s, "agents": {"resumer": resumer}}) as stack:
        run = stack.run([case], repeat=1, name=name, agents=("resumer",))
        until(shared / told, timeout=timeout)
        yield stack, registry, config, run, next(iter(stack.api.test_runs.list_all_attempts(run)))["attempt_id"]
