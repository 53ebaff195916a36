"""PowerShell scripts over WinRM (pywinrm, NTLM), run the way Windows runs a `.ps1`.

What pywinrm sends: `run_command(shell, command, args)` becomes one Windows command line, the
arguments joined with spaces and no quoting (`rsp:Arguments`), and powershell.exe joins whatever
follows `-Command` into the command text. So nothing here passes data as trailing arguments:
- upload: `powershell.exe ... -EncodedCommand <UTF-16LE base64>` (pywinrm's own `run_ps` form)
  reads base64 from stdin (`$input`, as Ansible's bootstrap does, with console-mode stdin off) and
  writes the file whose path is inside the encoded text; stdin goes in chunks, so no command line
  comes near Windows' 8 KB limit whatever the script's size.
- run: `powershell.exe -NoProfile -NonInteractive -ExecutionPolicy Bypass -File <dir>\run.ps1`.
  run.ps1 (see `wrapper_script`) makes stdout UTF-8, sets the environment (values quoted), defines
  `Start-GhInteractive`, calls the script and exits with `$LASTEXITCODE`; a thrown (terminating)
  error is printed as text and exits 1.
- output: stdout decoded as UTF-8 (UTF-16 when it carries a UTF-16 BOM); CLIXML on stderr (how
  powershell.exe serialises its error and progress records to a pipe) turned into plain text.
- timeout: each Receive waits at most OPERATION_TIMEOUT_S, so the deadline is checked while the
  command runs; at the deadline its process tree (pid written by run.ps1) is killed with taskkill
  and the command signalled, so the guest is usable for the next script.

The account is the image's auto-logon user, a local administrator with remote UAC filtering off
(LocalAccountTokenFilterPolicy=1, set by the image build): a WinRM logon gets its full token and its
own HKCU. It is a network logon, though: a program a script starts has no window on the console;
`Start-GhInteractive` starts one in the signed-in session (a scheduled task). The password is the
machine's own (providers/qemu/credentials.py), held in memory and never logged.
"""

from __future__ import annotations

import asyncio
import base64
import re
import secrets
import time
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import yaml

from providers.base import DEFAULT_OUTPUT_CAP, ScriptResult
from providers.errors import MachineNotReady, ProviderError
from providers.qemu.credentials import Credentials
from providers.qemu.handle import Domain
from providers.qemu.images import Image

UPLOAD_CHUNK = 48 * 1024  # base64 characters per stdin message (pywinrm's envelope cap is 150 KB)
WORK_ROOT = r"C:\Windows\Temp"
OPERATION_TIMEOUT_S = 5  # a Receive with no output returns after this: the deadline's granularity
READ_TIMEOUT_S = 15  # HTTP read timeout; must exceed the operation timeout
POWERSHELL = "powershell.exe"
PS_FLAGS = ["-NoProfile", "-NonInteractive"]
CLIXML_MARK = "#< CLIXML"

_WRITE_FILE = (
    "$ErrorActionPreference = 'Stop'; $p = {path}; $d = ($input | Out-String) -replace '\\s', ''; "
    "New-Item -ItemType Directory -Force -Path (Split-Path -Parent $p) | Out-Null; "
    "[IO.File]::WriteAllBytes($p, [Convert]::FromBase64String($d))"
)
_KILL_TREE = (
    "$f = {pidfile}; if (Test-Path $f) {{ $p = (Get-Content $f -Raw).Trim(); "
    "if ($p) {{ & taskkill.exe /F /T /PID $p 2>&1 | Out-Null }} }}"
)

# Start-GhInteractive: for setup scripts that must show something on the console (a WinRM logon has
# no desktop). A one-shot scheduled task in the signed-in user's interactive session, elevated. It is
# left registered: the machine is thrown away after the attempt, and deleting a task that is still
# starting could stop it.
START_INTERACTIVE = r"""
function Start-GhInteractive {
    param([Parameter(Mandatory = $true)][string]$FilePath, [string[]]$ArgumentList = @())
    $user = (Get-CimInstance -ClassName Win32_ComputerSystem).UserName
    if (-not $user) { throw 'Start-GhInteractive: nobody is signed in on the console' }
    $argLine = ($ArgumentList | ForEach-Object {
        if ($_ -match '[\s"]') { '"' + ($_ -replace '"', '\"') + '"' } else { $_ } }) -join ' '
    $action = if ($argLine) { New-ScheduledTaskAction -Execute $FilePath -Argument $argLine }
              else { New-ScheduledTaskAction -Execute $FilePath }
    $principal = New-ScheduledTaskPrincipal -UserId $user -LogonType Interactive -RunLevel Highest
    $name = 'gh-interactive-' + [guid]::NewGuid().ToString('N')
    Register-ScheduledTask -TaskName $name -Action $action -Principal $principal -Force | Out-Null
    Start-ScheduledTask -TaskName $name
}
""".strip("\n")


class WinRMProtocol(Protocol):
    """The slice of `winrm.protocol.Protocol` used here (the unit tests' boundary)."""

    def open_shell(self) -> str: ...
    def close_shell(self, shell_id: str) -> None: ...
    def run_command(self, shell_id: str, command: str, arguments: Any = ..., console_mode_stdin: bool = ...,
                    ) -> str: ...
    def send_command_input(self, shell_id: str, command_id: str, stdin_input: str | bytes, end: bool = ...) -> None: ...
    def get_command_output_raw(self, shell_id: str, command_id: str) -> tuple[bytes, bytes, int, bool]: ...
    def cleanup_command(self, shell_id: str, command_id: str) -> None: ...


def ps_quote(value: str) -> str:
    """A PowerShell single-quoted literal: nothing inside is expanded; ' is doubled. PowerShell also
    ends such a literal at the typographic quotes U+2018/U+2019/U+201A/U+201B, so those are doubled too."""
    return "'" + re.sub("(['\u2018\u2019\u201a\u201b])", r"\1\1", value) + "'"


def encoded_command(script: str) -> str:
    """powershell.exe's -EncodedCommand argument: base64 of the UTF-16LE text."""
    return base64.b64encode(script.encode("utf-16-le")).decode("ascii")


def env_prologue(env: Mapping[str, str]) -> str:
    lines = []
    for k, v in env.items():
        if not k or any(c in k for c in "=\0'`$\u2018\u2019\u201a\u201b") or "\0" in v:
            raise ProviderError(f"invalid environment variable name or value for {k!r}")
        lines.append(f"[Environment]::SetEnvironmentVariable({ps_quote(k)}, {ps_quote(v)}, 'Process')")
    return "\r\n".join(lines)


def wrapper_script(work: str, env: Mapping[str, str]) -> str:
    """run.ps1: the script's surroundings, so that it behaves as it would run from a console."""
    lines = [
        "$ErrorActionPreference = 'Continue'",
        "$ProgressPreference = 'SilentlyContinue'  # progress records would reach stderr as CLIXML",
        "try { [Console]::OutputEncoding = New-Object System.Text.UTF8Encoding $false } catch { }",
        "$OutputEncoding = New-Object System.Text.UTF8Encoding $false",
        f"Set-Content -Path {ps_quote(work + chr(92) + 'pid')} -Value $PID",
        env_prologue(env),
        START_INTERACTIVE,
        "$global:LASTEXITCODE = 0",
        f"try {{ & {ps_quote(work + chr(92) + 'script.ps1')} }}",
        "catch { [Console]::Error.WriteLine(($_ | Out-String).TrimEnd()); exit 1 }",
        "exit $LASTEXITCODE",
    ]
    return "\r\n".join(line for line in lines if line) + "\r\n"


def decode_stream(data: bytes) -> str:
    """stdout/stderr bytes as text: UTF-8 (what run.ps1 asks for), or UTF-16LE when a program wrote
    a UTF-16 byte-order mark (cmd /u, a [Console]::OutputEncoding of Unicode)."""
    if data.startswith(b"\xff\xfe"):
        return data[2:].decode("utf-16-le", errors="replace")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    return data.decode("utf-8", errors="replace")


_CLIXML_ESCAPE = re.compile(r"_x([0-9A-Fa-f]{4})_")
_PS_NS = "{http://schemas.microsoft.com/powershell/2004/04}"


def clixml_to_text(text: str) -> str:
    """stderr with powershell.exe's CLIXML records turned into the plain text a console shows:
    the string records (`<S S="Error">`, warnings, verbose) unescaped (`_x000D__x000A_` is CRLF),
    progress records dropped. Text that is not CLIXML, or not well-formed, is returned as it is."""
    at = text.find(CLIXML_MARK)
    if at < 0:
        return text
    before, rest = text[:at], text[at + len(CLIXML_MARK):]
    try:
        root = ET.fromstring(rest.strip())
    except ET.ParseError:
        return text
    parts: list[str] = []
    for node in root.iter():
        if node.tag in (f"{_PS_NS}S", "S") and node.get("S") and node.text:
            parts.append(_CLIXML_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), node.text))
    return before + "".join(parts).replace("\r\n", "\n").rstrip("\n") + ("\n" if parts else "")


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

    def _receive(self, p: WinRMProtocol, shell: str, cmd: str) -> tuple[bytes, bytes, int, bool]:
        """One Receive; pywinrm raises when the command printed nothing for the operation timeout."""
        from winrm.exceptions import WinRMOperationTimeoutError  # pywinrm loads only where WinRM is used

        try:
            return p.get_command_output_raw(shell, cmd)
        except WinRMOperationTimeoutError:
            return b"", b"", -1, False

    def _upload(self, p: WinRMProtocol, shell: str, path: str, data: bytes, deadline: float) -> None:
        cmd = p.run_command(shell, POWERSHELL, [*PS_FLAGS, "-EncodedCommand",
                                                encoded_command(_WRITE_FILE.format(path=ps_quote(path)))],
                            console_mode_stdin=False)
        b64 = base64.b64encode(data).decode()
        chunks = [b64[i:i + UPLOAD_CHUNK] for i in range(0, len(b64), UPLOAD_CHUNK)] or [""]
        for i, chunk in enumerate(chunks):
            p.send_command_input(shell, cmd, chunk, end=(i == len(chunks) - 1))
        err = b""
        while True:
            _, e, code, done = self._receive(p, shell, cmd)
            err += e[:4096]
            if done:
                break
            if time.monotonic() > deadline:
                p.cleanup_command(shell, cmd)
                raise ProviderError("uploading the script over WinRM timed out")
        p.cleanup_command(shell, cmd)
        if code != 0:
            detail = clixml_to_text(decode_stream(err)).strip()[-300:]
            raise ProviderError(f"uploading the script over WinRM failed (exit {code})"
                                + (f": {detail}" if detail else ""))

    def _kill_tree(self, p: WinRMProtocol, shell: str, work: str) -> None:
        """After a timeout: the terminate signal ends powershell.exe, not what it started; taskkill /T does."""
        cmd = p.run_command(shell, POWERSHELL, [*PS_FLAGS, "-EncodedCommand",
                                                encoded_command(_KILL_TREE.format(pidfile=ps_quote(work + "\\pid")))])
        deadline = time.monotonic() + self.poll_timeout
        while not self._receive(p, shell, cmd)[3] and time.monotonic() < deadline:
            pass
        p.cleanup_command(shell, cmd)

    def run_blocking(self, script: str, env: Mapping[str, str] | None, timeout: float, output_cap: int) -> ScriptResult:
        started = time.monotonic()
        deadline = started + timeout
        work = f"{WORK_ROOT}\\gh-{secrets.token_hex(6)}"
        wrapper = wrapper_script(work, env or {})  # refuses a bad environment before anything is sent
        p = self.make_protocol()
        shell = p.open_shell()
        try:
            # A BOM makes Windows PowerShell 5 read the file as UTF-8 rather than the ANSI code page.
            self._upload(p, shell, f"{work}\\script.ps1", b"\xef\xbb\xbf" + script.encode("utf-8"), deadline)
            self._upload(p, shell, f"{work}\\run.ps1", b"\xef\xbb\xbf" + wrapper.encode("utf-8"), deadline)
            cmd = p.run_command(shell, POWERSHELL, [*PS_FLAGS, "-ExecutionPolicy", "Bypass", "-File",
                                                    f"{work}\\run.ps1"])
            out, err = bytearray(), bytearray()
            code: int | None = None
            timed_out = False
            while True:
                o, e, c, done = self._receive(p, shell, cmd)
                # Keep one byte past the cap so truncation is detectable, never more in memory.
                out += o[: max(0, output_cap + 1 - len(out))]
                err += e[: max(0, 2 * output_cap + 1 - len(err))]  # CLIXML is wordier than its text
                if done:
                    code = c
                    break
                if time.monotonic() >= deadline:
                    timed_out = True
                    break
            if timed_out:
                # The tree first, while powershell.exe still links its children: the terminate
                # signal below ends powershell.exe only, and would leave what it started running.
                try:
                    self._kill_tree(p, shell, work)
                except Exception:  # best effort: the signal still ends powershell.exe
                    pass
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
        stderr = clixml_to_text(decode_stream(bytes(err)))
        stderr_bytes = stderr.encode("utf-8")
        return ScriptResult(
            exit_code=None if timed_out else code,
            stdout=decode_stream(bytes(out[:output_cap])),
            stderr=stderr_bytes[:output_cap].decode("utf-8", errors="ignore"),
            stdout_truncated=len(out) > output_cap,
            stderr_truncated=len(stderr_bytes) > output_cap or len(err) > 2 * output_cap,
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
        )

    async def run_script(self, script: str, *, env: Mapping[str, str] | None, timeout: float,
                         output_cap: int = DEFAULT_OUTPUT_CAP) -> ScriptResult:
        try:
            # The blocking loop checks the deadline itself; the outer bound covers a hung HTTP call.
            async with asyncio.timeout(timeout + 2 * self.poll_timeout):
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


class WinRMTarget(Protocol):
    """What the WinRM channel needs of a machine (`QemuMachine` has it): no provider behind it."""

    @property
    def image(self) -> Image: ...
    @property
    def images_dir(self) -> Path: ...  # image manifests name their credentials file relative to it
    @property
    def credentials(self) -> Credentials | None: ...  # the machine's own password, set by wait_ready
    @property
    def domain(self) -> Domain: ...


class WinRMChannel(WinRMRunner):
    """A WinRMRunner bound to a machine: finds its address on the isolated network."""

    @classmethod
    def for_machine(cls, machine: WinRMTarget) -> WinRMChannel:
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
                server_cert_validation="ignore", read_timeout_sec=READ_TIMEOUT_S,
                operation_timeout_sec=OPERATION_TIMEOUT_S,
                message_encryption="auto",
            )

        return cls(make)


def credentials_path(machine: WinRMTarget) -> Path:
    m = machine.image.manifest
    if m.winrm is None:
        raise ProviderError(f"image {m.name!r} has no WinRM section")
    return machine.images_dir / m.winrm.credentials


def machine_address(machine: WinRMTarget) -> str:
    import libvirt

    def go(_c: libvirt.virConnect, dom: libvirt.virDomain) -> str:
        ifaces = dom.interfaceAddresses(libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE, 0)
        for iface in ifaces.values():
            for a in iface.get("addrs") or []:
                if a.get("type") == libvirt.VIR_IP_ADDR_TYPE_IPV4:
                    return str(a["addr"])
        raise ProviderError("the machine has no address on the isolated network yet")

    return machine.domain.call_blocking(go)
