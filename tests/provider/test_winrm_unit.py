"""The PowerShell channel against the most faithful peer available without a Windows guest:
pywinrm's real `winrm.protocol.Protocol` (it builds every WS-Man request and parses every response),
with its HTTP transport replaced by a stub that answers with real WinRM response bodies.

Where the bodies come from: pywinrm's own test fixtures, shipped in the installed package
(`winrm/tests/conftest.py`: open-shell, command, signal, delete and the Receive of
`Write-Error "Error"` whose stderr is CLIXML in two stream chunks; `winrm/tests/test_session.py`:
the CLIXML of an unknown command with progress records; `winrm/tests/test_exceptions.py`: the
OperationTimeout fault a Windows Server 2022 WinRM service returns for a Receive with no output).
They are read from the installed package at test time, not copied here. Receive responses with our
own output are made from the fixture's Receive body with only the stream text and exit code changed.

The stub plays the guest only in what the peer does with the bytes it is sent: the upload command's
stdin is decoded and kept as the file named in its -EncodedCommand text, so the test can pin the
exact script and wrapper text that reached "Windows".
"""

from __future__ import annotations

import ast
import base64
import re
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import winrm
from winrm.exceptions import WinRMTransportError
from winrm.protocol import Protocol

from providers.errors import ProviderError
from providers.qemu.winrm import (
    OPERATION_TIMEOUT_S,
    PS_FLAGS,
    UPLOAD_CHUNK,
    WinRMRunner,
    clixml_to_text,
    decode_stream,
    encoded_command,
    env_prologue,
    load_credentials,
    ps_quote,
    wrapper_script,
)

NS = {"a": "http://schemas.xmlsoap.org/ws/2004/08/addressing",
      "rsp": "http://schemas.microsoft.com/wbem/wsman/1/windows/shell",
      "w": "http://schemas.dmtf.org/wbem/wsman/1/wsman.xsd",
      "env": "http://www.w3.org/2003/05/soap-envelope"}
SHELL_URI = "http://schemas.microsoft.com/wbem/wsman/1/windows/shell"
FIXTURE_DIR = Path(winrm.__file__).parent / "tests"  # pywinrm's tests, shipped in its wheel


def _literals(file: str, name: str) -> list[Any]:
    """Every `name = <literal>` in one of pywinrm's test files (read, not imported: its conftest
    imports `mock`, which is not installed here)."""
    tree = ast.parse((FIXTURE_DIR / file).read_text())
    return [node.value.value for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)]


class _Fixtures:
    def __getattr__(self, name: str) -> str:
        [value] = _literals("conftest.py", name)
        return str(value)


fixtures = _Fixtures()


def _operation_timeout_fault() -> str:
    """The OperationTimeout fault body from pywinrm's test_exceptions.py (a Server 2022 reply)."""
    [body] = [b for b in _literals("test_exceptions.py", "xml_text") if 'Code="2150858793"' in b]
    return str(body)


def _clixml_samples() -> list[bytes]:
    """The CLIXML stderr samples of pywinrm's test_session.py: unknown command, progress only, broken."""
    return [m for m in _literals("test_session.py", "msg") if isinstance(m, bytes) and m.startswith(b"#< CLIXML")]


def _receive_body(stdout: bytes = b"", stderr: bytes = b"", exit_code: int | None = 0) -> str:
    """pywinrm's fixture Receive response with our streams (None: still running)."""
    body = fixtures.get_ps_output_response
    streams = re.compile(r"(\s*<rsp:Stream [^>]*?Name=\"(?:stdout|stderr)\"[^/]*?>[^<]*</rsp:Stream>)+")
    mine = "".join(
        f'\n            <rsp:Stream CommandId="C" Name="{name}">{base64.b64encode(data).decode()}</rsp:Stream>'
        for name, data in (("stdout", stdout), ("stderr", stderr)) if data)
    body = streams.sub(mine, body, count=1)
    if exit_code is None:
        body = body.replace("CommandState/Done", "CommandState/Running")
        body = re.sub(r"\s*<rsp:ExitCode>\d+</rsp:ExitCode>", "", body)
    else:
        body = re.sub(r"<rsp:ExitCode>\d+</rsp:ExitCode>", f"<rsp:ExitCode>{exit_code}</rsp:ExitCode>", body)
    return body


def _relating(body: str, message_id: str) -> str:
    return re.sub(r"<a:RelatesTo>[^<]*</a:RelatesTo>", f"<a:RelatesTo>{message_id}</a:RelatesTo>", body)


class WSManStub:
    """pywinrm's transport: answers each WS-Man action with a real response body."""

    def __init__(self, run_output: list[str | Exception], silence: bool = False) -> None:
        self.commands: list[dict[str, Any]] = []  # {"id", "command", "arguments", "console_mode_stdin"}
        self.stdin: dict[str, list[bytes]] = {}
        self.files: dict[str, bytes] = {}
        self.run_output = iter(run_output)
        self.silence = silence
        self.signalled: list[str] = []
        self.shell_closed = False

    def close_session(self) -> None:
        pass

    def _command(self, cid: str) -> dict[str, Any]:
        return next(c for c in self.commands if c["id"] == cid)

    def send_message(self, message: str) -> str:
        root = ET.fromstring(message)
        action = root.findtext("env:Header/a:Action", namespaces=NS) or ""
        message_id = root.findtext("env:Header/a:MessageID", namespaces=NS) or ""
        body = root.find("env:Body", NS)
        assert body is not None
        if action.endswith("/transfer/Create"):
            return fixtures.open_shell_response
        if action.endswith("/transfer/Delete"):
            self.shell_closed = True
            return _relating(fixtures.close_shell_response, message_id)
        if action == f"{SHELL_URI}/Command":
            options = {o.get("Name"): o.text for o in root.iterfind("env:Header/w:OptionSet/w:Option", NS)}
            cid = str(uuid.uuid4())
            self.commands.append({"id": cid, "command": body.findtext("rsp:CommandLine/rsp:Command", namespaces=NS),
                                  "arguments": body.findtext("rsp:CommandLine/rsp:Arguments", namespaces=NS) or "",
                                  "console_mode_stdin": options.get("WINRS_CONSOLEMODE_STDIN")})
            self.stdin[cid] = []
            return re.sub(r"<rsp:CommandId>[^<]*</rsp:CommandId>", f"<rsp:CommandId>{cid}</rsp:CommandId>",
                          fixtures.run_cmd_ps_response)
        if action == f"{SHELL_URI}/Send":
            stream = body.find("rsp:Send/rsp:Stream", NS)
            assert stream is not None
            cid = stream.get("CommandId", "")
            self.stdin[cid].append(base64.b64decode(stream.text or ""))
            if stream.get("End") == "true":
                # What the upload command does with its stdin: base64 in, the file named in its text out.
                text = base64.b64decode(self._command(cid)["arguments"].split()[-1]).decode("utf-16-le")
                path = re.search(r"\$p = '([^']*)'", text)
                assert path is not None, text
                self.files[path.group(1)] = base64.b64decode(b"".join(self.stdin[cid]))
            return fixtures.run_cmd_send_input_response
        if action == f"{SHELL_URI}/Receive":
            cid = body.find("rsp:Receive/rsp:DesiredStream", NS).get("CommandId", "")  # type: ignore[union-attr]
            if "-File" not in self._command(cid)["arguments"]:
                return _receive_body()
            nxt = next(self.run_output, None)
            if nxt is None and self.silence:
                raise WinRMTransportError("http", 500, _operation_timeout_fault())
            if isinstance(nxt, Exception):
                raise nxt
            assert nxt is not None, "the channel asked for output after the command was done"
            return nxt
        if action == f"{SHELL_URI}/Signal":
            self.signalled.append(body.find("rsp:Signal", NS).get("CommandId", ""))  # type: ignore[union-attr]
            return _relating(fixtures.cleanup_cmd_response, message_id)
        raise AssertionError(f"unexpected WS-Man action {action}")


def runner_over(stub: WSManStub) -> WinRMRunner:
    def make() -> Protocol:
        p = Protocol(endpoint="http://192.168.122.50:5985/wsman", transport="ntlm", username="gh",
                     password="machine-own-pw", read_timeout_sec=15, operation_timeout_sec=OPERATION_TIMEOUT_S)
        p.transport = stub  # type: ignore[assignment]
        return p

    return WinRMRunner(make, poll_timeout=5)  # type: ignore[arg-type]


def _uploaded(stub: WSManStub, name: str) -> bytes:
    [(_path, data)] = [(p, d) for p, d in stub.files.items() if p.endswith("\\" + name)]
    return data


def test_the_exact_command_lines_and_script_text_sent_to_windows() -> None:
    stub = WSManStub([_receive_body(b"hello ", exit_code=None), _receive_body(b"True\r\n", b"", 3)])
    script = "Write-Output 'x'\n" + "#" * 100_000
    env = {"GH_CHECK_PHASE": "after", "GH_AGENT_ANSWER": "it's \u2018$HOME\u2019 `x`"}
    r = runner_over(stub).run_blocking(script, env, 30, 1024)
    assert r.exit_code == 3 and r.stdout == "hello True\r\n" and r.stderr == "" and not r.timed_out
    upload1, upload2, run, rm = stub.commands
    work = re.search(r"-File (C:\\Windows\\Temp\\gh-[0-9a-f]{12})\\run\.ps1$", run["arguments"])
    assert work is not None, run
    wdir = work.group(1)
    # The run: exactly the documented powershell.exe line, the wrapper as a file.
    assert (run["command"], run["arguments"]) == (
        "powershell.exe", f"-NoProfile -NonInteractive -ExecutionPolicy Bypass -File {wdir}\\run.ps1")
    # Uploads: the path is inside the encoded text, never a trailing argument powershell.exe would
    # join into the command; stdin is read as a stream (console mode off), in chunks.
    for cmd, name in ((upload1, "script.ps1"), (upload2, "run.ps1")):
        assert cmd["command"] == "powershell.exe" and cmd["console_mode_stdin"] == "FALSE"
        flags, encoded = cmd["arguments"].rsplit(" ", 1)
        assert flags == " ".join([*PS_FLAGS, "-EncodedCommand"])
        text = base64.b64decode(encoded).decode("utf-16-le")
        assert f"$p = '{wdir}\\{name}'" in text and "$input" in text
        assert len(run["command"]) + len(cmd["arguments"]) < 8191 - 100
    b64_len = len(base64.b64encode(b"\xef\xbb\xbf" + script.encode()))
    assert len(stub.stdin[upload1["id"]]) == -(-b64_len // UPLOAD_CHUNK)
    assert _uploaded(stub, "script.ps1") == b"\xef\xbb\xbf" + script.encode()
    wrapper = _uploaded(stub, "run.ps1")
    assert wrapper == b"\xef\xbb\xbf" + wrapper_script(wdir, env).encode()
    text = wrapper.decode("utf-8-sig")
    quoted = "'it''s \u2018\u2018$HOME\u2019\u2019 `x`'"
    assert f"[Environment]::SetEnvironmentVariable('GH_AGENT_ANSWER', {quoted}, 'Process')" in text
    assert f"try {{ & '{wdir}\\script.ps1' }}" in text and text.endswith("exit $LASTEXITCODE\r\n")
    assert "catch { [Console]::Error.WriteLine(($_ | Out-String).TrimEnd()); exit 1 }" in text
    assert "UTF8Encoding" in text and "function Start-GhInteractive" in text
    assert rm["command"] == "cmd" and rm["arguments"] == f"/c rmdir /s /q {wdir}"
    assert stub.shell_closed


def test_the_encoding_of_encoded_command_is_pywinrms_own() -> None:
    # pywinrm's run_ps fixture: the request it sends for `Write-Error "Error"`.
    sent = re.search(r"powershell -encodedcommand (\S+)</rsp:Command>", fixtures.run_ps_request)
    assert sent is not None and encoded_command('Write-Error "Error"') == sent.group(1)


def test_clixml_stderr_of_a_real_receive_response_becomes_plain_text() -> None:
    # The fixture's Receive of `Write-Error "Error"`: "#< CLIXML\r\n" and the XML arrive as two chunks.
    body = fixtures.get_ps_output_response.replace("11111111-1111-1111-1111-111111111124", "C")
    stub = WSManStub([body])
    r = runner_over(stub).run_blocking("Write-Error 'Error'", None, 30, 4096)
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr == (
        'Write-Error "Error" : Error\n'
        "    + CategoryInfo          : NotSpecified: (:) [Write-Error], WriteErrorExcep \n"
        "   tion\n"
        "    + FullyQualifiedErrorId : Microsoft.PowerShell.Commands.WriteErrorExceptio \n"
        "   n\n"
        " \n")


def test_clixml_samples_with_progress_records_keep_only_the_messages() -> None:
    unknown, progress_only, invalid = _clixml_samples()
    text = clixml_to_text(decode_stream(unknown))
    assert text.startswith("fake : The term 'fake' is not recognized as the name of a cmdlet")
    assert "+ FullyQualifiedErrorId : CommandNotFoundException\n" in text and "Preparing modules" not in text
    assert "_x000D_" not in text and "\r" not in text
    assert clixml_to_text(decode_stream(progress_only)) == ""
    # Not CLIXML, or broken CLIXML: left as it is.
    assert clixml_to_text("plain error\r\n") == "plain error\r\n"
    assert clixml_to_text(decode_stream(invalid)) == invalid.decode()


def test_stdout_is_utf8_or_utf16_by_its_byte_order_mark() -> None:
    stub = WSManStub([_receive_body("Grüße ✓\r\nTrue\r\n".encode(), exit_code=0)])
    r = runner_over(stub).run_blocking("x", None, 30, 4096)
    assert r.stdout == "Grüße ✓\r\nTrue\r\n"
    assert decode_stream(b"\xff\xfe" + "Grüße\r\n".encode("utf-16-le")) == "Grüße\r\n"
    assert decode_stream(b"\xef\xbb\xbfTrue\r\n") == "True\r\n"
    assert decode_stream(b"\xff\xfe\x00") == "\ufffd"  # odd byte: replaced, never raises


def test_output_is_capped_and_flagged() -> None:
    stub = WSManStub([_receive_body(b"a" * 700, exit_code=None), _receive_body(b"a" * 700, exit_code=0)])
    r = runner_over(stub).run_blocking("x", None, 30, 1000)
    assert r.stdout_truncated and len(r.stdout) == 1000 and r.exit_code == 0


def test_a_silent_command_is_polled_through_operation_timeouts_then_stopped_at_the_deadline() -> None:
    # pywinrm raises WinRMOperationTimeoutError for each Receive that saw no output: not a failure.
    stub = WSManStub([_receive_body(b"partial", exit_code=None)], silence=True)
    r = runner_over(stub).run_blocking("while ($true) {}", None, 0.5, 1000)
    assert r.timed_out and r.exit_code is None and r.stdout == "partial"
    run = next(c for c in stub.commands if "-File" in c["arguments"])
    # The process tree is killed by the pid the wrapper wrote, then the command is signalled.
    kill = stub.commands[stub.commands.index(run) + 1]
    assert stub.signalled.index(kill["id"]) < stub.signalled.index(run["id"])
    text = base64.b64decode(kill["arguments"].split()[-1]).decode("utf-16-le")
    wdir = run["arguments"].rsplit(" ", 1)[1].removesuffix("\\run.ps1")
    assert f"$f = '{wdir}\\pid'" in text and "taskkill.exe /F /T /PID $p" in text
    assert f"Set-Content -Path '{wdir}\\pid' -Value $PID" in _uploaded(stub, "run.ps1").decode("utf-8-sig")
    assert stub.commands[-1]["command"] == "cmd" and stub.shell_closed


def test_crlf_verdicts_from_windows_are_read_as_verdicts() -> None:
    from gh_runner.outcome import parse_verdict

    stub = WSManStub([_receive_body(b"True\r\n", exit_code=0)])
    assert parse_verdict(runner_over(stub).run_blocking("$true", None, 30, 1000).stdout) == "True"
    assert parse_verdict("noise\r\nFalse\r\n\r\n") == "False"


def test_bad_env_and_credentials_are_refused_plainly(tmp_path: Path) -> None:
    with pytest.raises(ProviderError, match="invalid environment"):
        env_prologue({"A=B": "x"})
    stub = WSManStub([])
    with pytest.raises(ProviderError, match="invalid environment"):
        runner_over(stub).run_blocking("x", {"A'": "x"}, 30, 100)
    assert stub.commands == []  # refused before anything was sent
    assert ps_quote("a'b\u2019c") == "'a''b\u2019\u2019c'"
    p = tmp_path / "creds.yaml"
    p.write_text("username: admin\n")
    with pytest.raises(ProviderError, match="needs 'username' and 'password'"):
        load_credentials(p)
    p.write_text("username: admin\npassword: s3cret\n")
    assert load_credentials(p) == ("admin", "s3cret")


async def test_transport_errors_never_leak_credentials() -> None:
    class Boom(Exception):
        pass

    def make() -> Protocol:
        raise Boom("http://admin:s3cret@10.0.0.5/wsman refused")

    with pytest.raises(ProviderError) as ei:
        await WinRMRunner(make).run_script("x", env=None, timeout=5)  # type: ignore[arg-type]
    assert "s3cret" not in str(ei.value) and "Boom" in str(ei.value)
