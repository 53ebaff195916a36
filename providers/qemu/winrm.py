"""PowerShell scripts over WinRM (pywinrm, NTLM) for Windows images that ask for it.

The script is never put on a command line (Windows caps those at 8 KB): a short PowerShell command
reads base64 from stdin and writes the file, and the stdin is sent in chunks. A second small file
sets the environment and calls the script, so its exit code is kept. The account in the image's
credentials file is the auto-logon user and a local administrator with remote UAC filtering off
(LocalAccountTokenFilterPolicy=1, set by the image build), so scripts run elevated as the signed-in
user. Credentials are read from a file under the images directory and never logged.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from providers.base import DEFAULT_OUTPUT_CAP, MachineNotReady, ProviderError, ScriptResult

if TYPE_CHECKING:
    from providers.qemu.provider import QemuMachine

UPLOAD_CHUNK = 48 * 1024  # base64 characters per stdin message
WORK_ROOT = r"C:\Windows\Temp"
_WRITE_FILE = (
    "$ErrorActionPreference='Stop'; $d=[Console]::In.ReadToEnd(); "
    "New-Item -ItemType Directory -Force -Path (Split-Path -Parent $args[0]) | Out-Null; "
    "[IO.File]::WriteAllBytes($args[0], [Convert]::FromBase64String(($d -replace '\\s','')))"
)


class WinRMProtocol(Protocol):
    """The slice of `winrm.protocol.Protocol` used here (the unit tests' boundary)."""

    def open_shell(self) -> str: ...
    def close_shell(self, shell_id: str) -> None: ...
    def run_command(self, shell_id: str, command: str, arguments: Any = ...) -> str: ...
    def send_command_input(self, shell_id: str, command_id: str, stdin_input: str | bytes, end: bool = ...) -> None: ...
    def get_command_output_raw(self, shell_id: str, command_id: str) -> tuple[bytes, bytes, int, bool]: ...
    def cleanup_command(self, shell_id: str, command_id: str) -> None: ...


def ps_quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def env_prologue(env: Mapping[str, str]) -> str:
    lines = []
    for k, v in env.items():
        if not k or any(c in k for c in "=\0'`$") or "\0" in v:
            raise ProviderError(f"invalid environment variable name or value for {k!r}")
        lines.append(f"[Environment]::SetEnvironmentVariable({ps_quote(k)}, {ps_quote(v)}, 'Process')")
    return "\r\n".join(lines)


def load_credentials(path: Path) -> tuple[str, str]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        raise ProviderError(f"cannot read WinRM credentials file {path}") from None
    if not isinstance(data, dict) or not data.get("username") or not isinstance(data.get("password"), str):
        raise ProviderError(f"WinRM credentials file {path} needs 'username' and 'password'")
    return str(data["username"]), data["password"]


class WinRMRunner:
    """Runs scripts through a pywinrm Protocol; blocking, so callers use `run_script` (async)."""

    def __init__(self, make_protocol: Callable[[], WinRMProtocol], *, poll_timeout: float = 30.0) -> None:
        self.make_protocol = make_protocol
        self.poll_timeout = poll_timeout

    def _upload(self, p: WinRMProtocol, shell: str, path: str, data: bytes) -> None:
        cmd = p.run_command(shell, "powershell", ["-NoProfile", "-NonInteractive", "-Command", _WRITE_FILE, path])
        b64 = base64.b64encode(data).decode()
        chunks = [b64[i:i + UPLOAD_CHUNK] for i in range(0, len(b64), UPLOAD_CHUNK)] or [""]
        for i, chunk in enumerate(chunks):
            p.send_command_input(shell, cmd, chunk, end=(i == len(chunks) - 1))
        deadline = time.monotonic() + self.poll_timeout
        err = b""
        while True:
            _, e, code, done = p.get_command_output_raw(shell, cmd)
            err += e
            if done:
                break
            if time.monotonic() > deadline:
                raise ProviderError("uploading the script over WinRM timed out")
        p.cleanup_command(shell, cmd)
        if code != 0:
            raise ProviderError(f"uploading the script over WinRM failed (exit {code})")

    def run_blocking(self, script: str, env: Mapping[str, str] | None, timeout: float, output_cap: int) -> ScriptResult:
        started = time.monotonic()
        prologue = env_prologue(env or {})
        p = self.make_protocol()
        shell = p.open_shell()
        work = f"{WORK_ROOT}\\gh-{secrets.token_hex(6)}"
        try:
            # A BOM makes Windows PowerShell 5 read the file as UTF-8 rather than the ANSI code page.
            self._upload(p, shell, f"{work}\\script.ps1", b"\xef\xbb\xbf" + script.encode("utf-8"))
            runner = f"{prologue}\r\n& (Join-Path $PSScriptRoot 'script.ps1')\r\nexit $LASTEXITCODE\r\n"
            self._upload(p, shell, f"{work}\\run.ps1", b"\xef\xbb\xbf" + runner.encode("utf-8"))
            cmd = p.run_command(shell, "powershell", ["-NoProfile", "-NonInteractive", "-ExecutionPolicy", "Bypass",
                                                      "-File", f"{work}\\run.ps1"])
            out, err = bytearray(), bytearray()
            deadline = started + timeout
            code: int | None = None
            timed_out = False
            while True:
                o, e, c, done = p.get_command_output_raw(shell, cmd)
                # Keep one byte past the cap so truncation is detectable, never more in memory.
                out += o[: max(0, output_cap + 1 - len(out))]
                err += e[: max(0, output_cap + 1 - len(err))]
                if done:
                    code = c
                    break
                if time.monotonic() >= deadline:
                    timed_out = True
                    break
            p.cleanup_command(shell, cmd)
            try:
                rm = p.run_command(shell, "cmd", ["/c", "rmdir", "/s", "/q", work])
                p.cleanup_command(shell, rm)
            except Exception:  # best effort: a leftover temp dir is harmless
                pass
        finally:
            try:
                p.close_shell(shell)
            except Exception:
                pass
        return ScriptResult(
            exit_code=None if timed_out else code,
            stdout=bytes(out[:output_cap]).decode("utf-8", errors="replace"),
            stderr=bytes(err[:output_cap]).decode("utf-8", errors="replace"),
            stdout_truncated=len(out) > output_cap,
            stderr_truncated=len(err) > output_cap,
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
        )

    async def run_script(self, script: str, *, env: Mapping[str, str] | None, timeout: float,
                         output_cap: int = DEFAULT_OUTPUT_CAP) -> ScriptResult:
        try:
            # The blocking loop checks the deadline itself; the outer bound covers a hung HTTP call.
            async with asyncio.timeout(timeout + 2 * self.poll_timeout):  # not wait_for: loses cancels on 3.11
                return await asyncio.to_thread(self.run_blocking, script, env, timeout, output_cap)
        except TimeoutError:
            raise ProviderError(f"WinRM did not answer within {timeout:g}s") from None
        except ProviderError:
            raise
        except Exception as e:  # requests/spnego errors: name the class, never the credentials
            raise ProviderError(f"WinRM failed: {e.__class__.__name__}") from None

    async def wait_ready(self, timeout: float, *, alive: Callable[[], Awaitable[None]] | None = None) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                r = await self.run_script("exit 0", env=None, timeout=min(30.0, deadline - time.monotonic()))
                if r.exit_code == 0:
                    return
                last = f"exit {r.exit_code}"
            except ProviderError as e:
                last = str(e)
                if alive is not None:
                    await alive()
            await asyncio.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
        raise MachineNotReady(f"WinRM did not answer within {timeout:g}s ({last})")


class WinRMChannel(WinRMRunner):
    """A WinRMRunner bound to a machine: finds its address on the isolated network."""

    @classmethod
    def for_machine(cls, machine: QemuMachine) -> WinRMChannel:
        m = machine.image.manifest
        if m.winrm is None:
            raise ProviderError("this image has no WinRM section")
        port = m.winrm.port
        address: dict[str, str] = {}

        def make() -> WinRMProtocol:
            from winrm.protocol import Protocol as PyWinRMProtocol

            if machine.credentials is None:
                # The image's own password is never used: every machine logs on with the one it got
                # through qemu-ga when it became ready (providers/qemu/credentials.py).
                raise ProviderError("the machine has no password of its own yet (wait_ready sets it)")
            if "ip" not in address:
                address["ip"] = machine_address(machine)
            user, password = machine.credentials.username, machine.credentials.password
            return PyWinRMProtocol(  # type: ignore[return-value]
                endpoint=f"http://{address['ip']}:{port}/wsman", transport="ntlm", username=user, password=password,
                server_cert_validation="ignore", read_timeout_sec=30, operation_timeout_sec=20,
                message_encryption="auto",
            )

        return cls(make)


def credentials_path(machine: QemuMachine) -> Path:
    m = machine.image.manifest
    if m.winrm is None:
        raise ProviderError(f"image {m.name!r} has no WinRM section")
    return machine.provider.images_dir / m.winrm.credentials


def machine_address(machine: QemuMachine) -> str:
    import libvirt

    def go(c: libvirt.virConnect) -> str:
        dom = c.lookupByName(machine.domain_name)
        ifaces = dom.interfaceAddresses(libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE, 0)
        for iface in ifaces.values():
            for a in iface.get("addrs") or []:
                if a.get("type") == libvirt.VIR_IP_ADDR_TYPE_IPV4:
                    return str(a["addr"])
        raise ProviderError("the machine has no address on the isolated network yet")

    return machine.provider.conn.call(go)
