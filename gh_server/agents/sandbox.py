"""How a command agent is started so that it cannot reach what grades it.

The agent under test is untrusted (docs/security.md). It gets:
- an explicit environment: PATH, LANG, HOME, TMPDIR, the GH_MACHINE_* variables and GH_ATTEMPT_ID, and
  only what its own config names (`env` values, `pass_env` names copied from gh-server's environment),
  never gh-server's environment as a whole (its API key, database URL, model keys);
- a uid and gid that are not gh-server's, so the file modes of gh-server's data dir (0700), database and
  key files (0600) keep it out, and a uid of its own per attempt, so it cannot read another running
  agent's /proc/<pid>/environ or stdin (where that attempt's machine token is);
- a fresh private HOME (0700), removed afterwards (by the next gh-server when this one was killed
  first), and no inherited file descriptors.

Three ways to get there (`Settings.agent_sandbox`):
- `user`: gh-server runs as root and starts the agent with setgid/setuid (subprocess `user=`/`group=`),
  group `agent_user` (scripts/setup.sh makes the `gh-agent` system user and group), uid from
  `agent_uids`, none of which may belong to an account;
- `systemd`: a transient unit per attempt (`systemd-run --pipe --wait`) with DynamicUser, PrivateTmp,
  ProtectProc=invisible, ProtectSystem=strict, ProtectHome and the data dir inaccessible; the
  environment goes in through a 0600 EnvironmentFile, never argv (argv is world-readable in /proc);
- `none`: as gh-server's own user, for trusted agents on a developer's machine (the environment is
  still the explicit one).
`auto` picks systemd where systemd is PID 1 and gh-server is root, else user when root; a non-root
gh-server must say `none` (or `systemd` with a polkit rule) explicitly: no silent weaker mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from gh_server.settings import Settings

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
# gh-server's own secrets: an agent config that names one of these in pass_env is refused at start.
FORBIDDEN_PASS = re.compile(r"^(GH_SERVER_.*|GH_RUNNER_.*)$")
SYSTEMCTL_TIMEOUT_S = 30.0
# An agent's private HOME (and a systemd unit's secrets dir) in the temp dir is named for the
# gh-server process that made it: a server killed before its clean-up leaves them, and the next
# server removes those of processes that are gone (`sweep_leftovers`).
LEFTOVER = re.compile(r"^gh-agent-(?:env-)?(\d+)-")


def _prefix(what: str = "") -> str:
    return f"gh-agent-{what}{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def sweep_leftovers(tmp: str | None = None) -> list[str]:
    """Remove the agent HOMEs and secrets dirs that gh-server processes no longer running left in
    the temp dir (killed before their clean-up); returns what was removed. A dir of a process that
    still runs (another gh-server, or a reused pid) is kept."""
    removed = []
    with contextlib.suppress(OSError), os.scandir(tmp or tempfile.gettempdir()) as entries:
        for entry in entries:
            m = LEFTOVER.match(entry.name)
            if m is None or not entry.is_dir(follow_symlinks=False) or _alive(int(m.group(1))):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


class SandboxKind(StrEnum):
    USER = "user"
    SYSTEMD = "systemd"
    NONE = "none"


def systemd_is_pid1() -> bool:
    # sd_booted()'s test: this directory exists only when systemd is the init system.
    return os.path.isdir("/run/systemd/system")


def choose(settings: Settings, euid: int | None = None, systemd: bool | None = None) -> SandboxKind:
    """The sandbox for command agents, or ValueError saying why none can be had."""
    euid = os.geteuid() if euid is None else euid
    systemd = systemd_is_pid1() and shutil.which("systemd-run") is not None if systemd is None else systemd
    want = settings.agent_sandbox
    if want == "none":
        return SandboxKind.NONE
    if want == "systemd":
        if not systemd:
            raise ValueError("agent_sandbox systemd: systemd is not PID 1 here (or systemd-run is missing)")
        return SandboxKind.SYSTEMD
    if want == "user":
        if euid != 0:
            raise ValueError("agent_sandbox user: gh-server must run as root to start agents as another user")
        return SandboxKind.USER
    if euid == 0:
        return SandboxKind.SYSTEMD if systemd else SandboxKind.USER
    raise ValueError("command agents need a sandbox: gh-server is not root, so it cannot start them as another "
                     "user; run it as root, or set agent_sandbox: systemd (with a polkit rule letting it start "
                     "transient units), or agent_sandbox: none for agents you trust with gh-server's files")


class UidPool:
    """Per-attempt uids from a range. A uid is free when this process has not handed it out and no
    process runs as it (a leftover of a crashed server must not share a uid with a new agent)."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self._in_use: set[int] = set()

    def check(self) -> None:
        if not 0 < self.first <= self.last:
            raise ValueError(f"agent_uids {self.first}-{self.last} is not a range of non-root uids")
        owned = sorted(p.pw_uid for p in pwd.getpwall() if self.first <= p.pw_uid <= self.last)
        if owned:
            who = pwd.getpwuid(owned[0]).pw_name
            raise ValueError(f"agent_uids {self.first}-{self.last} includes uid {owned[0]} of account {who!r}: "
                             "pick a range no account uses")

    def take(self) -> int:
        running = _uids_running()
        for uid in range(self.first, self.last + 1):
            if uid not in self._in_use and uid not in running:
                self._in_use.add(uid)
                return uid
        raise RuntimeError(f"all {self.last - self.first + 1} agent uids are in use: widen agent_uids")

    def give_back(self, uid: int) -> None:
        self._in_use.discard(uid)


_pools: dict[tuple[int, int], UidPool] = {}  # one per range in this process: registries come and go


def _uids_running() -> set[int]:
    uids: set[int] = set()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    uids.add(entry.stat(follow_symlinks=False).st_uid)
    return uids


def kill_uid(uid: int) -> None:
    """SIGKILL every process running as `uid`: a per-attempt uid runs nothing else, and an agent may
    have left its process group (setsid) to outlive the attempt."""
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    os.kill(int(entry.name), signal.SIGKILL)


@dataclass
class Launch:
    """One agent start: argv, environment and the subprocess options that drop privileges."""

    argv: list[str]
    env: dict[str, str]
    popen: dict[str, Any] = field(default_factory=dict)
    uid: int | None = None
    unit: str | None = None


class Sandbox:
    def __init__(self, settings: Settings, kind: SandboxKind) -> None:
        self.settings = settings
        self.kind = kind
        self.gid: int | None = None
        self.shared_uid: int | None = None
        self.pool: UidPool | None = None
        sweep_leftovers()
        if kind is SandboxKind.USER:
            try:
                self.gid = grp.getgrnam(settings.agent_user).gr_gid
            except KeyError:
                raise ValueError(f"agent_user {settings.agent_user!r}: no such group; scripts/setup.sh makes "
                                 "it (groupadd --system gh-agent; useradd --system -g gh-agent gh-agent)") from None
            if settings.agent_uids is None:
                try:
                    self.shared_uid = pwd.getpwnam(settings.agent_user).pw_uid
                except KeyError:
                    raise ValueError(f"agent_user {settings.agent_user!r}: no such user") from None
            else:
                first, last = settings.agent_uids
                self.pool = _pools.setdefault((first, last), UidPool(first, last))
                self.pool.check()

    @classmethod
    def for_settings(cls, settings: Settings) -> Sandbox:
        return cls(settings, choose(settings))

    @staticmethod
    def check_pass_env(agent_id: str, names: Sequence[str]) -> None:
        for n in names:
            if FORBIDDEN_PASS.match(n):
                raise ValueError(f"agent {agent_id}: pass_env {n!r} is one of gh-server's own settings; "
                                 "an agent never gets those")

    def environment(self, home: str, machine: Mapping[str, str], env: Mapping[str, str],
                    pass_env: Sequence[str]) -> dict[str, str]:
        out = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home}
        out.update({n: os.environ[n] for n in pass_env if n in os.environ})
        out.update(env)
        out.update(machine)  # last: the config cannot replace the attempt's own machine API
        return out

    @contextlib.asynccontextmanager
    async def launch(self, label: str, command: Sequence[str], machine: Mapping[str, str],
                     env: Mapping[str, str] | None = None, pass_env: Sequence[str] = ()) -> AsyncIterator[Launch]:
        """Everything one agent start needs; on exit (the agent's process group already killed by the
        caller) whatever it left running as its uid is killed and its HOME removed (in a thread: a
        HOME the agent filled takes a while to remove)."""
        if self.kind is SandboxKind.SYSTEMD:
            unit = "gh-agent-" + re.sub(r"[^A-Za-z0-9_-]", "_", label)[:60] + "-" + secrets.token_hex(4)
            private = tempfile.mkdtemp(prefix=_prefix("env-"))  # 0700, gh-server's: the unit's secrets
            try:
                yield self._systemd(unit, Path(private), command, machine, env or {}, pass_env)
            finally:
                await asyncio.shield(asyncio.to_thread(_stop_unit, unit, private))
            return
        uid = None
        if self.kind is SandboxKind.USER:
            uid = self.pool.take() if self.pool is not None else self.shared_uid
        home = ""
        try:
            home = tempfile.mkdtemp(prefix=_prefix())
            popen: dict[str, Any] = {"cwd": home, "umask": 0o077}
            if uid is not None:
                os.chown(home, uid, self.gid or 0)
                popen.update(user=uid, group=self.gid, extra_groups=[])
            yield Launch(list(command), self.environment(home, machine, env or {}, pass_env), popen, uid)
        finally:
            await asyncio.shield(asyncio.to_thread(self._clean, uid, home))

    def _clean(self, uid: int | None, home: str) -> None:
        if uid is not None and self.pool is not None:
            kill_uid(uid)
            self.pool.give_back(uid)
        if home:
            shutil.rmtree(home, ignore_errors=True)

    def _systemd(self, unit: str, private: Path, command: Sequence[str], machine: Mapping[str, str],
                 env: Mapping[str, str], pass_env: Sequence[str]) -> Launch:
        env_file = private / "env"
        values = self.environment("/tmp", machine, env, pass_env)  # the unit's own PrivateTmp
        fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
        with os.fdopen(fd, "w") as f:
            for k, v in values.items():
                f.write(f"{k}={_quote_env(v)}\n")
        return Launch(systemd_argv(unit, self.settings, env_file, command), {"PATH": SAFE_PATH}, {}, None, unit)


def _stop_unit(unit: str, private: str) -> None:
    # The unit may outlive systemd-run's own process group: stopping it kills its whole cgroup.
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["systemctl", "stop", f"{unit}.service"], capture_output=True, timeout=SYSTEMCTL_TIMEOUT_S,
                       check=False)
    shutil.rmtree(private, ignore_errors=True)


def _quote_env(v: str) -> str:
    # systemd's EnvironmentFile= takes double-quoted values with C-style escapes.
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def systemd_argv(unit: str, settings: Settings, env_file: Path, command: Sequence[str]) -> list[str]:
    props = [
        "DynamicUser=yes", "PrivateTmp=yes", "ProtectSystem=strict", "ProtectHome=yes", "ProtectProc=invisible",
        "NoNewPrivileges=yes", "PrivateDevices=yes", "UMask=0077", "KillMode=control-group",
        f"InaccessiblePaths=-{settings.data_dir}", f"EnvironmentFile={env_file}", "WorkingDirectory=/tmp",
    ]
    return ["systemd-run", "--quiet", "--pipe", "--wait", "--collect", f"--unit={unit}",
            *(f"--property={p}" for p in props), "--", *command]
