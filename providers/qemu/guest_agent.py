"""Scripts through the QEMU guest agent: guest-exec with the script on stdin, polled with a deadline.

Why a wrapper: guest-exec's own output capture has no cap below 16 MiB per stream and libvirt's RPC
refuses replies over 4 MiB, and killing guest-exec's pid alone leaves the script's children running.
So the agent starts a tiny POSIX-sh wrapper that stores the script (from stdin) in a private temp
dir, runs it in its own session with output redirected to files, and prints back at most the first
`cap + 1` bytes of each stream. On timeout we kill the script's whole session, and the wrapper
still reports the partial output.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import libvirt
import libvirt_qemu

from providers.base import DEFAULT_OUTPUT_CAP, ScriptResult
from providers.errors import MachineNotReady, ProviderError
from providers.qemu.errors import in_thread, plain_reason
from providers.qemu.handle import Domain

# Bytes per stream that come back inline with the exit status; two base64 streams of this size
# stay well under libvirt's 4 MiB reply limit. Larger caps are fetched in further pieces.
INLINE_CHUNK = 1024 * 1024
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
KILL_GRACE_S = 5.0

WRAPPER = r"""
d=/tmp/gh-exec-$1; lim=$2; keep=$3
umask 077
mkdir "$d" || exit 125
cat > "$d/script" || exit 125
if command -v setsid >/dev/null 2>&1; then s=setsid; else s=; fi
$s /bin/sh "$d/script" > "$d/out" 2> "$d/err" < /dev/null &
echo $! > "$d/pid"
wait $!
rc=$?
head -c "$lim" "$d/out"
head -c "$lim" "$d/err" >&2
[ -n "$keep" ] || rm -rf "$d"
exit $rc
"""

KILL = r"""
d=/tmp/gh-exec-$1
p=$(cat "$d/pid" 2>/dev/null) || exit 0
kill -KILL -"$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null
exit 0
"""

FETCH = r"""tail -c +"$2" "/tmp/gh-exec-$1/$3" | head -c "$4" """


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


@dataclass
class ExecStatus:
    exited: bool
    exit_code: int | None
    signal: int | None
    stdout: bytes
    stderr: bytes


def _check_env(env: Mapping[str, str]) -> list[str]:
    out = []
    for k, v in env.items():
        if not k or "=" in k or "\0" in k or "\0" in v:
            raise ProviderError(f"invalid environment variable name or value for {k!r}")
        out.append(f"{k}={v}")
    return out


class GuestAgent:
    """The qemu-ga channel of one domain, looked up by name on every call (survives reconnects)."""

    def __init__(self, domain: Domain, *, call_timeout: float = 20.0) -> None:
        self.domain = domain
        self.call_timeout = call_timeout

    @property
    def domain_name(self) -> str:
        return self.domain.name

    def _command_blocking(self, payload: str, agent_timeout: int, retry: bool) -> str:
        def go(_c: libvirt.virConnect, dom: libvirt.virDomain) -> str:
            out = libvirt_qemu.qemuAgentCommand(dom, payload, agent_timeout, 0)
            if out is None:
                raise ProviderError("the guest agent returned nothing")
            return str(out)

        return self.domain.call_blocking(go, retry=retry)

    async def command(self, execute: str, arguments: dict[str, Any] | None = None, *,
                      timeout: float | None = None) -> Any:
        t = self.call_timeout if timeout is None else timeout
        msg: dict[str, Any] = {"execute": execute}
        if arguments is not None:
            msg["arguments"] = arguments
        agent_timeout = max(1, int(t))
        # guest-exec starts a process: after a lost connection it may have run, so it is not sent again.
        raw = await in_thread(f"guest agent {execute}", self._command_blocking, json.dumps(msg), agent_timeout,
                              execute != "guest-exec", timeout=t + 5)
        try:
            reply = json.loads(raw)
        except json.JSONDecodeError:
            raise ProviderError(f"guest agent {execute}: unreadable reply") from None
        if "error" in reply:
            raise ProviderError(f"guest agent {execute}: {reply['error'].get('desc', 'error')}")
        return reply.get("return")

    async def ping(self, timeout: float = 5.0) -> None:
        await self.command("guest-ping", timeout=timeout)

    async def wait_ready(self, timeout: float, *, alive: Callable[[], Any] | None = None) -> None:
        """Poll guest-ping until it answers, with a deadline (the guest may still be booting)."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        delay = 0.1
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise MachineNotReady(f"the guest agent did not answer within {timeout:g}s ({last})")
            try:
                await self.ping(timeout=min(3.0, max(1.0, left)))
                return
            except ProviderError as e:
                last = str(e)
                if alive is not None:
                    await alive()
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 1.5, 0.5)

    async def exec_start(self, path: str, args: list[str], *, env: list[str] | None = None,
                         stdin: bytes | None = None, capture: bool = True) -> int:
        a: dict[str, Any] = {"path": path, "arg": args, "capture-output": capture}
        if env is not None:
            a["env"] = env
        if stdin is not None:
            a["input-data"] = base64.b64encode(stdin).decode()
        ret = await self.command("guest-exec", a)
        return int(ret["pid"])

    async def exec_status(self, pid: int) -> ExecStatus:
        r = await self.command("guest-exec-status", {"pid": pid})
        return ExecStatus(
            exited=bool(r.get("exited")),
            exit_code=r.get("exitcode"),
            signal=r.get("signal"),
            stdout=base64.b64decode(r.get("out-data", "")),
            stderr=base64.b64decode(r.get("err-data", "")),
        )

    async def wait_exec(self, pid: int, deadline: float) -> ExecStatus | None:
        """Poll guest-exec-status until the process exits or `deadline` (monotonic) passes."""
        delay = 0.02
        while True:
            st = await self.exec_status(pid)
            if st.exited:
                return st
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 1.5, 0.25)

    async def run_sh(self, script: str, *, env: Mapping[str, str] | None, timeout: float,
                     output_cap: int = DEFAULT_OUTPUT_CAP) -> ScriptResult:
        """Run `script` with /bin/sh as root in the guest; see the module docstring for the shape."""
        if output_cap < 0:
            raise ProviderError("output_cap must be >= 0")
        full_env = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
        full_env.update(env or {})
        env_list = _check_env(full_env)
        token = secrets.token_hex(8)
        inline = min(output_cap, INLINE_CHUNK) + 1
        keep = output_cap > INLINE_CHUNK
        started = time.monotonic()
        pid = await self.exec_start(
            "/bin/sh", ["-c", WRAPPER, "gh-exec", token, str(inline), "keep" if keep else ""],
            env=env_list, stdin=script.encode("utf-8"),
        )
        st = await self.wait_exec(pid, started + timeout)
        timed_out = st is None
        if st is None:
            await self._kill(token)
            st = await self.wait_exec(pid, time.monotonic() + KILL_GRACE_S)
            if st is None:  # the wrapper itself is stuck: give up on its output
                await self._exec_quiet(["-c", f"kill -KILL {pid}; rm -rf /tmp/gh-exec-{token}"])
                st = ExecStatus(True, None, 9, b"", b"")
        out, err = st.stdout, st.stderr
        try:
            if keep:
                out = await self._fetch_rest(token, "out", out, output_cap)
                err = await self._fetch_rest(token, "err", err, output_cap)
        finally:
            if keep:
                await self._exec_quiet(["-c", f"rm -rf /tmp/gh-exec-{token}"])
        duration = time.monotonic() - started
        exit_code: int | None
        if timed_out:
            exit_code = None
        elif st.exit_code is not None:
            exit_code = st.exit_code
        else:
            exit_code = 128 + (st.signal or 0)
        return ScriptResult(
            exit_code=exit_code,
            stdout=decode(out[:output_cap]),
            stderr=decode(err[:output_cap]),
            stdout_truncated=len(out) > output_cap,
            stderr_truncated=len(err) > output_cap,
            timed_out=timed_out,
            duration_s=duration,
        )

    async def _fetch_rest(self, token: str, stream: str, have: bytes, cap: int) -> bytes:
        buf = bytearray(have[:INLINE_CHUNK])
        if len(have) <= INLINE_CHUNK:
            return bytes(have)
        while len(buf) <= cap:
            want = min(INLINE_CHUNK, cap + 1 - len(buf))
            pid = await self.exec_start("/bin/sh", ["-c", FETCH, "gh-fetch", token, str(len(buf) + 1), stream,
                                                    str(want)])
            st = await self.wait_exec(pid, time.monotonic() + self.call_timeout)
            if st is None:
                raise ProviderError("reading script output from the guest timed out")
            if not st.stdout:
                break
            buf += st.stdout
        return bytes(buf)

    async def _kill(self, token: str) -> None:
        await self._exec_quiet(["-c", KILL, "gh-kill", token])

    async def _exec_quiet(self, args: list[str]) -> None:
        try:
            pid = await self.exec_start("/bin/sh", args, env=[f"PATH={DEFAULT_PATH}"])
            await self.wait_exec(pid, time.monotonic() + self.call_timeout)
        except ProviderError:
            pass

    async def set_time(self) -> None:
        """Set the guest clock to the host's (after a memory restore the guest's clock is stale)."""
        await self.command("guest-set-time", {"time": time.time_ns()})


__all__ = ["GuestAgent", "ScriptResult", "plain_reason"]
