"""WinRM at the pywinrm boundary (no Windows guest exists here): a fake Protocol that records the
commands and plays back output, the way pywinrm's Protocol would."""

from __future__ import annotations

import base64
import itertools
from collections.abc import Iterator

import pytest

from providers.base import ProviderError
from providers.qemu.winrm import UPLOAD_CHUNK, WinRMRunner, env_prologue, load_credentials


class FakeProtocol:
    def __init__(self, run_output: list[tuple[bytes, bytes, int, bool]], then_silence: bool = False) -> None:
        self.files: dict[str, bytes] = {}
        self.commands: list[tuple[str, list[str]]] = []
        self.stdin: dict[str, list[str]] = {}
        tail = itertools.repeat((b"", b"", 0, False)) if then_silence else iter(())
        self.run_output: Iterator[tuple[bytes, bytes, int, bool]] = itertools.chain(run_output, tail)
        self.cleaned: list[str] = []
        self.closed = False

    def open_shell(self) -> str:
        return "shell-1"

    def close_shell(self, shell_id: str) -> None:
        self.closed = True

    def run_command(self, shell_id: str, command: str, arguments: list[str] = ()) -> str:  # type: ignore[assignment]
        args = list(arguments)
        self.commands.append((command, args))
        cid = f"cmd-{len(self.commands)}"
        self.stdin[cid] = []
        return cid

    def send_command_input(self, shell_id: str, command_id: str, stdin_input: str | bytes, end: bool = False) -> None:
        self.stdin[command_id].append(stdin_input if isinstance(stdin_input, str) else stdin_input.decode())
        if end:
            path = self.commands[int(command_id.split("-")[1]) - 1][1][-1]
            self.files[path] = base64.b64decode("".join(self.stdin[command_id]))

    def get_command_output_raw(self, shell_id: str, command_id: str) -> tuple[bytes, bytes, int, bool]:
        _, args = self.commands[int(command_id.split("-")[1]) - 1]
        if "-File" in args:
            return next(self.run_output)
        return b"", b"", 0, True

    def cleanup_command(self, shell_id: str, command_id: str) -> None:
        self.cleaned.append(command_id)


def test_script_is_uploaded_in_chunks_and_run_with_bypass_and_env() -> None:
    fake = FakeProtocol([(b"hello ", b"", 0, False), (b"world\n", b"warn\n", 3, True)])
    script = "Write-Output 'x'\n" + "#" * 100_000
    r = WinRMRunner(lambda: fake).run_blocking(script, {"GH_CHECK_PHASE": "after", "Q": "it's"}, 30, 1024)
    assert r.exit_code == 3 and r.stdout == "hello world\n" and r.stderr == "warn\n" and not r.timed_out
    [script_path] = [p for p in fake.files if p.endswith("script.ps1")]
    assert fake.files[script_path] == b"\xef\xbb\xbf" + script.encode()
    # No command line carries the script: every argument stays far below Windows' 8 KB limit.
    assert all(len(" ".join(a)) < 2000 for _, a in fake.commands)
    upload_cid = "cmd-1"
    assert len(fake.stdin[upload_cid]) == -(-len(base64.b64encode(b"\xef\xbb\xbf" + script.encode())) // UPLOAD_CHUNK)
    run_cmd = next(a for c, a in fake.commands if "-File" in a)
    assert run_cmd[run_cmd.index("-ExecutionPolicy") + 1] == "Bypass" and run_cmd[-1].endswith("run.ps1")
    runner = next(v for k, v in fake.files.items() if k.endswith("run.ps1")).decode("utf-8-sig")
    assert "[Environment]::SetEnvironmentVariable('GH_CHECK_PHASE', 'after', 'Process')" in runner
    assert "'it''s'" in runner and "exit $LASTEXITCODE" in runner
    assert fake.closed


def test_output_is_capped_and_flagged_and_undecodable_bytes_survive() -> None:
    fake = FakeProtocol([(b"a" * 700, b"\xff\xfe", 0, False), (b"a" * 700, b"", 0, True)])
    r = WinRMRunner(lambda: fake).run_blocking("x", None, 30, 1000)
    assert r.stdout_truncated and len(r.stdout) == 1000 and r.stderr == "\ufffd\ufffd" and r.exit_code == 0


def test_timeout_stops_the_command_and_reports_no_exit_code() -> None:
    fake = FakeProtocol([(b"partial", b"", 0, False)], then_silence=True)
    r = WinRMRunner(lambda: fake).run_blocking("while ($true) {}", None, 0.2, 1000)
    assert r.timed_out and r.exit_code is None and r.stdout == "partial"
    run_cid = next(f"cmd-{i + 1}" for i, (_, a) in enumerate(fake.commands) if "-File" in a)
    assert run_cid in fake.cleaned


def test_bad_env_and_credentials_are_refused_plainly(tmp_path: pytest.TempPathFactory) -> None:
    with pytest.raises(ProviderError, match="invalid environment"):
        env_prologue({"A=B": "x"})
    p = tmp_path / "creds.yaml"  # type: ignore[operator]
    p.write_text("username: admin\n")
    with pytest.raises(ProviderError, match="needs 'username' and 'password'"):
        load_credentials(p)
    p.write_text("username: admin\npassword: s3cret\n")
    assert load_credentials(p) == ("admin", "s3cret")


async def test_transport_errors_never_leak_credentials() -> None:
    class Boom(Exception):
        pass

    def make() -> FakeProtocol:
        raise Boom("http://admin:s3cret@10.0.0.5/wsman refused")

    with pytest.raises(ProviderError) as ei:
        await WinRMRunner(make).run_script("x", env=None, timeout=5)  # type: ignore[arg-type]
    assert "s3cret" not in str(ei.value) and "Boom" in str(ei.value)
