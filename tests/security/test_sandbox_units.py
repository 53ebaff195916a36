"""The sandbox's choices and refusals, without starting an agent (the real start is
test_hostile_agent.py). The systemd path is checked by its argv and environment file only: this host
has no systemd as PID 1."""

from __future__ import annotations

import asyncio
import os
import pwd
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gh_server.agents.registry import AgentRegistry
from gh_server.agents.sandbox import Sandbox, SandboxKind, UidPool, choose
from gh_server.settings import AgentConfig, Settings


def _settings(tmp_path: Path, **kw: object) -> Settings:
    return Settings(data_dir=tmp_path / "data", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("want", "euid", "systemd", "got"), [
    ("auto", 0, True, SandboxKind.SYSTEMD),
    ("auto", 0, False, SandboxKind.USER),
    ("user", 0, True, SandboxKind.USER),
    ("systemd", 0, True, SandboxKind.SYSTEMD),
    ("none", 1000, False, SandboxKind.NONE),
])
def test_choice(tmp_path: Path, want: str, euid: int, systemd: bool, got: SandboxKind) -> None:
    assert choose(_settings(tmp_path, agent_sandbox=want), euid=euid, systemd=systemd) is got


@pytest.mark.parametrize(("want", "euid", "systemd", "why"), [
    ("auto", 1000, True, "gh-server is not root"),  # never a silent weaker sandbox
    ("user", 1000, False, "must run as root"),
    ("systemd", 0, False, "systemd is not PID 1"),
])
def test_refusals(tmp_path: Path, want: str, euid: int, systemd: bool, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        choose(_settings(tmp_path, agent_sandbox=want), euid=euid, systemd=systemd)


def test_uid_range_holding_an_account_is_refused() -> None:
    uid = pwd.getpwnam("gh-agent").pw_uid if _has("gh-agent") else pwd.getpwall()[-1].pw_uid
    with pytest.raises(ValueError, match="includes uid"):
        UidPool(uid, uid + 1).check()
    with pytest.raises(ValueError, match="non-root"):
        UidPool(0, 10).check()


def _has(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def test_pass_env_of_a_server_setting_is_refused_at_start(tmp_path: Path) -> None:
    cfg = AgentConfig(id="a", kind="command", command=["/bin/true"], pass_env=["GH_SERVER_API_KEY"])
    with pytest.raises(ValueError, match="GH_SERVER_API_KEY"):
        AgentRegistry.from_settings(_settings(tmp_path, agent_sandbox="none", agents={"a": cfg}))


def test_environment_is_explicit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GH_SERVER_API_KEY", "gh_live_never")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-passed")
    sb = Sandbox(_settings(tmp_path, agent_sandbox="none"), SandboxKind.NONE)
    env = sb.environment("/home/x", {"GH_MACHINE_API_TOKEN": "t"}, {"MODEL": "m", "GH_MACHINE_API_TOKEN": "forged"},
                         ["OPENAI_API_KEY", "NOT_SET"])
    assert env == {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/home/x", "TMPDIR": "/home/x",
                   "OPENAI_API_KEY": "sk-passed", "MODEL": "m", "GH_MACHINE_API_TOKEN": "t"}


def test_systemd_unit_argv_and_environment_file(tmp_path: Path) -> None:
    settings = _settings(tmp_path, agent_sandbox="systemd")
    sb = Sandbox(settings, SandboxKind.SYSTEMD)
    secret = "tok-" + "x" * 20

    async def go() -> tuple[list[str], dict[str, str], str, int, str]:
        async with sb.launch("at_abc", ["/opt/agent", "--fast"], {"GH_MACHINE_API_TOKEN": secret},
                             {"QUOTE": 'a "b"\nc'}) as launch:
            argv = launch.argv
            env_file = next(a.split("=", 2)[2] for a in argv if a.startswith("--property=EnvironmentFile="))
            mode = stat.S_IMODE(os.stat(env_file).st_mode)
            text = await asyncio.to_thread(Path(env_file).read_text)
        return argv, launch.env, env_file, mode, text

    argv, env, env_file, mode, text = asyncio.run(go())
    assert argv[0] == "systemd-run" and argv[-3:] == ["--", "/opt/agent", "--fast"]
    props = {a.removeprefix("--property=") for a in argv if a.startswith("--property=")}
    assert {"DynamicUser=yes", "PrivateTmp=yes", "ProtectProc=invisible", "ProtectSystem=strict", "ProtectHome=yes",
            "NoNewPrivileges=yes", f"InaccessiblePaths=-{settings.data_dir}"} <= props
    assert any(a.startswith("--unit=gh-agent-at_abc-") for a in argv)
    assert secret not in " ".join(argv) and env == {"PATH": "/usr/local/bin:/usr/bin:/bin"}  # argv is public
    assert mode == 0o600 and f'GH_MACHINE_API_TOKEN="{secret}"' in text and 'QUOTE="a \\"b\\"\\nc"' in text
    assert not Path(env_file).exists()  # removed once the agent is done


# A gh-server killed while an agent runs never reaches the clean-up that removes the agent's HOME.
KILLED_MID_AGENT = """
import asyncio, os, signal, sys
from pathlib import Path
from gh_server.agents.sandbox import Sandbox, SandboxKind
from gh_server.settings import Settings

async def main():
    sb = Sandbox(Settings(data_dir=Path(sys.argv[1])), SandboxKind.NONE)
    async with sb.launch("a", ["/bin/true"], {}) as launch:
        print(launch.env["HOME"], flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


def test_a_killed_servers_agent_homes_are_removed_by_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    child = subprocess.run([sys.executable, "-c", KILLED_MID_AGENT, str(tmp_path / "data")], capture_output=True,
                           text=True, timeout=60, env={**os.environ, "TMPDIR": str(tmp)}, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr
    home = Path(child.stdout.strip())
    assert home.parent == tmp and home.is_dir()  # left behind, as a killed server leaves it
    live = tmp / f"gh-agent-{os.getpid()}-live"  # a running server's: kept
    live.mkdir()
    other = tmp / "gh-agent-notours"
    other.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))

    Sandbox(_settings(tmp_path, agent_sandbox="none"), SandboxKind.NONE)

    assert not home.exists()
    assert live.is_dir() and other.is_dir()
