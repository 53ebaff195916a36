"""The bad hour, on real machines: inject each fault of issue 27 into a real run and say, per fault,
whether what happened is what the documentation promises.

Each fault gets a fresh scenario: a real gh-server (SQLite) and a real gh-runner (2 slots, the
linux-tiny guest under QEMU), one case run against the built-in `reference` agent with 2 tries. The
fault is injected when the runner's log says an attempt entered the fault's phase. Printed per
fault: the outcome of every attempt (retries included), the verdict of each try, how long the run
took, what was left behind (gh- domains of this runner, files under its machines dir) and whether
that is "as documented":

- a fault of ours (machine, hypervisor, runner, server, link, disk, guest agent) is never a verdict
  against the agent: the hit attempt is `error`, retried, and every try ends with the right
  verdict (`passed` for `reference`); nothing is left behind;
- a check that loops is our error, stopped at the case's `limits.minutes`, each try.

    .venv/bin/python bench/faults.py                # every fault (about 40 min on 2 TCG cores)
    .venv/bin/python bench/faults.py --only server_killed,link_cut

Runs as root (nftables, tmpfs, libvirtd). SHARED HOSTS: the libvirtd restart disturbs every VM of
the host for a few seconds (it is restarted the way scripts/libvirt-up.sh starts it, always, even
when the scenario fails); nftables rules live in a table of this process's own and match only this
scenario's port; the small tmpfs is mounted under this scenario's temp dir. All are removed in
`finally`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml
from guidinghand import Eager

from tests.e2e.procs import RestartableServer, Runner, domains, wait_for_log

LIBVIRT_URI = "qemu:///system"
IMAGES = Path(os.environ.get("GH_IMAGES_DIR", "/var/tmp/gh-runner/images"))
REPO = Path(__file__).resolve().parent.parent

CASE: dict[str, Any] = {
    "key": "FAULT-01", "name": "Marker file", "prompt": "Please create /root/fixed.",
    "start_state": "linux-tiny", "setup_script": "rm -f /root/fixed",
    "success": {"check_script": "[ -f /root/fixed ] && echo True || echo False"},
    "metadata": {"reference_fix": "touch /root/fixed", "reference_answer": "done"},
    "limits": {"minutes": 2},
}
LOOPING = {**CASE, "key": "FAULT-LOOP", "name": "A check that loops after the task", "limits": {"minutes": 1},
           "success": {"check_script": 'if [ "$GH_CHECK_PHASE" = before ]; then echo False; exit 0; fi\n'
                                       "while true; do sleep 1; done"}}


@dataclass
class Ctx:
    """What an injector may act on."""

    work: Path
    server: RestartableServer
    runner: Runner
    name: str
    token: str
    state: Path
    attempt_id: str
    notes: list[str] = field(default_factory=list)
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    @property
    def domain(self) -> str:
        return f"gh-{self.name}-{self.attempt_id}"

    def restart_runner(self) -> None:
        self.runner = Runner(self.server.base_url, self.token, self.name, IMAGES, self.state, slots=2)


@dataclass
class Fault:
    name: str
    phase: str  # injected when an attempt enters this phase (the runner's "phase" log line)
    inject: Callable[[Ctx], None]
    case: dict[str, Any] = field(default_factory=lambda: CASE)
    expect_verdict: str = "passed"  # every try's final outcome, as documented
    small_disk: bool = False


# -- injectors -------------------------------------------------------------------------------------


def qemu_pid(domain: str) -> int:
    out = subprocess.run(["pgrep", "-f", f"guest={domain},"], capture_output=True, text=True, timeout=10)
    pids = [int(p) for p in out.stdout.split()]
    if not pids:
        raise RuntimeError(f"no QEMU process for {domain}")
    return pids[0]


def kill_qemu(ctx: Ctx) -> None:
    os.kill(qemu_pid(ctx.domain), signal.SIGKILL)


def destroy_domain(ctx: Ctx) -> None:
    subprocess.run(["virsh", "-c", LIBVIRT_URI, "destroy", ctx.domain], check=True, capture_output=True, timeout=60)


def libvirt_up() -> None:
    subprocess.run([str(REPO / "scripts" / "libvirt-up.sh")], check=True, capture_output=True, timeout=120)


def restart_libvirtd(ctx: Ctx) -> None:
    """Kill libvirtd, and start it again 4 s later the way scripts/libvirt-up.sh does (always)."""
    try:
        out = subprocess.run(["pgrep", "-x", "libvirtd"], capture_output=True, text=True, timeout=10)
        for pid in out.stdout.split():
            os.kill(int(pid), signal.SIGTERM)
        time.sleep(4)
    finally:
        libvirt_up()


def stop_runner_90s(ctx: Ctx) -> None:
    assert ctx.runner.proc.pid
    os.kill(ctx.runner.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(90)
    finally:
        os.kill(ctx.runner.proc.pid, signal.SIGCONT)


def kill_runner(ctx: Ctx) -> None:
    ctx.runner.kill()
    ctx.restart_runner()


def kill_server(ctx: Ctx) -> None:
    ctx.server.kill()
    time.sleep(3)
    ctx.server.start()


def cut_link(ctx: Ctx) -> None:
    """Drop every packet to and from the server's port on loopback for 60 s (past the dead-peer bound),
    in an nftables table of our own that matches only that port."""
    table = f"gh_faults_{secrets.token_hex(3)}"
    port = ctx.server.port
    script = (f"add table inet {table}\n"
              f"add chain inet {table} out {{ type filter hook output priority -10 ; }}\n"
              f"add rule inet {table} out oifname lo tcp dport {port} drop\n"
              f"add rule inet {table} out oifname lo tcp sport {port} drop\n")

    def drop() -> None:
        subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True, timeout=30)

    ctx.cleanups.append(drop)
    subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True, capture_output=True, timeout=30)
    try:
        time.sleep(60)
    finally:
        drop()


def fill_disk(ctx: Ctx) -> None:
    """Fill the runner's small tmpfs to the last byte for 20 s, then free it."""
    filler = ctx.state.parent / "filler"
    with contextlib.suppress(OSError), filler.open("wb", buffering=0) as f:
        while True:
            f.write(b"\0" * (1 << 16))
    try:
        time.sleep(20)
    finally:
        filler.unlink(missing_ok=True)


def guest_exec(domain: str, script: str) -> None:
    cmd = {"execute": "guest-exec", "arguments": {"path": "/bin/sh", "arg": ["-c", script]}}
    subprocess.run(["virsh", "-c", LIBVIRT_URI, "qemu-agent-command", domain, json.dumps(cmd)],
                   check=True, capture_output=True, timeout=60)


def kill_guest_agent(ctx: Ctx) -> None:
    guest_exec(ctx.domain, "sleep 0.2; kill -9 $(pidof qemu-ga)")


def stop_guest_agent(ctx: Ctx) -> None:
    guest_exec(ctx.domain, "sleep 0.2; kill -STOP $(pidof qemu-ga)")


def nothing(ctx: Ctx) -> None:
    return None


FAULTS = [
    Fault("qemu_killed_ready", "ready", kill_qemu),
    Fault("qemu_killed_setup", "setup", kill_qemu),
    Fault("qemu_killed_task", "task", kill_qemu),
    Fault("qemu_killed_check_after", "check_after", kill_qemu),
    Fault("domain_destroyed", "task", destroy_domain),
    Fault("libvirtd_restart", "task", restart_libvirtd),
    Fault("runner_stopped_90s", "task", stop_runner_90s),
    Fault("runner_killed", "task", kill_runner),
    Fault("server_killed", "first_screen", kill_server),
    Fault("link_cut", "first_screen", cut_link),
    Fault("disk_full", "task", fill_disk, small_disk=True),
    Fault("guest_agent_killed", "task", kill_guest_agent),
    Fault("guest_agent_stopped", "task", stop_guest_agent),
    Fault("looping_check", "check_after", nothing, case=LOOPING, expect_verdict="error"),
]


# -- one scenario ----------------------------------------------------------------------------------


@dataclass
class Row:
    fault: str
    outcomes: list[str]
    retries: int
    verdicts: list[str]
    seconds: float
    leaks: list[str]
    problems: list[str]
    notes: list[str]

    @property
    def as_documented(self) -> bool:
        return not self.problems


def leftovers(name: str, state: Path) -> list[str]:
    files = [str(p.relative_to(state)) for p in (state / "machines").rglob("*") if p.is_file()] \
        if (state / "machines").exists() else []
    return domains(f"gh-{name}-") + files


def run_fault(fault: Fault) -> Row:
    work = Path(tempfile.mkdtemp(prefix=f"gh-faults-{fault.name}-", dir="/var/tmp"))
    work.chmod(0o755)
    config = work / "server.yaml"
    config.write_text(yaml.safe_dump({"runner_grace_seconds": 60}))
    server = RestartableServer(work / "server", config, work / "gh-server.log")
    name = "flt" + secrets.token_hex(3)
    disk = work / "disk"
    disk.mkdir(mode=0o755)
    mounted = False
    ctx: Ctx | None = None
    client: Eager | None = None
    problems: list[str] = []
    started = time.monotonic()
    try:
        if fault.small_disk:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200m,mode=0755", "tmpfs", str(disk)],
                           check=True, timeout=30)
            mounted = True
        state = disk / "state"
        state.mkdir(mode=0o755)
        server.start()
        client = Eager(api_key=server.api_key, base_url=server.base_url, timeout=60)
        token = client.runners.create(name)["token"]
        runner = Runner(server.base_url, token, name, IMAGES, state, slots=2)
        log = Path(runner.log.name)
        case = client.test_cases.batch([fault.case])["data"][0]  # type: ignore[list-item]
        run = client.test_runs.create(test_case_ids=[case["test_case_id"]], agents=["reference"], repeat=2,
                                      name=fault.name)
        hit = wait_for_log(log, lambda e: e.get("event") == "phase" and e.get("phase") == fault.phase
                           and str(e.get("attempt_id", "")).startswith("at_"), timeout=900)
        ctx = Ctx(work, server, runner, name, token, state, hit["attempt_id"])
        injector = threading.Thread(target=fault.inject, args=(ctx,), daemon=True)
        injector.start()
        injector.join(timeout=300)
        done = dict(client.test_runs.wait(run["test_run_id"], timeout=1500, poll_interval=2))
        attempts = [dict(a) for a in client.test_runs.list_all_attempts(run["test_run_id"])]
        ctx.runner.stop(timeout=180)
        leaks = leftovers(name, state)
        outcomes = [f"{a['outcome']}{'(retry)' if a.get('retry_of') else ''}" for a in attempts]
        last = [a for a in attempts if a.get("is_last", True)]
        verdicts = [str(a["outcome"]) for a in last]
        if done["status"] != "completed":
            problems.append(f"run {done['status']}")
        if any(v != fault.expect_verdict for v in verdicts):
            problems.append(f"verdicts {verdicts}, documented {fault.expect_verdict}")
        if any(a["outcome"] == "failed" for a in attempts) and fault.expect_verdict != "failed":
            problems.append("an attempt was scored failed")
        if leaks:
            problems.append(f"left behind: {leaks[:4]}")
        hit_row = next((a for a in attempts if a["attempt_id"] == ctx.attempt_id), None)
        if hit_row is not None and hit_row["outcome"] == "error":
            ctx.notes.append(f"hit: {str(hit_row.get('error') or '')[:100]}")
        return Row(fault.name, outcomes, sum(1 for a in attempts if a.get("retry_of")), verdicts,
                   time.monotonic() - started, leaks, problems, ctx.notes)
    except Exception as e:
        problems.append(f"scenario failed: {type(e).__name__}: {str(e)[:200]}")
        return Row(fault.name, [], 0, [], time.monotonic() - started, [], problems, ctx.notes if ctx else [])
    finally:
        if ctx is not None:
            for cleanup in ctx.cleanups:
                cleanup()
            ctx.runner.stop(timeout=180)
        if fault.inject is restart_libvirtd:
            libvirt_up()  # whatever happened, libvirtd runs again
        if client is not None:
            client.close()
        server.stop()
        for d in domains(f"gh-{name}-"):
            subprocess.run(["virsh", "-c", LIBVIRT_URI, "destroy", d], capture_output=True, timeout=60)
        if mounted:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=30)
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated fault names (default: all)")
    args = ap.parse_args()
    chosen = [f for f in FAULTS if not args.only or f.name in args.only.split(",")]
    rows = []
    for fault in chosen:
        print(f"-- {fault.name} (injected at phase {fault.phase})", flush=True)
        row = run_fault(fault)
        rows.append(row)
        print(f"   {'as documented' if row.as_documented else 'NOT as documented: ' + '; '.join(row.problems)}",
              flush=True)
    print()
    print(f"{'fault':<26} {'attempts (outcome)':<44} {'retries':>7} {'verdicts':<18} {'s':>5}  result")
    for r in rows:
        print(f"{r.fault:<26} {','.join(r.outcomes)[:44]:<44} {r.retries:>7} {','.join(r.verdicts):<18} "
              f"{r.seconds:>5.0f}  {'as documented' if r.as_documented else 'NOT: ' + '; '.join(r.problems)}")
        for n in r.notes:
            print(f"{'':<28}{n}")
    return 0 if all(r.as_documented for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
