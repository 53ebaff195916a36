"""Channel routing by capability, for every manifest the image builder writes, and the provider's
refusal of an image no channel can run. No libvirt, no guest: the machine's qemu-ga and pywinrm's
Protocol are replaced at their boundaries (the qemu-ga replies are the shapes of qga/qapi-schema.json)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from imagebuilder import windows10

from providers.errors import ProviderError
from providers.manifest import ImageManifest, dump_manifest, load_manifest
from providers.qemu import QemuProvider, execd
from providers.qemu import winrm as winrm_mod
from providers.qemu.channels import Channel, Duty, UnroutableImage, routes_for
from providers.qemu.images import ImageCatalog
from providers.qemu.machine import QemuMachine

LINUX_TINY = Path("/var/tmp/gh-runner/images/linux-tiny")
WIN_USER = "gh"


def windows_manifest(**update: Any) -> ImageManifest:
    return windows10.manifest("22h2-test", "0" * 64, 1 << 30).model_copy(update=update)


def linux_tiny_manifest() -> ImageManifest:
    # The manifest image-builder/build linux-tiny wrote on this host (scripts/setup.sh builds it).
    if not (LINUX_TINY / "image.yaml").is_file():
        pytest.fail(f"no linux-tiny image in {LINUX_TINY}: run scripts/setup.sh")
    return load_manifest(LINUX_TINY, verify_checksum=False)


def test_windows_manifest_routes_scripts_to_winrm_and_agent_duties_to_qemu_ga() -> None:
    r = routes_for(windows_manifest())
    assert r.script is Channel.WINRM
    for duty in (Duty.CLOCK, Duty.FREEZE, Duty.SHUTDOWN, Duty.PASSWORD):
        assert r.channel(duty) is Channel.QEMU_GA, duty
    assert r.per_machine_password
    assert r.ready_order == (Channel.QEMU_GA, Channel.WINRM)


def test_linux_tiny_manifest_routes_everything_to_qemu_ga_with_its_executor_first() -> None:
    m = linux_tiny_manifest()
    r = routes_for(m)
    assert r.script is Channel.QEMU_GA and r.channel(Duty.CLOCK) is Channel.QEMU_GA
    assert not r.per_machine_password and r.ready_order == (Channel.QEMU_GA,)
    assert r.execd  # scripts go to gh-execd first (providers/qemu/execd.py)
    assert not routes_for(m.model_copy(update={"guest_channels": ["qemu-ga"]})).execd
    assert not routes_for(windows_manifest()).execd


@pytest.mark.parametrize("update", [
    {"guest_channels": ["gh-execd"]},  # nothing would take what it does not: another user, big output
    {"os": "windows", "shell": "powershell", "guest_channels": ["winrm", "qemu-ga", "gh-execd"]},
])
def test_an_executor_is_declared_only_beside_qemu_ga_on_linux(update: dict[str, Any]) -> None:
    data = linux_tiny_manifest().model_dump(mode="json") | update
    if update.get("os") == "windows":
        data["winrm"] = windows_manifest().winrm.model_dump(mode="json")  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="gh-execd runs beside qemu-ga on a linux image"):
        ImageManifest.model_validate(data)


def test_the_executors_wire_format_and_its_port_in_the_domain() -> None:
    env = ["PATH=/bin", "GH_X=a b"]
    raw = execd.encode_request(9, b"echo hi", env, interpreter="/bin/sh", timeout=2.5, keep=11,
                               clock_ms=1_700_000_000_123, reseed=b"\x01" * 32)
    head = execd.REQUEST.unpack(raw[:execd.REQUEST.size])
    assert head == (execd.REQUEST_MAGIC, 9, execd.FLAG_CLOCK | execd.FLAG_RESEED, 2500, 11, 32, 1_700_000_000_123,
                    len("/bin/sh"), len("PATH=/bin\0GH_X=a b\0"), len("echo hi"), 0)
    assert raw[execd.REQUEST.size:] == b"\x01" * 32 + b"/bin/sh" + b"PATH=/bin\0GH_X=a b\0" + b"echo hi"
    plain = execd.REQUEST.unpack(execd.encode_request(1, b"", [], interpreter="/bin/sh", timeout=1, keep=0,
                                                      clock_ms=None, reseed=None)[:execd.REQUEST.size])
    assert plain[2] == 0 and plain[6] == 0
    # Past gh-execd's static buffers: nothing is sent, the script goes to qemu-ga.
    for kw in ({"script": b"x" * (execd.MAX_SCRIPT + 1)}, {"keep": execd.MAX_KEEP + 1},
               {"env": ["A=" + "x" * execd.MAX_ENV]}, {"interpreter": "/bin/s\0h"}):
        args: dict[str, Any] = {"script": b"", "env": [], "interpreter": "/bin/sh", "keep": 1} | kw
        with pytest.raises(execd.Unavailable):
            execd.encode_request(1, args["script"], args["env"], interpreter=args["interpreter"], timeout=1,
                                 keep=args["keep"], clock_ms=None, reseed=None)
    live = """<domain><devices>
      <channel type='unix'><source mode='bind' path='/run/a/org.qemu.guest_agent.0'/>
        <target type='virtio' name='org.qemu.guest_agent.0'/></channel>
      <channel type='unix'><source mode='bind' path='/run/a/org.ghrunner.exec.0'/>
        <target type='virtio' name='org.ghrunner.exec.0'/></channel></devices></domain>"""
    assert execd.port_path(live) == "/run/a/org.ghrunner.exec.0"
    assert execd.port_path("<domain><devices/></domain>") is None


@pytest.mark.parametrize(("channels", "missing"), [
    (["qemu-ga"], r"no guest channel runs its powershell scripts.*needs winrm; guest_channels lists qemu-ga"),
    (["winrm"], r"its WinRM account needs a per-machine password, which only qemu-ga can set"),
])
def test_a_windows_image_without_the_channel_it_needs_is_refused_naming_what_is_missing(
        channels: list[str], missing: str) -> None:
    with pytest.raises(UnroutableImage, match=rf"image 'win10-22h2': {missing}"):
        routes_for(windows_manifest(guest_channels=channels))


def test_a_linux_image_with_only_winrm_is_refused() -> None:
    m = linux_tiny_manifest().model_copy(update={"guest_channels": ["winrm"]})
    with pytest.raises(UnroutableImage, match=r"its sh scripts.*needs qemu-ga"):
        routes_for(m)


def _write_image(images: Path, manifest: ImageManifest) -> None:
    d = images / manifest.name
    d.mkdir(parents=True)
    disk = b"not really qcow2, the checksum is what the catalog reads"
    (d / "disk.qcow2").write_bytes(disk)
    m = manifest.model_copy(update={"disk": manifest.disk.model_copy(
        update={"sha256": hashlib.sha256(disk).hexdigest()})})
    (d / "image.yaml").write_text(dump_manifest(m))
    (images / windows10.CREDENTIALS_FILE).write_text(yaml.safe_dump({"username": WIN_USER, "password": "image-pw"}))


async def test_the_provider_refuses_an_image_no_channel_can_run_and_does_not_advertise_it(tmp_path: Path) -> None:
    _write_image(tmp_path, windows_manifest(guest_channels=["qemu-ga"]))
    catalog = ImageCatalog(tmp_path)
    assert await catalog.scan() == []
    assert "needs winrm" in next(iter(catalog.skipped().values()))
    with pytest.raises(ProviderError, match=r"image 'win10-22h2' is not usable: .*needs winrm"):
        await catalog.get("win10-22h2")


class FakeAgent:
    """qemu-ga at libvirt's qemuAgentCommand boundary: the replies qga gives on Windows."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any] | None]] = []

    async def wait_ready(self, timeout: float, *, alive: Any = None) -> None:
        self.calls.append(("guest-ping", None))

    async def command(self, execute: str, arguments: dict[str, Any] | None = None, *,
                      timeout: float | None = None) -> Any:
        self.calls.append((execute, arguments))
        if execute == "guest-get-users":
            return [{"user": WIN_USER, "domain": "WIN10-GH", "login-time": 1700000000.5}]
        return {}

    async def run_sh(self, *a: Any, **kw: Any) -> Any:
        raise AssertionError("a PowerShell script must not go to qemu-ga")


class FakePyWinRM:
    """pywinrm's winrm.protocol.Protocol: remembers how it was made, answers every command at once."""

    made: list[dict[str, Any]] = []

    def __init__(self, **kw: Any) -> None:
        FakePyWinRM.made.append(kw)
        self.commands: list[tuple[str, list[str]]] = []

    def open_shell(self) -> str:
        return "shell"

    def close_shell(self, shell_id: str) -> None:
        pass

    def run_command(self, shell_id: str, command: str, arguments: Any = (), console_mode_stdin: bool = True) -> str:
        self.commands.append((command, list(arguments)))
        return f"c{len(self.commands)}"

    def send_command_input(self, shell_id: str, command_id: str, stdin_input: Any, end: bool = False) -> None:
        pass

    def get_command_output_raw(self, shell_id: str, command_id: str) -> tuple[bytes, bytes, int, bool]:
        return b"True\r\n", b"", 0, True

    def cleanup_command(self, shell_id: str, command_id: str) -> None:
        pass


async def test_a_machine_of_the_windows_image_gets_its_own_password_then_runs_powershell_over_winrm(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import winrm.protocol

    _write_image(tmp_path, windows_manifest())
    provider = QemuProvider(tmp_path, tmp_path / "state", "chantest")
    image = await provider.catalog.get("win10-22h2")
    machine = QemuMachine("at_1", "gh-chantest-at_1", image, tmp_path / "m", conn=provider.conn, images_dir=tmp_path,
                          options=provider.machine_options(), reaper=provider.reaper, versions=provider.versions,
                          calibration=provider.calibration)
    agent = FakeAgent()
    machine.agent = agent  # type: ignore[assignment]
    monkeypatch.setattr(winrm.protocol, "Protocol", FakePyWinRM)
    monkeypatch.setattr(winrm_mod, "machine_address", lambda m: "192.168.122.50")
    FakePyWinRM.made = []

    await machine.wait_ready(30)
    # qemu-ga first: the signed-in user is found, then given a new password, before any WinRM logon.
    assert [c for c, _ in agent.calls] == ["guest-ping", "guest-get-users", "guest-set-user-password"]
    args = agent.calls[2][1]
    assert args is not None and args["username"] == WIN_USER and args["crypted"] is False
    assert machine.credentials is not None and machine.credentials.password != "image-pw"
    assert FakePyWinRM.made and all(
        kw["username"] == WIN_USER and kw["password"] == machine.credentials.password for kw in FakePyWinRM.made)
    assert machine.credentials.password not in repr(machine.credentials)

    r = await machine.run_script("Write-Output $true", timeout=30)
    assert r.exit_code == 0 and r.stdout == "True\r\n"


class _XmlOnlyDomain:
    """A domain as ExecChannel.connect sees it: only its live XML (no libvirt here)."""

    def __init__(self, xml: str) -> None:
        self.xml = xml
        self.lookups = 0

    def call_blocking(self, fn: Any, *, retry: bool = True) -> Any:
        self.lookups += 1
        return fn(None, self)

    def XMLDesc(self, _flags: int) -> str:  # libvirt's name
        return self.xml


@pytest.mark.parametrize("xml", [
    "<domain><devices/></domain>",  # a domain defined without the port
    "<domain><devices><channel type='unix'><source mode='bind' path='/nonexistent/gh-execd.sock'/>"
    "<target type='virtio' name='org.ghrunner.exec.0'/></channel></devices></domain>",  # nobody listens
])
async def test_an_executor_that_cannot_be_reached_is_given_up_once_and_nothing_is_sent(xml: str) -> None:
    dom = _XmlOnlyDomain(xml)
    channel = execd.ExecChannel(dom)  # type: ignore[arg-type]
    with pytest.raises(execd.Unavailable):
        await channel.run("echo hi", ["PATH=/bin"], interpreter="/bin/sh", timeout=5, output_cap=10)
    assert channel.broken is not None and not channel.free  # the machine's scripts go to qemu-ga
    with pytest.raises(execd.Unavailable):
        await channel.run("echo hi", ["PATH=/bin"], interpreter="/bin/sh", timeout=5, output_cap=10)
    assert dom.lookups == 1  # not looked for again on every script


async def test_a_request_the_executor_refuses_unrun_goes_to_qemu_ga(tmp_path: Path) -> None:
    """An image whose gh-execd speaks another version refuses the request without running it
    (BAD_REQUEST): the script is then qemu-ga's, not a failed script. The peer here answers in
    gh-execd's wire format, as test_execd.py shows the real one does."""
    sock = tmp_path / "execd.sock"
    seen: list[bytes] = []

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readexactly(execd.REQUEST.size)
        seen.append(head)
        writer.write(execd.REPLY.pack(execd.REPLY_MAGIC, execd.REQUEST.unpack(head)[1], execd.ReplyKind.BAD_REQUEST,
                                      0, 0, 0))
        await writer.drain()

    server = await asyncio.start_unix_server(refuse, path=str(sock))
    try:
        dom = _XmlOnlyDomain("<domain><devices><channel type='unix'>"
                             f"<source mode='bind' path='{sock}'/><target type='virtio' name='org.ghrunner.exec.0'/>"
                             "</channel></devices></domain>")
        channel = execd.ExecChannel(dom)  # type: ignore[arg-type]
        with pytest.raises(execd.Unavailable, match="refused"):
            await channel.run("echo hi", ["PATH=/bin"], interpreter="/bin/sh", timeout=5, output_cap=10)
        assert len(seen) == 1 and channel.broken is not None and not channel.free
    finally:
        server.close()
        await server.wait_closed()
