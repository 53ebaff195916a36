"""The shipped systemd files: `systemd-analyze verify` clean, security exposure <= 2.0, and the
sysusers/tmpfiles entries really create the user, groups and directories the units expect.

There is no systemd PID 1 here, so everything runs offline against a throwaway root: verify needs
the units' ExecStart binaries and systemd's own units (sysinit.target...) to exist under --root.
"""

from __future__ import annotations

import configparser
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

SYSTEMD_DIR = Path(__file__).resolve().parents[2] / "systemd"
SYSTEM_UNITS = next((p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")) if p.is_dir()), None)
UNITS = ["gh-runner.service", "gh-server.service", "gh-server@.service"]


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: install Debian's 'systemd' package (scripts/setup.sh does)")
    return path


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def root() -> Iterator[Path]:
    r = Path(tempfile.mkdtemp(prefix="gh-systemd-root-"))
    try:
        yield r
    finally:
        shutil.rmtree(r)


def unit_root(root: Path) -> Path:
    assert SYSTEM_UNITS is not None, "no systemd unit directory on this host"
    (root / "usr/bin").mkdir(parents=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    for unit in UNITS:
        shutil.copy(SYSTEMD_DIR / unit, root / "etc/systemd/system" / unit)
        exec_start = unit_value(unit, "ExecStart").split()[0]
        stub = root / exec_start.lstrip("/")
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)
    return root


def unit_value(unit: str, key: str, section: str = "Service") -> str:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read(SYSTEMD_DIR / unit)
    return cp[section][key]


@pytest.mark.parametrize("unit", [u.replace("@.", "@8701.") for u in UNITS])  # a template needs an instance
def test_verify_is_clean(unit: str, root: Path) -> None:
    r = run(tool("systemd-analyze"), "verify", f"--root={unit_root(root)}", unit)
    # verify exits 0 on unknown keys and unparsable values but prints them: any output is a defect.
    assert r.returncode == 0 and r.stderr.strip() == "" and r.stdout.strip() == "", r.stdout + r.stderr


def test_verify_would_catch_a_broken_unit(root: Path) -> None:
    unit_root(root)
    unit = root / "etc/systemd/system/gh-runner.service"
    unit.write_text(unit.read_text().replace("WatchdogSec=60s", "WatchdogSec=banana\nNoSuchKey=1"))
    r = run(tool("systemd-analyze"), "verify", f"--root={root}", "gh-runner.service")
    assert "banana" in r.stderr and "NoSuchKey" in r.stderr


def exposure(unit: str) -> float:
    r = run(tool("systemd-analyze"), "security", "--offline=true", str(SYSTEMD_DIR / unit))
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout)
    assert m, r.stdout + r.stderr
    return float(m.group(1))


def test_runner_exposure_is_at_most_2() -> None:
    assert exposure("gh-runner.service") <= 2.0


def test_server_exposure_is_at_most_2() -> None:
    assert exposure("gh-server.service") <= 2.0
    assert exposure("gh-server@.service") <= 2.0  # the same sandbox for each of several processes


def test_runner_unit_contract() -> None:
    u = "gh-runner.service"
    assert unit_value(u, "Type") == "notify"
    assert unit_value(u, "KillSignal") == "SIGTERM"
    assert unit_value(u, "Restart") == "on-failure"
    assert unit_value(u, "User") == "gh-runner"
    assert {"libvirt", "kvm"} <= set(unit_value(u, "SupplementaryGroups").split())
    assert unit_value(u, "LoadCredential") == "gh-runner-token:/etc/gh-runner/token"
    assert "--config /etc/gh-runner/config.yaml" in unit_value(u, "ExecStart")
    assert int(unit_value(u, "WatchdogSec").removesuffix("s")) > 0
    assert unit_value(u, "CapabilityBoundingSet") == ""
    assert unit_value(u, "PrivateDevices") == "yes"
    # SIGTERM drains; systemd must not SIGKILL before the drain grace has run out.
    example = yaml.safe_load((SYSTEMD_DIR / "config.example.yaml").read_text())
    assert int(unit_value(u, "TimeoutStopSec").removesuffix("s")) > float(example["drain_grace"])
    assert "token" not in example  # the token travels as a credential, never in the config file


def test_example_config_is_what_the_runner_accepts(root: Path) -> None:
    """The shipped example loads as the service would load it, token from the systemd credential."""
    from gh_runner.config import load_config

    creds = root / "creds"
    creds.mkdir()
    (creds / "gh-runner-token").write_text("gh_rn_from_credential_0123456789\n")
    cfg = load_config({}, {"CREDENTIALS_DIRECTORY": str(creds)}, SYSTEMD_DIR / "config.example.yaml")
    assert cfg.token is not None and cfg.token.get_secret_value() == "gh_rn_from_credential_0123456789"
    assert str(cfg.state_dir).startswith("/var/lib/gh-runner") and str(cfg.images_dir).startswith("/var/lib/gh-runner")
    assert cfg.slots >= 1 and cfg.server and cfg.server.startswith("wss://")
    assert int(unit_value("gh-runner.service", "TimeoutStopSec").removesuffix("s")) > cfg.drain_grace


def test_sysusers_and_tmpfiles_make_the_expected_host(root: Path) -> None:
    (root / "etc").mkdir()
    for f in ("passwd", "group"):
        shutil.copy(Path("/etc") / f, root / "etc" / f)
    r = run(tool("systemd-sysusers"), f"--root={root}", str(SYSTEMD_DIR / "gh-runner.sysusers"))
    assert r.returncode == 0, r.stderr
    passwd = {line.split(":")[0]: line.split(":") for line in (root / "etc/passwd").read_text().splitlines()}
    groups = {line.split(":")[0]: line.split(":") for line in (root / "etc/group").read_text().splitlines()}
    assert passwd["gh-runner"][6] == "/usr/sbin/nologin"
    assert "gh-runner" in groups["libvirt"][3].split(",")
    assert "gh-runner" in groups["kvm"][3].split(",")
    assert "gh-runner" in groups["libvirt-qemu"][3].split(",")  # disks are 0640 with QEMU's group

    r = run(tool("systemd-tmpfiles"), f"--root={root}", "--create", str(SYSTEMD_DIR / "gh-runner.tmpfiles"))
    assert r.returncode == 0, r.stderr
    uid = int(passwd["gh-runner"][2])
    for d in ("var/lib/gh-runner", "var/lib/gh-runner/images", "var/lib/gh-runner/state"):
        st = (root / d).stat()
        # libvirt-qemu (another user) opens disks under here: every level must be traversable.
        assert st.st_uid == uid and stat.S_IMODE(st.st_mode) & 0o001, d
    etc = (root / "etc/gh-runner").stat()
    assert stat.S_IMODE(etc.st_mode) & 0o007 == 0  # config dir not world-readable
