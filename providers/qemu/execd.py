"""Scripts through gh-execd, the resident executor of a guest that has one (manifest channel `gh-execd`).

gh-execd (image-builder's assets/linux-tiny/src/gh-execd.c) is started at boot, waits on its own
virtio serial port, and runs one script per request: it sets the clock and reseeds the RNG with
system calls when asked, forks once, and answers when the script exits. A script through qemu-ga
starts four processes and polls over libvirt; under TCG that is most of a short script's time
(bench/script_time.py). The script runs exactly as guest_agent.WRAPPER runs it (`interp
/proc/self/fd/3` in its own session, stdin /dev/null, umask 077, the same environment), so a script
cannot tell the two apart.

qemu-ga stays the way for what gh-execd does not take: a script as another user, output kept past
1 MiB, a second script while one runs, any machine whose executor did not answer, and a request
it refused unrun (an image whose executor speaks another version). `Unavailable` means the script
did not run, so the caller may send it through qemu-ga; any other failure after the request left
is a ProviderError, never a second run.

The wire format, shared with gh-execd.c (integers little-endian):
  request: REQUEST header (magic "GHX1", id, flags, timeout_ms, keep, reseed_len, clock_ms,
           interp_len, env_len, script_len, 0), then the reseed bytes, the interpreter's path, the
           environment ("K=V\\0" each) and the script.
  reply:   REPLY header (magic "GHXR", id, kind, code, out_len, err_len), then out, then err.
The host connects to the port's unix socket (QEMU listens; libvirt names it) and sends the next
request only after the reply.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum

import libvirt

from gh_common.timeouts import within
from providers.base import ScriptResult
from providers.errors import ProviderError
from providers.qemu.agent_groups import FrozenTime
from providers.qemu.domain import EXECD_CHANNEL
from providers.qemu.errors import in_thread
from providers.qemu.guest_agent import ClockNotSet, io_paused
from providers.qemu.handle import Domain

REQUEST = struct.Struct("<6IQ4I")
REPLY = struct.Struct("<3Ii2I")
REQUEST_MAGIC = 0x31584847  # "GHX1"
REPLY_MAGIC = 0x52584847  # "GHXR"
FLAG_CLOCK = 1
FLAG_RESEED = 2
# gh-execd's static buffers; a request past one goes to qemu-ga.
MAX_RESEED = 64
MAX_INTERP = 255
MAX_ENV = 64 * 1024
MAX_SCRIPT = 1024 * 1024
MAX_KEEP = 1024 * 1024 + 1
CONNECT_TIMEOUT_S = 5.0
# After the script's own deadline gh-execd kills its session and answers; past this much more, the
# executor itself is taken as stuck.
REPLY_GRACE_S = 10.0
WATCH_S = 2.0  # how often the domain is looked at while a reply is awaited
NOT_A_REPLY = "gh-execd answered with bytes that are not a reply"


class ReplyKind(IntEnum):
    EXITED = 0  # code: the exit status
    SIGNALED = 1  # code: the signal
    TIMED_OUT = 2  # killed with its session at the deadline; the output so far
    CLOCK_NOT_SET = 3  # the script did not run; code: errno
    RNG_NOT_RESEEDED = 4  # the script did not run; code: errno
    BAD_REQUEST = 5  # the script did not run
    NOT_STARTED = 6  # the script did not run (fork or pipe failed); code: errno


class Unavailable(Exception):
    """gh-execd could not be asked (no port, no connection, a request past its limits) or refused
    the request unrun: the script did not run, so it may go through qemu-ga instead."""


@dataclass(frozen=True)
class Reply:
    kind: ReplyKind
    code: int
    stdout: bytes
    stderr: bytes


def port_path(domain_xml: str) -> str | None:
    """The host side of the executor's port: the unix socket libvirt had QEMU listen on."""
    root = ET.fromstring(domain_xml)
    for ch in root.iterfind("./devices/channel"):
        target = ch.find("target")
        source = ch.find("source")
        if target is not None and target.get("name") == EXECD_CHANNEL and source is not None:
            return source.get("path")
    return None


def encode_request(request_id: int, script: bytes, env: Sequence[str], *, interpreter: str, timeout: float,
                   keep: int, clock_ms: int | None, reseed: bytes | None) -> bytes:
    """The request's bytes. Raises Unavailable for one gh-execd would refuse (the caller uses qemu-ga)."""
    env_block = b"".join(e.encode("utf-8") + b"\0" for e in env)
    interp = interpreter.encode("utf-8")
    seed = reseed or b""
    if (len(script) > MAX_SCRIPT or len(env_block) > MAX_ENV or not 0 < len(interp) <= MAX_INTERP
            or b"\0" in interp or len(seed) > MAX_RESEED or not 0 <= keep <= MAX_KEEP):
        raise Unavailable("the request is past gh-execd's limits")
    flags = (FLAG_CLOCK if clock_ms is not None else 0) | (FLAG_RESEED if seed else 0)
    timeout_ms = max(1, min(int(timeout * 1000), 0xFFFFFFFF))
    head = REQUEST.pack(REQUEST_MAGIC, request_id, flags, timeout_ms, keep, len(seed), clock_ms or 0, len(interp),
                        len(env_block), len(script), 0)
    return b"".join((head, seed, interp, env_block, script))


class ExecChannel:
    """gh-execd of one machine: one connection, one script at a time."""

    def __init__(self, domain: Domain) -> None:
        self.domain = domain
        self.broken: str | None = None  # why this machine's scripts go to qemu-ga from now on
        self._lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    @property
    def free(self) -> bool:
        """Whether a script may be sent now (none running, the executor not given up on)."""
        return self.broken is None and not self._lock.locked()

    async def connect(self) -> None:
        """Connect to the port (ahead of the first script: the hot pool does it while priming).
        Raises Unavailable."""
        if self._writer is not None and self._reader is not None and not self._reader.at_eof():
            return
        self.close()

        def xml(_c: libvirt.virConnect, dom: libvirt.virDomain) -> str:
            return str(dom.XMLDesc(0))

        try:
            path = port_path(await in_thread("reading the machine's devices", self.domain.call_blocking, xml,
                                             timeout=CONNECT_TIMEOUT_S))
            if path is None:
                raise Unavailable("the domain has no gh-execd port")
            self._reader, self._writer = await within(
                CONNECT_TIMEOUT_S, asyncio.open_unix_connection(path, limit=2 * MAX_KEEP + REPLY.size))
        except (OSError, TimeoutError, ProviderError) as e:
            raise Unavailable(f"cannot connect to gh-execd's port: {e}") from e

    def close(self) -> None:
        """Drop the connection (the next script connects again): after the domain was restored
        from a save, its QEMU, and so the port's socket, is a new one."""
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    def give_up(self, why: str) -> None:
        self.broken = why
        self.close()

    async def run(self, script: str, env: Sequence[str], *, interpreter: str, timeout: float, output_cap: int,
                  clock_ms: int | None = None, reseed: bytes | None = None,
                  frozen: FrozenTime | None = None) -> ScriptResult:
        """Run `script` as guest_agent.GuestAgent.run_sh would (root; `interpreter`; `env` exactly).
        With `frozen` (an agent's exec), the wait for its reply moves on by every second a hold froze
        it, as gh-execd's own deadline does.

        Raises:
            Unavailable: the script did not run (use qemu-ga).
            ClockNotSet: the guest refused the clock; the script did not run.
            ProviderError: the guest refused to reseed or start it, or the channel broke after the
                request left (the script may have run: it is not sent again).
        """
        keep = output_cap + 1
        started = time.monotonic()
        async with self._lock:
            if self.broken is not None:
                raise Unavailable(self.broken)
            request_id = next(self._ids) & 0xFFFFFFFF
            payload = encode_request(request_id, script.encode("utf-8"), env, interpreter=interpreter,
                                     timeout=timeout, keep=keep, clock_ms=clock_ms, reseed=reseed)
            try:
                await self.connect()
            except Unavailable as e:  # not tried again for every script: each try could take CONNECT_TIMEOUT_S
                self.give_up(str(e))
                raise
            assert self._reader is not None and self._writer is not None
            at = time.monotonic() + timeout
            deadline = frozen.deadline(timeout) if frozen is not None else lambda: at
            reply = await self._exchange(payload, request_id, keep, deadline)
        duration = time.monotonic() - started
        if reply is None:  # the executor is stuck: the script's fate is unknown, as qemu-ga's stuck wrapper
            return ScriptResult(exit_code=None, stdout="", stderr="", timed_out=True, duration_s=duration)
        if reply.kind is ReplyKind.CLOCK_NOT_SET:
            raise ClockNotSet(f"the guest did not set its clock (errno {reply.code})")
        if reply.kind is ReplyKind.RNG_NOT_RESEEDED:
            raise ProviderError(f"the guest did not reseed its RNG after the restore (errno {reply.code})")
        if reply.kind is ReplyKind.NOT_STARTED:
            raise ProviderError(f"the guest could not start the script (errno {reply.code})")
        if reply.kind is ReplyKind.BAD_REQUEST:  # nothing ran (an image whose executor speaks another version)
            raise Unavailable("gh-execd refused the request as malformed")
        exit_code = {ReplyKind.EXITED: reply.code, ReplyKind.SIGNALED: 128 + reply.code}.get(reply.kind)
        out, err = reply.stdout, reply.stderr
        return ScriptResult(
            exit_code=exit_code,
            stdout=out[:output_cap].decode("utf-8", errors="replace"),
            stderr=err[:output_cap].decode("utf-8", errors="replace"),
            stdout_truncated=len(out) > output_cap,
            stderr_truncated=len(err) > output_cap,
            timed_out=reply.kind is ReplyKind.TIMED_OUT,
            duration_s=duration,
        )

    async def _reply_head(self, reader: asyncio.StreamReader, deadline: Callable[[], float]) -> bytes:
        """The next reply's header, by the monotonic time `deadline()` says (it can move on). While it
        is awaited the domain is looked at every WATCH_S: a guest paused under the script (QEMU stops
        it when a write to its disk fails, as on a full host disk) or a stopped one will never answer,
        and that is ours to report, not the script's timeout. (qemu-ga's path learns the same from its failing polls.)

        Raises:
            TimeoutError: no header by the deadline.
            ProviderError: the guest was paused or stopped under the script.
        """
        read = asyncio.ensure_future(reader.readexactly(REPLY.size))
        try:
            while True:
                done, _ = await asyncio.wait({read}, timeout=max(0.0, min(WATCH_S, deadline() - time.monotonic())))
                if done:
                    return read.result()
                if time.monotonic() >= deadline():
                    raise TimeoutError
                if (why := await self._not_running()) is not None:
                    raise ProviderError(why)
        finally:
            if not read.done():
                read.cancel()

    async def _not_running(self) -> str | None:
        """Why the guest cannot be running the script, or None (also when libvirt cannot say: the
        executor needs no libvirt to answer, and a libvirtd restart must not fail a script)."""
        def go(_c: libvirt.virConnect, dom: libvirt.virDomain) -> str | None:
            state, _reason = dom.state()
            if state in (libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_BLOCKED):
                return None
            if state == libvirt.VIR_DOMAIN_PAUSED:
                return io_paused(dom) or "the machine was paused while its script ran"
            return "the machine stopped while its script ran"

        try:
            return await self.domain.call("reading machine state", go, timeout=WATCH_S)
        except ProviderError:
            return None

    async def _exchange(self, payload: bytes, request_id: int, keep: int,
                        deadline: Callable[[], float]) -> Reply | None:
        """Send `payload` and read its reply, the script's deadline (`deadline()`) and REPLY_GRACE_S later at most."""
        assert self._reader is not None and self._writer is not None
        reader, writer = self._reader, self._writer

        def late() -> float:
            return deadline() + REPLY_GRACE_S

        try:
            writer.write(payload)
            await within(max(0.0, late() - time.monotonic()), writer.drain())
            while True:
                head = await self._reply_head(reader, late)
                magic, got_id, kind, code, out_len, err_len = REPLY.unpack(head)
                if (magic != REPLY_MAGIC or got_id > request_id or kind not in ReplyKind._value2member_map_
                        or out_len > MAX_KEEP or err_len > MAX_KEEP):
                    raise ProviderError(NOT_A_REPLY)
                body = await within(REPLY_GRACE_S, reader.readexactly(out_len + err_len))
                if got_id in (request_id, 0):
                    break
                # An earlier request's, whose caller was cancelled: gh-execd finished it, then read this one.
            if out_len > keep or err_len > keep:
                raise ProviderError("gh-execd answered with more output than it was asked to keep")
        except TimeoutError:
            self.give_up(f"gh-execd did not answer within {REPLY_GRACE_S:g}s of the script's deadline")
            return None
        except (OSError, asyncio.IncompleteReadError) as e:
            self.give_up(f"gh-execd's port closed: {e}")
            raise ProviderError("the connection to the guest's executor broke during a script") from e
        except ProviderError as e:
            self.give_up(str(e))
            raise
        except BaseException:  # cancelled: its reply would meet the next request, so that one connects anew
            self.close()
            raise
        reply = Reply(ReplyKind(kind), code, body[:out_len], body[out_len:])
        if reply.kind is ReplyKind.BAD_REQUEST:
            self.give_up("gh-execd refused a request as malformed")  # it drops the rest until we hang up
        return reply


__all__ = ["ExecChannel", "Reply", "ReplyKind", "Unavailable", "encode_request", "port_path"]
