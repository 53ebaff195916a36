"""The real `gh-runner` console script as a subprocess: help/version, config errors, `images`, drain
on SIGTERM, a forced stop, and kill -9 then restart.

The subprocess runs the real daemon and the real `Attempt` on the slow provider double, selected by
the test-only hook GH_RUNNER_TEST_PROVIDER=runner.doubles:make_provider.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gh_runner.journal import Journal
from gh_wire.protocol import TaskEnd

from .peer import Peer, make_lease

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
GH_RUNNER = [sys.executable, "-m", "gh_local.cli"]


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GH_RUNNER_")}
    env.update({
        "PYTHONPATH": f"{REPO}{os.pathsep}{TESTS}",
        "GH_RUNNER_TEST_PROVIDER": "runner.doubles:make_provider",
        "GH_TEST_PROVIDER_STATE": str(tmp / "provider.json"),
        "GH_RUNNER_TOKEN": Peer.token,
        "HOME": str(tmp),
    })
    env.pop("CREDENTIALS_DIRECTORY", None)
    env.update(extra)
    return env


def run_cli(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GH_RUNNER, *args], env=_env(tmp, **env), capture_output=True, text=True, timeout=120)


def test_version_and_help() -> None:
    out = subprocess.run([*GH_RUNNER, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("gh-runner 0.")
    out = subprocess.run([*GH_RUNNER, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for needle in ("--server", "--token-file", "GH_RUNNER_", "SIGTERM", "images", "doctor", "local"):
        assert needle in out.stdout


DAEMON_ONLY = ("--server", "--token", "--token-file", "--labels", "--slots", "--metrics-listen", "--drain-grace",
               "--insecure")


def test_each_subcommand_lists_only_its_own_options() -> None:
    from gh_runner.cli import build_parser

    top = build_parser()
    subs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(subs) == {"images", "doctor", "selftest", "drain", "local", "validate", "import", "export"}
    top_help = top.format_help()
    for name in subs:  # the top help names every subcommand, validate too
        assert f"  {name}" in top_help, name
    for name, p in subs.items():
        text = p.format_help()
        options = {o for a in p._actions for o in a.option_strings}
        # doctor checks the daemon's configuration, so it takes the daemon's options; no other does.
        # local and validate: attempts at once on this host; export: the control plane it reads from.
        own = {"local": {"--slots"}, "validate": {"--slots"}, "export": {"--server"}}.get(name, set())
        if name != "doctor":
            assert not options & (set(DAEMON_ONLY) - own), (name, sorted(options & set(DAEMON_ONLY)))
        # Help is complete: nothing points at a section the page does not have.
        assert "(see below)" not in text, name
        for a in p._actions:
            if a.option_strings and a.help is None and a.dest != "help":
                raise AssertionError(f"{name} {a.option_strings} has no help")
    assert "(see below)" not in top_help
    images_help = run_cli(Path("/tmp"), "images", "--help").stdout
    assert "--drain-grace" not in images_help and "--token" not in images_help and "--images-dir" in images_help


@pytest.mark.parametrize("command", ["local", "validate"])
def test_local_gets_a_state_dir_only_where_one_was_given(command: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Without one, `local` and `validate` keep their runner's state in a temporary dir of their own (and
    remove it), never in the default dir an operator's daemon on this host may be using: before, the
    default (/var/lib/gh-runner/state for root) rode along as if given, and warm snapshots and a journal
    stayed there after every run."""
    from gh_runner.cli import main

    seen: list[Any] = []

    def run(args: argparse.Namespace) -> int:
        seen.append(args.state_dir)
        return 0

    for var in ("GH_RUNNER_STATE_DIR", "GH_RUNNER_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    cases = str(tmp_path / "cases.yaml")
    no_dir = tmp_path / "runner.yaml"
    no_dir.write_text("timeouts: {check: 30}\n")
    with_dir = tmp_path / "with-dir.yaml"
    with_dir.write_text(f"state_dir: {tmp_path / 'from-file'}\n")
    for argv in ([command, cases], [command, cases, "--config", str(no_dir)],
                 [command, cases, "--state-dir", str(tmp_path / "from-flag")],
                 [command, cases, "--config", str(with_dir)]):
        assert main(argv, commands={command: run}) == 0
    monkeypatch.setenv("GH_RUNNER_STATE_DIR", str(tmp_path / "from-env"))
    assert main([command, cases], commands={command: run}) == 0
    assert seen == [None, None, tmp_path / "from-flag", tmp_path / "from-file", tmp_path / "from-env"]


def test_a_daemon_option_on_images_is_a_usage_error(tmp_path: Path) -> None:
    out = run_cli(tmp_path, "images", "--drain-grace", "5", "--images-dir", str(tmp_path / "img"))
    assert out.returncode == 2 and "unrecognized arguments: --drain-grace" in out.stderr


def test_bad_config_is_refused_with_the_key_and_what_is_allowed(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("server: ws://127.0.0.1:1\nslots: 2\nslotz: 3\n")
    out = run_cli(tmp_path, "--config", str(cfg))
    assert out.returncode == 2
    assert "slotz: unknown key; allowed keys:" in out.stderr and "slots" in out.stderr
    out = run_cli(tmp_path, "--server", "ws://127.0.0.1:1", "--slots", "zero")
    assert out.returncode == 2 and "slots" in out.stderr
    out = run_cli(tmp_path, "--server", "ws://10.1.2.3:1")
    assert out.returncode == 2 and "--insecure" in out.stderr
    assert Peer.token not in out.stderr + out.stdout


def test_a_missing_images_dir_is_a_configuration_error(tmp_path: Path) -> None:
    out = run_cli(tmp_path, "images", "--images-dir", str(tmp_path / "nowhere"))
    assert out.returncode == 2, out
    assert f"images dir {tmp_path / 'nowhere'} does not exist" in out.stderr


def test_images_lists_versions_and_checksums(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    out = run_cli(tmp_path, "images", "--images-dir", str(tmp_path / "img"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["NAME", "OS", "VERSION", "CHECKSUM"]
    assert lines[1].split() == ["linux-tiny", "linux", "2026.11.1", "sha256:" + "ab" * 32]
    data = json.loads(run_cli(tmp_path, "images", "--json", "--images-dir", str(tmp_path / "img")).stdout)
    assert data["images"][0]["checksum"] == "sha256:" + "ab" * 32


def test_local_help(tmp_path: Path) -> None:
    out = run_cli(tmp_path, "local", "--help")
    assert out.returncode == 0 and "CASES" in out.stdout and "--agents" in out.stdout and "--repeat" in out.stdout


@pytest.fixture
async def spawn(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    procs: list[asyncio.subprocess.Process] = []

    async def start(peer: Peer, *args: str, delay: str = "0.2") -> asyncio.subprocess.Process:
        p = await asyncio.create_subprocess_exec(
            *GH_RUNNER, "--server", peer.url, "--name", "cli-runner", "--slots", "2",
            "--state-dir", str(tmp_path / "state"), "--images-dir", str(tmp_path / "img"),
            "--log-format", "json", *args,
            env=_env(tmp_path, GH_TEST_PROVIDER_DELAY=delay),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.returncode is None:
            p.kill()
            await p.wait()


async def _exit_code(p: asyncio.subprocess.Process, timeout: float = 90) -> tuple[int, str]:
    _out, err = await asyncio.wait_for(p.communicate(), timeout)
    assert p.returncode is not None
    return p.returncode, err.decode()


async def test_sigterm_drains_an_attempt_in_flight_then_exits_0(
        peer: Peer, spawn: Any, tmp_path: Path) -> None:
    p = await spawn(peer, "--drain-grace", "120")
    await peer.wait_type("hello", timeout=60)
    await peer.send(make_lease("at_cli1", limits={"minutes": 5}))
    await peer.wait_type("lease_accept")
    await peer.wait_type("attempt_status", where=lambda m: m.phase == "task", timeout=60)
    p.send_signal(signal.SIGTERM)
    await peer.wait_type("heartbeat", where=lambda m: m.draining is True)
    await peer.send(make_lease("at_cli2"))
    refuse = await peer.wait_type("lease_refuse")
    assert refuse.reason.startswith("draining")
    assert p.returncode is None
    await peer.send(TaskEnd(attempt_id="at_cli1", answer="fixed"))
    code, err = await _exit_code(p)
    assert code == 0, err
    res = peer.applied["at_cli1"]
    assert res.outcome == "passed", res
    assert Journal(tmp_path / "state").pending_results() == []
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    # Every line about the attempt carries its id, wherever it was logged from (daemon, attempt module).
    about = [ln for ln in lines if ln["event"] in ("lease accepted", "attempt started", "phase", "attempt finished",
                                                   "result journaled, sending")]
    assert {ln["event"] for ln in about} >= {"lease accepted", "phase", "result journaled, sending"}
    assert all(ln.get("attempt_id") == "at_cli1" for ln in about), about
    assert Peer.token not in err
    provider = json.loads((tmp_path / "provider.json").read_text())
    assert provider["existing"] == []


async def test_second_signal_forces_and_reports_the_attempt(peer: Peer, spawn: Any, tmp_path: Path) -> None:
    p = await spawn(peer, "--drain-grace", "300")
    await peer.wait_type("hello", timeout=60)
    await peer.send(make_lease("at_cli3", limits={"minutes": 5}))
    await peer.wait_type("attempt_status", where=lambda m: m.phase == "task", timeout=60)
    p.send_signal(signal.SIGTERM)
    await peer.wait_type("heartbeat", where=lambda m: m.draining is True)
    p.send_signal(signal.SIGINT)
    code, err = await _exit_code(p)
    assert code == 1, err
    res = peer.applied.get("at_cli3") or Journal(tmp_path / "state").pending_results()[0]
    assert res.outcome == "error" and "forced to stop" in (res.error or "")


async def test_kill_9_then_restart_reports_the_interrupted_attempt_and_reaps_it(
        peer: Peer, spawn: Any, tmp_path: Path) -> None:
    p = await spawn(peer)
    await peer.wait_type("hello", timeout=60)
    await peer.send(make_lease("at_cli9", limits={"minutes": 5}))
    await peer.wait_type("attempt_status", where=lambda m: m.phase == "task", timeout=60)
    p.kill()
    await p.wait()
    assert json.loads((tmp_path / "provider.json").read_text())["existing"] == ["at_cli9"]

    start = len(peer.received)
    p2 = await spawn(peer)
    hello = await peer.wait_type("hello", start=start, timeout=60)
    assert hello.in_flight == []
    res = (await peer.wait_type("attempt_result", start=start)).result
    assert res.attempt_id == "at_cli9" and res.outcome == "error"
    assert "interrupted" in (res.error or "") and "task" in (res.error or "")
    provider = json.loads((tmp_path / "provider.json").read_text())
    assert provider["existing"] == []
    assert {"keep": [], "reaped": ["at_cli9"]} in provider["reap_calls"]
    await peer.wait_until(lambda: Journal(tmp_path / "state").pending_results() == [])
    p2.send_signal(signal.SIGTERM)
    code, err = await _exit_code(p2)
    assert code == 0, err


API_KEY = "gh_live_" + "k" * 40  # an API key pasted where the runner token goes


async def _refused_runner(tmp_path: Path, peer: Peer, *args: str, tty: bool) -> tuple[int | None, str]:
    """The real console script against a server that refuses its token; stderr on a terminal when
    `tty` (a runner started by hand). Returns (exit code or None if still running after 20 s, stderr)."""
    import pty

    env = _env(tmp_path, GH_RUNNER_TOKEN=API_KEY)
    env.pop("INVOCATION_ID", None)
    env.pop("NOTIFY_SOCKET", None)
    master, slave = pty.openpty() if tty else os.pipe()
    p = await asyncio.create_subprocess_exec(
        *GH_RUNNER, "--server", peer.url, "--name", "cli-runner", "--state-dir", str(tmp_path / "state"),
        "--images-dir", str(tmp_path / "img"), *args, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's last writer is gone
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = asyncio.get_running_loop().run_in_executor(None, read)
    try:
        deadline = time.monotonic() + 60
        # A poll with a deadline: the peer counts handshakes but has no event for them.
        while peer.handshakes == 0 and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        assert peer.handshakes >= 1, "the runner never dialled"
        try:
            code: int | None = await asyncio.wait_for(p.wait(), 20)
        except TimeoutError:
            code = None
            p.send_signal(signal.SIGTERM)
            await asyncio.wait_for(p.wait(), 60)
    finally:
        if p.returncode is None:
            p.kill()
            await p.wait()
        await asyncio.wait_for(reader, 30)
        os.close(master)
    return code, b"".join(chunks).decode(errors="replace")


async def test_a_refused_token_ends_a_runner_started_by_hand_with_a_hint(tmp_path: Path) -> None:
    peer = Peer(http_status=401)
    await peer.start()
    try:
        code, err = await _refused_runner(tmp_path, peer, tty=True)
    finally:
        await peer.stop()
    assert code == 2, err
    assert "server refused the runner token (HTTP 401)" in err
    assert "this is an API key" in err and "not a runner token, gh_rn_..." in err
    assert "gh-server runners create NAME" in err
    assert API_KEY not in err  # a secret, even a wrong one, reaches no log


async def test_a_refused_token_is_retried_by_a_service(tmp_path: Path) -> None:
    peer = Peer(http_status=401)
    await peer.start()
    try:
        code, err = await _refused_runner(tmp_path, peer, tty=False)  # no terminal: a service
        assert code is None, err  # still running: it retries every revoked_retry seconds
        assert "retrying only every 600 s" in err and "this is an API key" in err
        code, err = await _refused_runner(tmp_path, peer, "--on-token-refused", "exit", tty=False)
        assert code == 2, err
    finally:
        await peer.stop()


async def test_a_runner_without_a_name_takes_the_one_it_was_registered_with(tmp_path: Path) -> None:
    import socket

    peer = Peer(name="lab-1")
    await peer.start()
    procs: list[asyncio.subprocess.Process] = []

    async def start() -> asyncio.subprocess.Process:
        p = await asyncio.create_subprocess_exec(
            *GH_RUNNER, "--server", peer.url, "--state-dir", str(tmp_path / "state"),
            "--images-dir", str(tmp_path / "img"), "--log-format", "json", env=_env(tmp_path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        procs.append(p)
        return p

    try:
        p = await start()
        first = await peer.wait_type("hello", timeout=60)
        assert first.name == socket.gethostname()  # not told any name: its hostname, until the welcome
        second = await peer.wait_type("hello", timeout=60, where=lambda m: m.name == "lab-1")
        assert second.name == "lab-1"
        assert (tmp_path / "state" / "registered-name").read_text().strip() == "lab-1"
        p.send_signal(signal.SIGTERM)
        code, err = await _exit_code(p)
        assert code == 0, err
        lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
        starts = [i for i, ln in enumerate(lines) if ln["event"] == "runner starting"]
        assert len(starts) == 2, [ln["event"] for ln in lines]
        after = lines[starts[1]:]  # the second start, under the registered name
        runners = {ln.get("runner") for ln in after if ln.get("runner")}
        assert runners == {"lab-1"}, runners  # what it logs is its registered name
        # Started again, it is lab-1 from the first moment (its machines are reaped and named under it).
        hellos = sum(1 for r in peer.received if getattr(r.msg, "type", None) == "hello")
        p = await start()
        again = await peer.wait_for(lambda r: getattr(r.msg, "type", None) == "hello", timeout=60, start=len(
            peer.received))
        assert again.msg.name == "lab-1" and hellos == 2
        p.send_signal(signal.SIGTERM)
        code, err = await _exit_code(p)
        assert code == 0, err
        assert "restarting under it" not in err
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
        await peer.stop()


@pytest.mark.parametrize(("migrate", "expected"), [(True, "SIGUSR1"), (False, "SIGTERM")])
def test_drain_signals_the_daemon_of_the_state_dir(tmp_path: Path, migrate: bool, expected: str) -> None:
    """`gh-runner drain [--migrate]` finds the daemon by the pid file it keeps in its state dir (gh_runner/daemon.py)
    and sends it SIGUSR1 (hand the attempts off first) or SIGTERM (a plain drain)."""
    state = tmp_path / "state"
    state.mkdir()
    assert run_cli(tmp_path, "drain", "--state-dir", str(state)).returncode == 1  # no daemon: said, not a traceback
    got = tmp_path / "signal"
    child = subprocess.Popen([sys.executable, "-c", (
        "import signal, sys, time\n"
        "def on(sig, _f):\n"
        f"    open({str(got)!r}, 'w').write(signal.Signals(sig).name); sys.exit(0)\n"
        "signal.signal(signal.SIGUSR1, on); signal.signal(signal.SIGTERM, on)\n"
        f"open({str(state / 'gh-runner.pid')!r}, 'w').write('%d\\n' % __import__('os').getpid())\n"
        "time.sleep(60)\n")])
    try:
        deadline = time.monotonic() + 30
        while not (state / "gh-runner.pid").exists():
            assert time.monotonic() < deadline, "the stand-in daemon never wrote its pid file"
            time.sleep(0.05)
        out = run_cli(tmp_path, "drain", *(["--migrate"] if migrate else []), "--state-dir", str(state))
        assert out.returncode == 0 and "draining" in out.stdout, out
        assert child.wait(timeout=30) == 0 and got.read_text() == expected
    finally:
        child.kill()
    gone = run_cli(tmp_path, "drain", "--state-dir", str(state))  # its pid file left behind: not running, said so
    assert gone.returncode == 1 and "is not running" in gone.stderr, gone
