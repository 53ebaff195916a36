"""External agents: a command (JSON on stdin, final answer on stdout) or an HTTP endpoint.

Both get the same request document (docs/agents.md): the attempt's prompt, its limits, and the
machine API (URL and a per-attempt token) through which they see the screen, send input and run
scripts. Neither gets the case's expected fix, check or the customer's facts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Sequence
from typing import Any

import httpx

from gh_common.timeouts import within
from gh_server.agents.base import AgentContext, AgentError, AgentFailed, AgentOutcome
from gh_server.agents.sandbox import Sandbox
from gh_wire import answer as answer_contract
from gh_wire.protocol import TaskEndReason
from gh_wire.vocab import AgentFault

MAX_STDERR_IN_ERROR = 500
# What an agent may print: its answer is at most ANSWER_MAX_CHARS characters (4 bytes each at most), stripped
# of surrounding whitespace; past this no answer can fit, and reading on would only hold memory.
STDOUT_CAP = 1024 * 1024
STDERR_KEPT = 64 * 1024
MAX_REPLY = 1024 * 1024  # an HTTP agent's reply body, for the same reason


def request_document(ctx: AgentContext) -> dict[str, Any]:
    return {
        "attempt_id": ctx.attempt_id,
        "test_run_id": ctx.test_run_id,
        "agent_id": ctx.agent_id,
        "prompt": ctx.prompt,
        "limits": {"minutes": ctx.minutes, "steps": ctx.max_steps},
        "case": ctx.public_case(),
        "machine": {"url": ctx.machine_api_url, "token": ctx.machine_api_token},
    }


def _outcome_from(answer: Any, extra: Any = None) -> AgentOutcome:
    """The answer as the agent gave it (never cut: one over its limit is the agent's failure, decided
    by the supervisor with every other answer's contract)."""
    meta = extra if isinstance(extra, dict) else {}
    out = AgentOutcome(answer=str(answer if answer is not None else ""))
    for k in ("steps", "questions", "approvals"):
        v = meta.get(k)
        if isinstance(v, int) and v >= 0:
            setattr(out, k, v)
    return out


class CommandAgent:
    """Runs `command` once per attempt, in `sandbox` (gh_server.agents.sandbox: its own uid, an explicit
    environment). Exit 0: stdout (stripped) is the final answer."""

    def __init__(self, agent_id: str, command: Sequence[str], timeout: float, sandbox: Sandbox,
                 env: dict[str, str] | None = None, pass_env: Sequence[str] = ()) -> None:
        if not command:
            raise ValueError(f"agent {agent_id}: command is empty")
        self.agent_id = agent_id
        self.command = list(command)
        self.timeout = timeout
        self.sandbox = sandbox
        self.env = dict(env or {})
        self.pass_env = list(pass_env)

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        doc = json.dumps(request_document(ctx)).encode()
        machine = {"GH_MACHINE_API_URL": ctx.machine_api_url, "GH_MACHINE_API_TOKEN": ctx.machine_api_token,
                   "GH_ATTEMPT_ID": ctx.attempt_id}
        async with contextlib.AsyncExitStack() as stack:
            try:
                launch = await stack.enter_async_context(
                    self.sandbox.launch(ctx.attempt_id, self.command, machine, self.env, self.pass_env))
            except (OSError, RuntimeError) as e:
                raise AgentError(f"agent {self.agent_id}: could not prepare its sandbox: {e}") from None
            return await self._run(ctx, doc, launch.argv, launch.env, launch.popen)
        raise AssertionError("unreachable")  # mypy: an exit stack may swallow exceptions

    async def _run(self, ctx: AgentContext, doc: bytes, argv: list[str], env: dict[str, str],
                   popen: dict[str, Any]) -> AgentOutcome:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True, close_fds=True, **popen,
            )
        except OSError as e:
            raise AgentError(f"agent {self.agent_id}: could not start {self.command[0]!r}: {e.strerror or e}") from None
        try:
            out, err = await within(min(self.timeout, ctx.minutes * 60.0 + 60.0), _talk(proc, doc))
        except TimeoutError:
            _kill(proc)
            await proc.wait()
            # Out of time is the agent's failure, not ours: the check after still decides.
            return AgentOutcome(answer="", reason=TaskEndReason.TIME_LIMIT)
        except asyncio.CancelledError:
            _kill(proc)
            with contextlib.suppress(Exception):
                await within(5.0, proc.wait())
            raise
        finally:
            _kill(proc)  # also after a clean exit: what the agent started must not outlive its attempt
        if out is None:  # it printed past STDOUT_CAP: no answer can be that long (gh_wire.answer)
            raise AgentFailed(f"agent {self.agent_id} printed over {STDOUT_CAP:,} bytes on stdout; "
                              f"{answer_contract.describe(AgentFault.ANSWER_TOO_LONG, STDOUT_CAP)}",
                              AgentFault.ANSWER_TOO_LONG)
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip()[-MAX_STDERR_IN_ERROR:]
            why = f"agent {self.agent_id} exited with code {proc.returncode}"
            raise AgentFailed(why + (f": {tail}" if tail else ""))
        return _outcome_from(_decoded(out).strip())


async def _talk(proc: asyncio.subprocess.Process, doc: bytes) -> tuple[bytes | None, bytes]:
    """`communicate`, bounded: the document on stdin; stdout up to STDOUT_CAP (None past it, and the
    process group killed: what it prints cannot be an answer), the last STDERR_KEPT bytes of stderr. An
    agent that prints without end must not hold gh-server's memory."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    async def feed(stdin: asyncio.StreamWriter) -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            stdin.write(doc)
            await stdin.drain()
        stdin.close()

    async def tail(stream: asyncio.StreamReader) -> bytes:
        kept = bytearray()
        while chunk := await stream.read(65536):
            kept += chunk
            del kept[:-STDERR_KEPT]
        return bytes(kept)

    async def head(stream: asyncio.StreamReader) -> bytes | None:
        got = bytearray()
        while chunk := await stream.read(65536):
            got += chunk
            if len(got) > STDOUT_CAP:
                _kill(proc)
                return None
        return bytes(got)

    fed = asyncio.ensure_future(feed(proc.stdin))
    err = asyncio.ensure_future(tail(proc.stderr))
    try:
        out = await head(proc.stdout)
        await proc.wait()
        if out is None:
            # Its process group is killed; a sandboxed agent (a systemd unit) may still hold stderr open
            # until the sandbox stops it, so stderr is not waited for.
            return None, b""
        return out, await err
    finally:
        for t in (fed, err):
            t.cancel()


def _decoded(raw: bytes) -> str:
    """An agent's bytes as its answer: not UTF-8 is its failure (never replaced characters)."""
    text = answer_contract.decode_answer(raw)
    if isinstance(text, AgentFault):
        raise AgentFailed(answer_contract.describe(text), text)
    return text


def _kill(proc: asyncio.subprocess.Process) -> None:
    # The whole process group: an agent script's children must not outlive the attempt.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


class HttpAgent:
    """POSTs the request document to `url`; the reply is `{"answer": ..., "steps"?: n}` (or plain text).

    It sends the request document and the configured `headers`, nothing of gh-server's own: no API key,
    no cookie, and redirects are not followed (a redirect must not carry the document elsewhere)."""

    def __init__(self, agent_id: str, url: str, timeout: float, headers: dict[str, str] | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.agent_id = agent_id
        self.url = url
        self.timeout = timeout
        self.headers = dict(headers or {})
        self._transport = transport

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        timeout = min(self.timeout, ctx.minutes * 60.0 + 60.0)
        try:
            async with (httpx.AsyncClient(timeout=timeout, transport=self._transport, follow_redirects=False) as client,
                        client.stream("POST", self.url, json=request_document(ctx), headers=self.headers) as resp):
                body = bytearray()
                async for chunk in resp.aiter_bytes():  # bounded: a reply past MAX_REPLY cannot be an answer
                    body += chunk
                    if len(body) > MAX_REPLY:
                        raise AgentFailed(f"agent {self.agent_id}: {self.url} sent over {MAX_REPLY:,} bytes; "
                                          f"{answer_contract.describe(AgentFault.ANSWER_TOO_LONG, MAX_REPLY)}",
                                          AgentFault.ANSWER_TOO_LONG)
        except httpx.TimeoutException:
            return AgentOutcome(answer="", reason=TaskEndReason.TIME_LIMIT)
        except (httpx.ConnectError, httpx.UnsupportedProtocol) as e:
            # Never reached: nothing of the agent ran, so there is nothing to score (ours to retry).
            raise AgentError(f"agent {self.agent_id}: {self.url} could not be reached: {type(e).__name__}") from None
        except httpx.HTTPError as e:
            raise AgentFailed(f"agent {self.agent_id}: {self.url} broke off its answer: {type(e).__name__}") from None
        if resp.status_code >= 400:
            shown = bytes(body[:300]).decode(errors="replace")
            raise AgentFailed(f"agent {self.agent_id}: {self.url} answered HTTP {resp.status_code}: {shown}")
        text = _decoded(bytes(body))  # UTF-8 whatever the charset says: other bytes are the agent's error
        if resp.headers.get("content-type", "").startswith("application/json"):
            try:
                body = json.loads(text)
            except ValueError:
                raise AgentFailed(f"agent {self.agent_id}: {self.url} sent invalid JSON") from None
            if isinstance(body, dict):
                return _outcome_from(body.get("answer"), body)
            return _outcome_from(body)
        return _outcome_from(text.strip())
