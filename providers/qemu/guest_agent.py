"""Scripts through the QEMU guest agent: guest-exec with the script on stdin, polled with a deadline.

One script is one guest-exec (the wrapper in argv, the script on stdin) and guest-exec-status polls
that start at 1 ms and back off (a short script is done within a few ms of its start; a long one is
polled at most every `EXEC_POLLING.cap`). A restored guest's clock is set by the same call: the wrapper runs
`date -s @<seconds>` before the script (see `clock_arg`), instead of qemu-ga's guest-set-time,
whose `hwclock -w` in the guest waits for the RTC's next second (0.3-0.5 s under TCG).

Why a wrapper: guest-exec's own output capture has no cap below 16 MiB per stream and libvirt's RPC
refuses replies over 4 MiB, and killing guest-exec's pid alone leaves the script's children running.
So the agent starts a tiny POSIX-sh wrapper that runs the script (read from its stdin) in its own
session with output redirected to private temp files, and prints back at most the first `cap + 1`
bytes of each stream. On timeout we kill the script's whole session, and the wrapper
still reports the partial output.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import libvirt
import libvirt_qemu

from gh_common.backoff import Backoff
from providers.base import DEFAULT_OUTPUT_CAP, ScriptResult
from providers.errors import MachineNotReady, ProviderError
from providers.qemu.agent_groups import FrozenTime, join
from providers.qemu.errors import in_thread, plain_reason
from providers.qemu.handle import Domain

# Bytes per stream that come back inline with the exit status; two base64 streams of this size
# stay well under libvirt's 4 MiB reply limit. Larger caps are fetched in further pieces.
INLINE_CHUNK = 1024 * 1024
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
KILL_GRACE_S = 5.0
# The wrapper's answer when it could not set the clock (busybox `date -s`) or reseed the guest's RNG
# (gh-reseed): the script did not run.
WRAPPER_REFUSED_EXIT = 125
CLOCK_NOT_SET_MARK = b"gh-exec: the clock was not set"
RESEED_NOT_DONE_MARK = b"gh-exec: the guest RNG was not reseeded"
RESEED_BYTES = 32


class ClockMode(StrEnum):
    """How a restored guest's clock is set (sh guests on qemu-ga; a WinRM image always uses SET_TIME)."""

    IN_EXEC = "in_exec"  # by the first script's own request: the wrapper's `date -s`, or gh-execd's clock_settime
    SET_TIME = "set_time"  # qemu-ga's guest-set-time beside ready (waits for `hwclock -w` in the guest)


# How polls back off. These are policies, never counted down themselves: each wait counts down its
# own copy (`replace(policy, failures=0)`).
# guest-exec-status asked again 1 ms after the first ask, then twice the previous wait, at most 50 ms.
EXEC_POLLING = Backoff(base=0.001, cap=0.05, factor=2.0)
# The polling before the script path was tuned (from 20 ms, x1.5, at most 250 ms): bench/legacy_exec.py
# sets it for bench/script_time.py's side by side.
LEGACY_POLLING = Backoff(base=0.02, cap=0.25, factor=1.5)
# guest-ping while a guest boots: from 100 ms, x1.5, at most 500 ms.
READY_POLLING = Backoff(base=0.1, cap=0.5, factor=1.5)

# Every process the wrapper starts costs a fork and an exec of busybox, 5-30 ms each under TCG, so
# the path to the script's result starts as few as it can: `date` and gh-reseed (only in the first
# script after a restore), setsid + sh (the script's own), and `head` only for a stream that is not
# empty; the script is read by its sh from the wrapper's stdin (fd 3) instead of being copied to a
# file first, and the files are removed in the background (qemu-ga reports the exit without
# waiting for that). The script sees fd 3 (the rest of its own text) open; its stdin is /dev/null.
# $5: the interpreter (/bin/sh, /bin/bash); $6: the user to run the script as (empty: root, as
# qemu-ga); $7: host bytes (hex) gh-reseed credits to the guest's RNG and reseeds it from, on
# images that have it (see `reseed_arg`). A user's script is first written to its own file (mode
# 0600, given to that user: a user cannot open root's pipe through /proc/self/fd); its output files
# stay root's. $8: sh text the wrapper runs as root before it starts the script (agent_groups.join:
# an agent's exec joins its own cgroup, with the wrapper, so a hold can freeze it); ours, never the caller's.
WRAPPER = r"""
f=/tmp/gh-exec-$1; lim=$2; keep=$3; interp=${5:-/bin/sh}; user=$6
if [ -n "$4" ]; then
  case $4 in *[!0-9]*) echo "gh-exec: the clock was not set (bad time)" >&2; exit 125;; esac
  c=$(( ($4 + 500) / 1000 ))
  r=
  [ ! -r /sys/class/rtc/rtc0/since_epoch ] || read r < /sys/class/rtc/rtc0/since_epoch
  case $r in
    ''|*[!0-9]*) ;;
    *) if [ "$r" -ge $(( $4 / 1000 )) ]; then
         c=$r; [ $(( $4 - r * 1000 )) -le 500 ] || c=$(( r + 1 ))
       fi;;
  esac
  date -s "@$c" >/dev/null 2>&1 || { echo "gh-exec: the clock was not set" >&2; exit 125; }
fi
if [ -n "$7" ] && [ -x /usr/sbin/gh-reseed ]; then
  /usr/sbin/gh-reseed "$7" || { echo "gh-exec: the guest RNG was not reseeded" >&2; exit 125; }
fi
[ -z "$8" ] || eval "$8"
umask 077
set -C
exec 3<&0
if command -v setsid >/dev/null 2>&1; then s=setsid; else s=; fi
src=/proc/self/fd/3
if [ -n "$user" ]; then
  cat <&3 > "$f.script" && chown "$user:" "$f.script" || exit 125
  src=$f.script
  s="$s setpriv --reuid=$user --regid=$user --init-groups"
fi
$s "$interp" "$src" > "$f.out" 2> "$f.err" < /dev/null &
echo $! > "$f.pid"
exec 3<&-
wait $!
rc=$?
[ ! -s "$f.out" ] || head -c "$lim" "$f.out"
[ ! -s "$f.err" ] || head -c "$lim" "$f.err" >&2
[ -n "$keep" ] || rm -f "$f.out" "$f.err" "$f.pid" "$f.script" < /dev/null > /dev/null 2>&1 &
exit $rc
"""

KILL = r"""
p=$(cat "/tmp/gh-exec-$1.pid" 2>/dev/null) || exit 0
kill -KILL -"$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null
exit 0
"""

FETCH = r"""tail -c +"$2" "/tmp/gh-exec-$1.$3" | head -c "$4" """
FORGET = r"""rm -f "/tmp/gh-exec-$1.out" "/tmp/gh-exec-$1.err" "/tmp/gh-exec-$1.pid" "/tmp/gh-exec-$1.script" """


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class RunAs:
    """Who runs a script: an interpreter, and a user (None: root) with that user's environment
    (for a desktop image: the signed-in user inside its graphical session, see DesktopSession)."""

    interpreter: str = "/bin/sh"
    user: str | None = None
    env: Mapping[str, str] | None = None


ROOT_SH = RunAs()


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


def script_env(run_as: RunAs, env: Mapping[str, str] | None) -> list[str]:
    """A script's whole environment ("K=V" each): ours, then the user's (run_as), then the caller's.
    Raises ProviderError for a name or value the guest cannot take."""
    full_env = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
    full_env.update(run_as.env or {})
    full_env.update(env or {})
    return _check_env(full_env)


def clock_ms() -> int:
    """The host's time in ms, read as the request is sent (see clock_arg)."""
    return time.time_ns() // 1_000_000


def clock_arg() -> str:
    """The host's time in ms, read as the request is sent: the least the guest's time can be when
    its `date -s` runs. The wrapper takes the seconds from the guest's RTC where it can (QEMU drives
    it from the host's clock, also after a restore; read without starting a process), as a cold
    boot does, which stays right however long the guest took to start the wrapper (a loaded host:
    seconds); the host's time picks the nearer second, and stands in where there is no RTC."""
    return str(clock_ms())


def reseed_arg() -> str:
    """Fresh host bytes for a restored guest's RNG, in hex. Every machine restored from one memory
    image starts with that image's kernel RNG state, and Linux renews it only on its own schedule
    (up to 60 s of guest time, which a restore replays), so without these two such machines would
    read the same bytes from /dev/urandom. A kernel with a VM generation ID driver reseeds on the
    restore by itself (the domain has `<genid/>`, domain.py); linux-tiny's has none, so its first
    script after a restore runs /usr/sbin/gh-reseed with these (image-builder's
    assets/linux-tiny/src/gh-reseed.c), in the same guest-exec."""
    return secrets.token_hex(RESEED_BYTES)


class ClockNotSet(ProviderError):
    """The wrapper could not set the guest clock; the script did not run."""


AGENT_GONE = (libvirt.VIR_ERR_OPERATION_INVALID, libvirt.VIR_ERR_AGENT_UNRESPONSIVE, libvirt.VIR_ERR_AGENT_UNSYNCED,
              libvirt.VIR_ERR_OPERATION_TIMEOUT)


def io_paused(dom: libvirt.virDomain) -> str | None:
    """Why the guest is paused on an I/O error (QEMU's werror=stop), in plain words, or None. Called
    after a guest agent call failed ("not responding", "domain is not running"): that alone says
    nothing an operator can act on, and the usual cause is the host's disk filling up under the overlay."""
    try:
        state, reason = dom.state()
        if state != libvirt.VIR_DOMAIN_PAUSED or reason != libvirt.VIR_DOMAIN_PAUSED_IOERROR:
            return None
        errors = dom.diskErrors()
    except libvirt.libvirtError:
        return None
    if any(err == libvirt.VIR_DOMAIN_DISK_ERROR_NO_SPACE for err in errors.values()):
        return ("the host disk is full: the guest was paused when writing its disk failed (no space left "
                "under the runner's state dir); free space there")
    return "the guest was paused on an I/O error writing its disk on the host (see the host's kernel log)"


class GuestAgent:
    """The qemu-ga channel of one domain, looked up by name on every call (survives reconnects)."""

    def __init__(self, domain: Domain, *, call_timeout: float = 20.0, polling: Backoff = EXEC_POLLING,
                 wrapper: str = WRAPPER) -> None:
        self.domain = domain
        self.call_timeout = call_timeout
        self.polling = polling  # of guest-exec-status: each wait counts down its own copy
        self.wrapper = wrapper  # bench/legacy_exec.py passes an older one, for bench/script_time.py's side by side

    @property
    def domain_name(self) -> str:
        return self.domain.name

    def _command_blocking(self, payload: str, agent_timeout: int, retry: bool) -> str:
        def go(_c: libvirt.virConnect, dom: libvirt.virDomain) -> str:
            try:
                out = libvirt_qemu.qemuAgentCommand(dom, payload, agent_timeout, 0)
            except libvirt.libvirtError as e:
                # A paused guest's agent "is not responding" (or the domain "is not running"): ask why.
                if e.get_error_code() in AGENT_GONE and (why := io_paused(dom)):
                    raise ProviderError(why) from None
                raise
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
        backoff = replace(READY_POLLING, failures=0)
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
            await asyncio.sleep(min(backoff.next_delay(), max(0.0, deadline - time.monotonic())))

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

    async def wait_exec(self, pid: int, deadline: float | Callable[[], float]) -> ExecStatus | None:
        """Poll guest-exec-status until the process exits or `deadline` (monotonic; or the time it
        says, when it can move on) passes."""
        backoff = replace(self.polling, failures=0)
        while True:
            st = await self.exec_status(pid)
            if st.exited:
                return st
            left = (deadline() if callable(deadline) else deadline) - time.monotonic()
            if left <= 0:
                return None
            await asyncio.sleep(min(backoff.next_delay(), left))

    async def run_sh(self, script: str, *, env: Mapping[str, str] | None, timeout: float,
                     output_cap: int = DEFAULT_OUTPUT_CAP, set_clock: bool = False, reseed: bool = False,
                     run_as: RunAs = ROOT_SH, group: str | None = None,
                     frozen: FrozenTime | None = None) -> ScriptResult:
        """Run `script` with /bin/sh as root in the guest (or as `run_as` says: another interpreter,
        another user and that user's environment); see the module docstring for the shape. With
        `group`, the script runs in that agent exec group (agent_groups.py); with `frozen` its timeout
        moves on by every second a hold froze it (this path's only deadline is the host's).

        With `set_clock`, the guest's clock is set to the host's (read as the request is sent)
        before the script starts, in the same guest-exec. Raises ClockNotSet (the script did not
        run) when the guest refused. With `reseed`, the guest's RNG is reseeded from fresh host
        bytes first (`reseed_arg`), where the image can; raises ProviderError (the script did not
        run) when its kernel refused.
        """
        if output_cap < 0:
            raise ProviderError("output_cap must be >= 0")
        env_list = script_env(run_as, env)
        token = secrets.token_hex(8)
        inline = min(output_cap, INLINE_CHUNK) + 1
        keep = output_cap > INLINE_CHUNK
        started = time.monotonic()
        clock = clock_arg() if set_clock else ""
        pid = await self.exec_start(
            "/bin/sh", ["-c", self.wrapper, "gh-exec", token, str(inline), "keep" if keep else "", clock,
                        run_as.interpreter, run_as.user or "", reseed_arg() if reseed else "",
                        join(group) if group is not None else ""],
            env=env_list, stdin=script.encode("utf-8"),
        )
        st = await self.wait_exec(pid, frozen.deadline(timeout) if frozen is not None else started + timeout)
        if (set_clock and st is not None and st.exit_code == WRAPPER_REFUSED_EXIT
                and CLOCK_NOT_SET_MARK in st.stderr):
            raise ClockNotSet(f"the guest did not set its clock: {decode(st.stderr)[:200]}")
        if reseed and st is not None and st.exit_code == WRAPPER_REFUSED_EXIT and RESEED_NOT_DONE_MARK in st.stderr:
            # Ours, not the script's: a machine whose RNG is its memory image's is not fresh.
            raise ProviderError(f"the guest did not reseed its RNG after the restore: {decode(st.stderr)[:200]}")
        timed_out = st is None
        if st is None:
            await self._kill(token)
            st = await self.wait_exec(pid, time.monotonic() + KILL_GRACE_S)
            if st is None:  # the wrapper itself is stuck: give up on its output
                await self._exec_quiet(["-c", f"kill -KILL {pid}; {FORGET}", "gh-forget", token])
                st = ExecStatus(True, None, 9, b"", b"")
        out, err = st.stdout, st.stderr
        try:
            if keep:
                out = await self._fetch_rest(token, "out", out, output_cap)
                err = await self._fetch_rest(token, "err", err, output_cap)
        finally:
            if keep:
                await self._exec_quiet(["-c", FORGET, "gh-forget", token])
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


__all__ = ["EXEC_POLLING", "LEGACY_POLLING", "READY_POLLING", "ROOT_SH", "ClockMode", "ClockNotSet", "GuestAgent",
           "RunAs", "ScriptResult", "clock_ms", "plain_reason", "script_env"]
