"""WinRM as the build's guest channel for Windows (HTTP, NTLM with message encryption), through
QEMU's forwarded port on 127.0.0.1. Scripts are uploaded in chunks to a file and run from it, so
their size is not bound by the 8 KB command line."""

from __future__ import annotations

import base64
import time
from typing import Any

from providers.qemu.winrm import clixml_to_text, decode_stream

from .errors import BuildError
from .qga import ExecResult

OPERATION_TIMEOUT_S = 20  # how long one Receive waits for output: the granularity of every deadline
_CHUNK = 2000  # base64 characters per `echo`, well under cmd.exe's 8191-character line


class WinRMBuildChannel:
    def __init__(self, host: str, port: int, username: str, password: str) -> None:
        self.endpoint = f"http://{host}:{port}/wsman"
        self.username = username
        self._password = password
        self._protocol: Any = None

    def _connect(self) -> Any:
        from winrm.protocol import Protocol

        return Protocol(
            endpoint=self.endpoint, transport="ntlm", username=self.username, password=self._password,
            server_cert_validation="ignore", read_timeout_sec=30, operation_timeout_sec=OPERATION_TIMEOUT_S,
            message_encryption="auto",
        )

    def _run(self, command: str, args: list[str], timeout: float) -> ExecResult:
        """Run one command; the deadline is checked between Receives (each returns within the
        operation timeout when the command prints nothing), so a hung command cannot hang the build."""
        from winrm.exceptions import WinRMOperationTimeoutError

        p = self._protocol
        shell = p.open_shell()
        try:
            cid = p.run_command(shell, command, args)
            deadline = time.monotonic() + timeout
            out, err = bytearray(), bytearray()
            while True:
                try:
                    o, e, code, done = p.get_command_output_raw(shell, cid)
                except WinRMOperationTimeoutError:
                    o, e, code, done = b"", b"", -1, False
                out += o
                err += e
                if done:
                    break
                if time.monotonic() > deadline:
                    p.cleanup_command(shell, cid)  # the terminate signal ends the command
                    raise BuildError(f"WinRM command did not finish within {timeout:.0f} s")
            p.cleanup_command(shell, cid)
            return ExecResult(int(code), decode_stream(bytes(out)), clixml_to_text(decode_stream(bytes(err))))
        finally:
            p.close_shell(shell)

    def wait_ready(self, timeout: float) -> float:
        start = time.monotonic()
        last = ""
        while time.monotonic() - start < timeout:
            try:
                self._protocol = self._connect()
                if self._run("cmd.exe", ["/c", "echo", "ready"], 60).stdout.strip() == "ready":
                    return time.monotonic() - start
            except Exception as e:  # the installer reboots several times: any failure means "not yet"
                last = type(e).__name__  # never the message: it may echo the credentials
            time.sleep(10)
        raise BuildError(f"WinRM did not answer within {timeout:.0f} s (last error: {last or 'none'})")

    def run_script(self, shell: str, script: str, timeout: float = 300.0) -> ExecResult:
        encoded = base64.b64encode(script.encode("utf-8")).decode()
        path = r"C:\Windows\Temp\gh-build-step"
        self._run("cmd.exe", ["/c", f"del /q {path}.b64 {path}.ps1 2>nul"], 60)
        for i in range(0, len(encoded), _CHUNK):
            r = self._run("cmd.exe", ["/c", f"echo {encoded[i:i + _CHUNK]}>>{path}.b64"], 60)
            if r.exit_code != 0:
                raise BuildError(f"uploading a script over WinRM failed: {r.stderr.strip()[-400:]}")
        decode = (
            f"[IO.File]::WriteAllBytes('{path}.ps1', [Convert]::FromBase64String("
            f"([IO.File]::ReadAllText('{path}.b64') -replace '\\s', '')))"
        )
        r = self._run("powershell.exe", ["-NoProfile", "-NonInteractive", "-Command", decode], 120)
        if r.exit_code != 0:
            raise BuildError(f"decoding a script in the guest failed: {r.stderr.strip()[-400:]}")
        return self._run(
            "powershell.exe", ["-NoProfile", "-NonInteractive", "-ExecutionPolicy", "Bypass", "-File", f"{path}.ps1"],
            timeout,
        )

    def shutdown(self) -> None:
        try:
            self._run("shutdown.exe", ["/s", "/t", "0", "/f"], 60)
        except Exception:  # the connection may drop as the machine goes down
            pass
