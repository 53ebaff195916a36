"""The windows-10 build, without an ISO: its answer file (well-formed, schema-checked, carrying the
settings the build depends on), scripts, VM definition, manifest, WinRM upload and dry run."""

from __future__ import annotations

import base64
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml
from imagebuilder import windows10
from imagebuilder.domain_xml import domain_xml
from imagebuilder.errors import BuildError
from imagebuilder.unattend_schema import check_unattend
from imagebuilder.winrm_channel import WinRMBuildChannel

from providers.manifest import parse_manifest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "image-builder" / "build"
PY = REPO / ".venv" / "bin" / "python"
U = "{urn:schemas-microsoft-com:unattend}"
PASSWORD = "S3cret-Pa55+<&>"


def _component(root: ET.Element, pass_name: str, name: str) -> ET.Element:
    for settings in root.findall(f"{U}settings"):
        if settings.get("pass") == pass_name:
            for comp in settings.findall(f"{U}component"):
                if comp.get("name") == name:
                    return comp
    raise AssertionError(f"no {name} in pass {pass_name}")


def _text(el: ET.Element, path: str) -> str:
    found = el.find("/".join(f"{U}{p}" for p in path.split("/")))
    assert found is not None and found.text is not None, path
    return found.text


def test_answer_file_is_well_formed_passes_the_schema_check_and_has_what_the_build_needs() -> None:
    xml = windows10.render_autounattend(windows10.Settings(), PASSWORD)
    assert check_unattend(xml) == []
    root = ET.fromstring(xml)
    pe_drivers = _component(root, "windowsPE", "Microsoft-Windows-PnpCustomizationsWinPE")
    paths = [p.text or "" for p in pe_drivers.iter(f"{U}Path")]
    assert any(p.endswith(r"\viostor\w10\amd64") for p in paths)
    assert any(p.endswith(r"\NetKVM\w10\amd64") for p in paths)
    setup = _component(root, "windowsPE", "Microsoft-Windows-Setup")
    assert _text(setup, "UserData/AcceptEula") == "true"
    assert _text(setup, "ImageInstall/OSImage/InstallTo/PartitionID") == "2"
    shell = _component(root, "oobeSystem", "Microsoft-Windows-Shell-Setup")
    for flag in ("HideEULAPage", "HideOnlineAccountScreens", "SkipMachineOOBE", "SkipUserOOBE"):
        assert _text(shell, f"OOBE/{flag}") == "true"
    account = shell.find(f"{U}UserAccounts/{U}LocalAccounts/{U}LocalAccount")
    assert account is not None and _text(account, "Group") == "Administrators"
    assert _text(shell, "AutoLogon/Enabled") == "true"
    assert _text(shell, "AutoLogon/Username") == _text(account, "Name")
    first = _text(shell, "FirstLogonCommands/SynchronousCommand/CommandLine")
    assert "enable-winrm.ps1" in first and "gh-config.txt" in first
    # The password is never in plain text; the encoding is the documented one.
    assert PASSWORD not in xml and "<PlainText>true" not in xml
    encoded = _text(shell, "AutoLogon/Password/Value")
    assert base64.b64decode(encoded).decode("utf-16-le") == PASSWORD + "Password"


def test_redacted_and_sysprep_answer_files() -> None:
    redacted = windows10.render_autounattend(windows10.Settings(), None)
    assert windows10.REDACTED in redacted and check_unattend(redacted) == []
    sysprep = windows10.render_autounattend(windows10.Settings(), PASSWORD, passes={"specialize", "oobeSystem"})
    assert re.findall(r'<settings pass="(\w+)">', sysprep) == ["specialize", "oobeSystem"]
    assert check_unattend(sysprep) == []


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda x: x.replace("<HideEULAPage>true</HideEULAPage>", "<HideEULAPage>yes</HideEULAPage>"),
         "'yes' is not true or false"),
        (lambda x: x.replace("<SkipUserOOBE>", "<SkipUserOOBEE>").replace("</SkipUserOOBE>", "</SkipUserOOBEE>"),
         "unknown element 'SkipUserOOBEE'"),
        (lambda x: x.replace("<ComputerName>", "<ComputerNam>").replace("</ComputerName>", "</ComputerNam>"),
         "unknown setting 'ComputerNam'"),
        (lambda x: x.replace('<settings pass="specialize">', '<settings pass="oobeSystem">', 1),
         "appears twice"),
        (lambda x: x.replace('<LocalAccount wcm:action="add">', "<LocalAccount>"), 'needs wcm:action="add"'),
        (lambda x: x.replace('publicKeyToken="31bf3856ad364e35"', 'publicKeyToken="0"', 1), "publicKeyToken"),
        (lambda x: x.replace("<Type>Primary</Type>", "<Type>Huge</Type>", 1), "'Huge' is not one of"),
        (lambda x: x.replace("</unattend>", ""), "not well-formed"),
    ],
)
def test_the_schema_check_finds_mistakes(edit: Any, problem: str) -> None:
    bad = edit(windows10.render_autounattend(windows10.Settings(), PASSWORD))
    problems = check_unattend(bad)
    assert any(problem in p for p in problems), problems


def test_a_setting_in_the_wrong_pass_is_refused() -> None:
    xml = windows10.render_autounattend(windows10.Settings(), PASSWORD)
    moved = xml.replace("<ComputerName>GH-WIN10</ComputerName>", "").replace(
        "<TimeZone>UTC</TimeZone>\n    </component>\n  </settings>\n</unattend>",
        "<TimeZone>UTC</TimeZone>\n      <ComputerName>X</ComputerName>\n    </component>\n  </settings>\n</unattend>")
    assert any("ComputerName: not valid in pass oobeSystem" in p for p in check_unattend(moved))


def test_provisioning_scripts_are_present_and_do_their_job() -> None:
    files = windows10.script_files()
    expected = {"enable-winrm.ps1", "install-guest-agent.ps1", "power-and-screen.ps1", "windows-update-off.ps1",
                "telemetry-minimal.ps1", "cleanup.ps1", "zero-free-space.ps1", "sysprep.ps1",
                "storage-boot-drivers.ps1"}
    assert expected <= set(files)
    body = {f: (windows10.ASSETS / "scripts" / f).read_text() for f in files}
    for f, text in body.items():
        assert "$ErrorActionPreference = 'Stop'" in text, f
        assert text.count("{") == text.count("}") and text.count("(") == text.count(")"), f
    assert "LocalAccountTokenFilterPolicy" in body["enable-winrm.ps1"]
    assert "-LocalPort 5985" in body["enable-winrm.ps1"] and "Negotiate -Value $true" in body["enable-winrm.ps1"]
    assert "qemu-ga-x86_64.msi" in body["install-guest-agent.ps1"]
    assert "NoLockScreen" in body["power-and-screen.ps1"] and "standby-timeout-ac 0" in body["power-and-screen.ps1"]
    assert "NoAutoUpdate" in body["windows-update-off.ps1"]
    assert "AllowTelemetry" in body["telemetry-minimal.ps1"]
    assert r"Panther\unattend.xml" in body["cleanup.ps1"]
    assert "ReTrim" in body["zero-free-space.ps1"]
    assert r"Services\storahci" in body["storage-boot-drivers.ps1"]
    provision, seal = windows10.provisioning(sysprep=False)
    assert provision[0].name.startswith("install virtio drivers")
    assert all("sysprep" not in s.name for s in seal)
    assert windows10.provisioning(sysprep=True)[1][-1].name.startswith("sysprep")


def test_vm_definitions_have_the_speed_settings(tmp_path: Path) -> None:
    dom = ET.fromstring(domain_xml(windows10.runtime_spec(tmp_path)))
    os_type = dom.find("os/type")
    assert os_type is not None and os_type.get("machine") == "q35"
    assert {e.tag for e in dom.findall("features/hyperv/*") if e.get("state") == "on"} >= {
        "relaxed", "vapic", "spinlocks", "vpindex", "synic", "stimer"}
    timers = {t.get("name"): t.get("present") for t in dom.findall("clock/timer")}
    assert timers["hpet"] == "no" and timers["hypervclock"] == "yes"
    assert dom.find("devices/disk/target[@bus='virtio']") is not None
    assert dom.find("devices/input[@type='tablet'][@bus='usb']") is not None
    spec = windows10.machine_spec(tmp_path, tmp_path / "w.iso", tmp_path / "v.iso", 5000)
    argv = " ".join(spec.argv("kvm", tmp_path))
    assert "-machine q35,accel=kvm,hpet=off" in argv and "hv_time" in argv and "hv_synic" in argv
    assert "usb-tablet" in argv and "virtio-blk-pci" in argv
    assert "restrict=on,hostfwd=tcp:127.0.0.1:5000-:5985" in argv  # isolated: only WinRM, only on loopback


def test_windows_manifest_references_credentials_and_never_holds_a_password() -> None:
    m = windows10.manifest("22h2-abc", "a" * 64, 64 << 30)
    text = yaml.safe_dump(m.model_dump(mode="json", exclude_none=True))
    again = parse_manifest(text)
    assert (again.name, again.os, again.shell, again.guest_channels) == (
        "win10-22h2", "windows", "powershell", ["winrm", "qemu-ga"])
    assert again.winrm is not None and again.winrm.credentials == windows10.CREDENTIALS_FILE
    assert again.hyperv and again.machine == "q35" and again.tablet == "usb"
    assert "password" not in text.lower()


class FakeProtocol:
    """pywinrm's Protocol at its boundary: runs the few commands the channel sends."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self.commands: list[tuple[str, list[str]]] = []
        self.last: tuple[str, list[str]] = ("", [])

    def open_shell(self) -> str:
        return "shell"

    def close_shell(self, shell: str) -> None:
        pass

    def run_command(self, shell: str, command: str, args: list[str]) -> str:
        self.commands.append((command, args))
        self.last = (command, args)
        return "cid"

    def cleanup_command(self, shell: str, cid: str) -> None:
        pass

    def get_command_output_raw(self, shell: str, cid: str) -> tuple[bytes, bytes, int, bool]:
        return (*self.get_command_output(shell, cid), True)

    def get_command_output(self, shell: str, cid: str) -> tuple[bytes, bytes, int]:
        command, args = self.last
        if command == "cmd.exe" and args[1].startswith("echo "):
            chunk, target = args[1].removeprefix("echo ").split(">>")
            self.files[target] = self.files.get(target, "") + chunk + "\r\n"
        elif command == "powershell.exe" and "-Command" in args:
            src = next(iter(self.files))
            self.files[src.replace(".b64", ".ps1")] = base64.b64decode(self.files[src].replace("\r\n", "")).decode()
        elif command == "powershell.exe" and "-File" in args:
            return self.files[args[-1]].upper().encode(), b"", 0
        return b"", b"", 0


def test_winrm_channel_uploads_long_scripts_in_chunks_and_runs_them_from_a_file() -> None:
    ch = WinRMBuildChannel("127.0.0.1", 5985, "gh", PASSWORD)
    fake = FakeProtocol()
    ch._protocol = fake
    script = "Write-Output 'hello'\n" + "# padding\n" * 2000  # ~20 KB: past the 8 KB command line
    r = ch.run_script("powershell", script)
    assert r.exit_code == 0 and r.stdout == script.upper()
    echoes = [a for c, a in fake.commands if c == "cmd.exe" and a[1].startswith("echo ")]
    assert len(echoes) > 10 and all(len(" ".join(a)) < 8000 for a in echoes)
    assert all(PASSWORD not in " ".join(a) for _, a in fake.commands)


def test_builder_manifest_and_provider_agree_on_the_isolated_network(tmp_path: Path) -> None:
    from providers.qemu.domain import ISOLATED_NETWORK, DomainSpec, Ownership, build_domain_xml

    m = windows10.manifest("22h2-abc", "a" * 64, 64 << 30)
    spec = windows10.runtime_spec(tmp_path)
    assert spec.network == m.network == "isolated"
    built = ET.fromstring(domain_xml(spec)).find("devices/interface")
    provider = ET.fromstring(build_domain_xml(DomainSpec(
        name="gh-r-at_1", manifest=m, image_dir=tmp_path, overlay=tmp_path / "o.qcow2",
        console_log=tmp_path / "c.log", ownership=Ownership("r", "at_1", str(tmp_path)), accelerator="kvm",
    ))).find("devices/interface")
    for iface in (built, provider):
        assert iface is not None and iface.get("type") == "network"
        src = iface.find("source")
        assert src is not None and src.get("network") == ISOLATED_NETWORK


def test_sysprep_removes_its_answer_file_once_sysprep_has_read_it() -> None:
    text = (windows10.ASSETS / "scripts" / "sysprep.ps1").read_text()
    sysprep_at = text.index("sysprep.exe")
    # sysprep runs to completion (/quit, -Wait) before the answer file is removed, then powers off.
    assert "'/quit'" in text and "-Wait" in text and "'/shutdown'" not in text
    assert text.index("Remove-Item -Force -ErrorAction SilentlyContinue $answer") > sysprep_at
    assert "if (Test-Path $answer) { throw" in text
    assert text.index("shutdown.exe") > text.index("Remove-Item -Force -ErrorAction SilentlyContinue $answer")
    # The copy sysprep cached for the image's first boot goes once OOBE has used it.
    assert r'del /q /f "%WINDIR%\Panther\unattend.xml"' in text and "SetupComplete.cmd" in text


def test_the_credentials_file_is_for_the_service_group_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import grp
    import os
    import stat

    me = grp.getgrgid(os.getgid())
    monkeypatch.setattr(windows10, "SERVICE_GROUP", me.gr_name)  # a group this test may chown to
    path = tmp_path / "win10-22h2.credentials.yaml"
    windows10.write_credentials(path, "gh", PASSWORD)
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_gid == me.gr_gid
    assert yaml.safe_load(path.read_text()) == {"username": "gh", "password": PASSWORD}
    monkeypatch.setattr(windows10, "SERVICE_GROUP", "gh-no-such-group-here")
    windows10.write_credentials(path, "gh", PASSWORD)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_hung_build_command_is_stopped_at_its_deadline_not_when_it_returns() -> None:
    from winrm.exceptions import WinRMOperationTimeoutError

    class Hung(FakeProtocol):
        """A command that never ends: pywinrm's Receive raises OperationTimeout each time it waits."""

        def __init__(self) -> None:
            super().__init__()
            self.cleaned: list[str] = []

        def get_command_output_raw(self, shell: str, cid: str) -> tuple[bytes, bytes, int, bool]:
            raise WinRMOperationTimeoutError()

        def cleanup_command(self, shell: str, cid: str) -> None:
            self.cleaned.append(cid)

    ch = WinRMBuildChannel("127.0.0.1", 5985, "gh", PASSWORD)
    ch._protocol = hung = Hung()
    with pytest.raises(BuildError, match="did not finish within 0 s"):
        ch._run("powershell.exe", ["-NoProfile", "-File", "x.ps1"], 0.2)
    assert hung.cleaned == ["cid"]  # the command was signalled to terminate


def test_dry_run_prints_the_definition_and_steps_and_creates_nothing(tmp_path: Path) -> None:
    out = tmp_path / "images"
    r = subprocess.run(
        [str(PY), str(BUILD), "windows-10", "--iso", "/nonexistent/Win10_22H2_English_x64.iso",
         "--virtio-iso", "/nonexistent/virtio-win.iso", "--out", str(out), "--dry-run"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    s = r.stdout
    for needed in ("## steps", "qemu-system-x86_64", "-machine q35,accel=kvm,hpet=off", "hv_relaxed",
                   "usb-tablet", "virtio-blk-pci", '<timer name="hypervclock" present="yes" />',
                   "answer-file schema check: passed", "install virtio drivers and the QEMU guest agent",
                   "credentials: win10-22h2.credentials.yaml", "qemu-img convert -c -O qcow2"):
        assert needed in s, needed
    ET.fromstring(s.split("## libvirt domain the image is made for\n", 1)[1].split("\n\n", 1)[0])
    answer = s.split("## autounattend.xml (password redacted)\n", 1)[1].split("## answer-file", 1)[0]
    assert check_unattend(answer) == [] and windows10.REDACTED in answer
    assert not out.exists()


def test_windows_build_refuses_missing_inputs_clearly(tmp_path: Path) -> None:
    r = subprocess.run([str(PY), str(BUILD), "windows-10", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "needs --iso" in r.stderr
    r = subprocess.run([str(PY), str(BUILD), "windows-10", "--iso", str(tmp_path / "nope.iso"), "--virtio-iso",
                        str(tmp_path / "v.iso"), "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"--iso {tmp_path / 'nope.iso'}: no such file" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_config_iso_carries_the_answer_file_and_scripts_at_known_paths(tmp_path: Path) -> None:
    answer = windows10.render_autounattend(windows10.Settings(), PASSWORD)
    iso = windows10.make_config_iso(tmp_path, answer, None)
    assert iso.stat().st_mode & 0o077 == 0  # it carries the encoded password
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.iso"]
    listing = subprocess.run(["isoinfo", "-J", "-f", "-i", str(iso)], capture_output=True, text=True,
                             timeout=60, check=True).stdout.split()
    assert "/autounattend.xml" in listing and "/gh-config.txt" in listing
    assert {f"/scripts/{f}" for f in windows10.script_files()} <= set(listing)
    label = subprocess.run(["isoinfo", "-d", "-i", str(iso)], capture_output=True, text=True, timeout=60,
                           check=True).stdout
    assert "Volume id: GHCONFIG" in label
    got = subprocess.run(["isoinfo", "-J", "-x", "/autounattend.xml", "-i", str(iso)], capture_output=True,
                         timeout=60, check=True).stdout.decode()
    assert got == answer


def test_build_orchestration_with_the_vm_faked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Everything but the VM runs for real (config ISO, qemu-img, compression, manifest, credentials);
    the boot is faked at its boundary, since no Windows ISO exists here."""
    import argparse
    import stat as st

    from imagebuilder import pipeline
    from imagebuilder.vm import BuildVM

    seen: dict[str, Any] = {}

    def fake_boot(vm: BuildVM, channel: WinRMBuildChannel, plan: pipeline.BootPlan) -> None:
        seen["argv"] = vm.spec.argv(vm.accel, vm.workdir)
        seen["channel"] = (channel.username, channel._password, channel.endpoint)
        seen["steps"] = [s.name for s in [*plan.provision, *plan.seal]]
        seen["iso_mode"] = (vm.workdir / "config.iso").stat().st_mode

    monkeypatch.setattr(pipeline, "boot_provision_seal", fake_boot)
    monkeypatch.setattr(windows10, "build_accelerator", lambda kernel, cache_dir: "kvm")
    (tmp_path / "win.iso").write_bytes(b"windows")
    (tmp_path / "virtio.iso").write_bytes(b"virtio")
    out = tmp_path / "images"
    args = argparse.Namespace(iso=tmp_path / "win.iso", virtio_iso=tmp_path / "virtio.iso", out=out, dry_run=False,
                              sysprep=False, force=False)
    assert windows10.main(args) == 0
    m = parse_manifest((out / "win10-22h2" / "image.yaml").read_text())
    assert m.version.startswith("22h2-") and (out / "win10-22h2" / "disk.qcow2").is_file()
    cred = out / windows10.CREDENTIALS_FILE
    assert st.S_IMODE(cred.stat().st_mode) == 0o600
    creds = yaml.safe_load(cred.read_text())
    user, password, endpoint = seen["channel"]
    assert creds == {"username": user, "password": password} and len(password) >= 20
    assert endpoint.startswith("http://127.0.0.1:") and endpoint.endswith("/wsman")
    assert st.S_IMODE(seen["iso_mode"]) == 0o600
    assert "install virtio drivers and the QEMU guest agent" in seen["steps"]
    assert any("hostfwd=tcp:127.0.0.1:" in a for a in seen["argv"])
    logged = capsys.readouterr()
    assert password not in logged.out + logged.err
    expected = sorted([".win10-22h2.lock", windows10.CREDENTIALS_FILE, "win10-22h2"])
    assert sorted(p.name for p in out.iterdir()) == expected  # no staging or temporary files left
    # Same inputs again: up to date, nothing rebuilt, the credentials kept.
    monkeypatch.setattr(pipeline, "boot_provision_seal", lambda *a: pytest.fail("rebuilt"))
    assert windows10.main(args) == 0
    assert yaml.safe_load(cred.read_text()) == creds
