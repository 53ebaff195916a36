"""gh-execd, linux-tiny's resident script executor (providers/qemu/execd.py), on real guests: a
script through it is one a caller cannot tell from qemu-ga's (but for what qemu-ga's wrapper shell
adds: SHLVL, a job's "Terminated"), and whatever goes wrong with it (a
second script at once, the executor killed, bytes that are not a request) costs no script and no
machine: qemu-ga takes over, or init starts the executor again."""

from __future__ import annotations

import asyncio
import struct

import pytest

from providers.qemu import QemuMachine
from providers.qemu.execd import REPLY, REPLY_GRACE_S, REPLY_MAGIC, ReplyKind, encode_request, port_path
from providers.qemu.guest_agent import ROOT_SH, script_env

from .conftest import Machines

pytestmark = [pytest.mark.libvirt, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

PARENT = 'cat "/proc/$PPID/comm"'  # gh-execd when the script came through it


async def parent(m: QemuMachine) -> str:
    res = await m.run_script(PARENT, timeout=30)
    assert res.exit_code == 0, res.stderr
    return res.stdout.strip()


async def test_a_script_through_the_executor_is_one_the_caller_cannot_tell_from_qemu_gas(
        shared_machine: QemuMachine) -> None:
    m = shared_machine
    assert await parent(m) == "gh-execd"
    scripts = [
        # (qemu-ga's wrapper is an sh itself, so there a script's SHLVL is 2: the one difference)
        ('echo "$0 $(umask)"; env | grep -v ^SHLVL= | sort; ls /proc/self/fd; read x || echo "stdin empty"', None,
         4096),
        ("echo out; echo err >&2; exit 3", None, 4096),
        ("printf '\\377ok\\n'; printf 'x%.0s' $(seq 1 300)", None, 100),  # not UTF-8; over the cap
        ('echo "$GH_A|$GH_B"', {"GH_A": "one two", "GH_B": "é"}, 4096),
        ("head -c 200000 /dev/zero | tr '\\0' y; echo; echo done >&2", None, 150000),
    ]
    for script, env, cap in scripts:
        through_execd = await m.run_script(script, env=env, timeout=30, output_cap=cap)
        through_qga = await m.agent.run_sh(script, env=env, timeout=30, output_cap=cap)
        for field in ("exit_code", "stdout", "stderr", "stdout_truncated", "stderr_truncated", "timed_out"):
            assert getattr(through_execd, field) == getattr(through_qga, field), (script, field)
    assert through_execd.stdout_truncated and len(through_execd.stdout) == 150000
    # A script ended by a signal exits 128 + its number either way; qemu-ga's wrapper shell also
    # reports the job ("Terminated") on the script's stderr, which is the wrapper's, not the script's.
    script = "echo before; kill -TERM $$"
    through_execd = await m.run_script(script, timeout=30)
    through_qga = await m.agent.run_sh(script, env=None, timeout=30)
    assert (through_execd.exit_code, through_execd.stdout, through_execd.stderr) == (143, "before\n", "")
    assert (through_qga.exit_code, through_qga.stdout, through_qga.stderr) == (143, "before\n", "Terminated\n")


async def test_a_script_past_its_deadline_is_killed_with_everything_it_started(shared_machine: QemuMachine) -> None:
    m = shared_machine
    res = await m.run_script("sleep 300 & echo $! > /tmp/gh-t-bg; echo started; sleep 300", timeout=2)
    assert (res.timed_out, res.exit_code, res.stdout) == (True, None, "started\n")
    assert m.execd is not None and m.execd.broken is None
    # Dead: no such process, or a zombie init has not reaped yet.
    gone = await m.run_script('s=$(cut -d" " -f3 "/proc/$(cat /tmp/gh-t-bg)/stat" 2>/dev/null); echo "${s:-gone}"',
                              timeout=30)
    assert gone.stdout in ("gone\n", "Z\n")
    assert await parent(m) == "gh-execd"


async def test_a_second_script_at_once_goes_through_qemu_ga_and_both_finish(shared_machine: QemuMachine) -> None:
    m = shared_machine
    both = await asyncio.gather(*(m.run_script(f"sleep 1; {PARENT}; echo {i}", timeout=60) for i in (1, 2)))
    outs = [r.stdout.split() for r in both]
    assert [o[1] for o in outs] == ["1", "2"]
    assert {o[0] for o in outs} == {"gh-execd", "sh"}  # the other through qemu-ga's wrapper, an sh


async def test_an_executor_killed_between_scripts_is_started_again_by_init(shared_machine: QemuMachine) -> None:
    m = shared_machine
    before = (await m.run_script("echo $PPID", timeout=30)).stdout
    killed = await m.agent.run_sh("kill -KILL $(pidof gh-execd)", env=None, timeout=30)
    assert killed.exit_code == 0
    # The request waits in the port until the new executor opens it.
    after = await m.run_script(f"{PARENT}; echo $PPID", timeout=30)
    assert after.stdout.split()[0] == "gh-execd" and after.stdout.split()[1] != before.strip()


async def test_bytes_that_are_not_a_request_are_refused_and_the_next_script_runs(shared_machine: QemuMachine) -> None:
    m = shared_machine
    assert m.execd is not None
    m.execd.close()  # QEMU takes one client on the port: ours steps aside for this raw one
    xml = await m.domain.call("reading the domain", lambda _c, dom: str(dom.XMLDesc(0)))
    path = port_path(xml)
    assert path is not None
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        # A request whose framing is ours but whose content is not (no interpreter): refused by id.
        bad = bytearray(encode_request(7, b"echo no", script_env(ROOT_SH, None), interpreter="/bin/sh",
                                       timeout=5, keep=10, clock_ms=None, reseed=None))
        struct.pack_into("<I", bad, 32, 0)  # interp_len = 0
        bad = bad[:48] + bad[48 + len("/bin/sh"):]
        writer.write(bytes(bad))
        magic, rid, kind, _code, out_len, err_len = REPLY.unpack(await reader.readexactly(REPLY.size))
        assert (magic, rid, kind, out_len, err_len) == (REPLY_MAGIC, 7, ReplyKind.BAD_REQUEST, 0, 0)
        # Bytes that are no request at all: refused, and the rest dropped until we hang up.
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(64))
        _m, rid, kind, *_ = REPLY.unpack(await reader.readexactly(REPLY.size))
        assert (rid, kind) == (0, ReplyKind.BAD_REQUEST)
    finally:
        writer.close()
    assert await parent(m) == "gh-execd"
    assert (await m.run_script("echo fine", timeout=30)).stdout == "fine\n"


async def test_a_script_that_kills_its_executor_times_out_and_later_scripts_use_qemu_ga(machines: Machines) -> None:
    m = await machines.create()
    assert await parent(m) == "gh-execd"
    res = await m.run_script("kill -KILL $PPID; echo after", timeout=1)
    # Its reply died with the executor: the host waited the script's deadline and the grace, no longer.
    assert res.timed_out and res.exit_code is None and res.duration_s < 1 + REPLY_GRACE_S + 5
    assert m.execd is not None and m.execd.broken is not None
    assert await parent(m) == "sh"  # qemu-ga's wrapper from now on, on this machine
    assert (await m.run_script("echo still", timeout=30)).stdout == "still\n"
