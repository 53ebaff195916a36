"""The bad hour, on real machines: inject each fault of tests/e2e/faults.py into a real run and say, per fault,
whether what happened is what the documentation promises.

Each fault gets a fresh scenario (tests/e2e/faults.py's `Stack`, the one the fault tests use): a
real gh-server (SQLite) and a real gh-runner (2 slots, the linux-tiny guest under QEMU), one case run
against the built-in `reference` agent with 2 tries. The fault is injected when the runner's log says
an attempt entered the fault's phase. Printed per fault: what the documentation promises, the outcome
of every attempt (retries included), the retries, each try's verdict, how many attempts were scored
against the agent (must be 0), how long the run took, what was left behind (gh- domains of this
runner, its machine files, in-flight records, temp files) and whether that is "as documented":

- a fault of ours (machine, hypervisor, runner, server, link, disk, guest agent) is never a verdict
  against the agent: the hit attempt is `error`, retried, and every try ends with the right
  verdict (`passed` for `reference`); nothing is left behind;
- a check that loops is our error, stopped at the case's `limits.minutes`, each try.

    .venv/bin/python bench/faults.py                # every fault (about 45 min on 2 TCG cores; libvirtd last)
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
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "tests"))  # as pytest has it: the test kit

from kit.scratch import scratch_dir

from tests.e2e import faults
from tests.e2e.faults import Stack, marker_case

IMAGES = Path(os.environ.get("GH_IMAGES_DIR", "/var/tmp/gh-runner/images"))

CASE = marker_case("FAULT-01")
LOOPING = {**CASE, "key": "FAULT-LOOP", "name": "A check that loops after the task", "limits": {"minutes": 1},
           "success": {"check_script": 'if [ "$GH_CHECK_PHASE" = before ]; then echo False; exit 0; fi\n'
                                       "while true; do sleep 1; done"}}
PASSED = "no verdict against the agent: the hit attempt our error (retried) or unharmed; every try passed"
LOOP_PROMISE = "every attempt error (check stopped at limits.minutes), retried; no verdict"


@dataclass
class Fault:
    name: str
    phase: str  # injected when an attempt enters this phase (the runner's "phase" log line)
    inject: Callable[[Stack, str], str | None]  # (the stack, the attempt hit) -> a note
    case: dict[str, Any] = field(default_factory=lambda: CASE)
    expect_verdict: str = "passed"  # every try's final outcome, as documented
    promise: str = PASSED
    small_disk: bool = False


# -- injectors: each acts on the stack's own processes, domains and port -----------------------------


def domain(stack: Stack, attempt_id: str) -> str:
    return f"gh-{stack.name}-{attempt_id}"


def kill_qemu(stack: Stack, attempt_id: str) -> None:
    faults.kill_qemu(domain(stack, attempt_id))


def destroy_domain(stack: Stack, attempt_id: str) -> None:
    faults.destroy_domain(domain(stack, attempt_id))


def restart_libvirtd(stack: Stack, attempt_id: str) -> None:
    faults.restart_libvirtd(4.0)


def stop_runner_90s(stack: Stack, attempt_id: str) -> None:
    assert stack.runner is not None
    with faults.stopped(stack.runner.proc.pid):
        time.sleep(90)  # the fault is the duration: past dead_after (45 s), within the grace after it


def kill_runner(stack: Stack, attempt_id: str) -> None:
    assert stack.runner is not None
    stack.runner.kill()
    stack.start_runner()


def kill_server(stack: Stack, attempt_id: str) -> None:
    stack.server.kill()
    time.sleep(3)  # the fault is the duration
    stack.server.start()


def cut_link(stack: Stack, attempt_id: str) -> None:
    """60 s without the link: past the dead-peer bound on both sides."""
    with faults.link_cut(stack.server.port):
        time.sleep(60)


def fill_disk(stack: Stack, attempt_id: str) -> str:
    """The runner's small tmpfs full to the last byte for 45 s, from the hit attempt's setup: its
    scripts, its guest's writes, its result's journal entry and the next leases all meet it."""
    with faults.disk_filled(stack.state.parent):
        free = shutil.disk_usage(stack.state).free
        time.sleep(45)
    return f"filled: {free // 1024} KiB free for 45 s"


def kill_guest_agent(stack: Stack, attempt_id: str) -> None:
    faults.guest_exec(domain(stack, attempt_id), "sleep 0.2; kill -9 $(pidof qemu-ga)")


def stop_guest_agent(stack: Stack, attempt_id: str) -> None:
    faults.guest_exec(domain(stack, attempt_id), "sleep 0.2; kill -STOP $(pidof qemu-ga)")


def nothing(stack: Stack, attempt_id: str) -> None:
    return None


# The libvirtd restart is last: it disturbs every VM of the host, and runs once.
FAULTS = [
    Fault("qemu_killed_ready", "ready", kill_qemu),
    Fault("qemu_killed_setup", "setup", kill_qemu),
    Fault("qemu_killed_task", "task", kill_qemu),
    Fault("qemu_killed_check_after", "check_after", kill_qemu),
    Fault("domain_destroyed", "task", destroy_domain),
    Fault("runner_stopped_90s", "task", stop_runner_90s),
    Fault("runner_killed", "task", kill_runner),
    Fault("server_killed", "first_screen", kill_server),
    Fault("link_cut", "first_screen", cut_link),
    Fault("disk_full", "setup", fill_disk, small_disk=True),
    Fault("guest_agent_killed", "task", kill_guest_agent),
    Fault("guest_agent_stopped", "task", stop_guest_agent),
    Fault("looping_check", "check_after", nothing, case=LOOPING, expect_verdict="error", promise=LOOP_PROMISE),
    Fault("libvirtd_restart", "task", restart_libvirtd),
]


# -- one scenario ----------------------------------------------------------------------------------


@dataclass
class Row:
    fault: str
    promise: str
    outcomes: list[str]
    retries: int
    verdicts: list[str]
    against_agent: int  # attempts scored `failed`: `reference` passes this case whenever it runs
    seconds: float
    leaks: list[str]
    problems: list[str]
    notes: list[str]

    @property
    def as_documented(self) -> bool:
        return not self.problems


def run_fault(fault: Fault) -> Row:
    started = time.monotonic()
    notes: list[str] = []
    problems: list[str] = []
    with scratch_dir(f"gh-faults-{fault.name}-") as work:
        try:
            disk = work / "disk"
            with (faults.small_tmpfs(disk, "1200m") if fault.small_disk else _plain_dir(disk)), \
                    Stack(work, "flt", only_linux_tiny(work), slots=2, server_settings={"runner_grace_seconds": 60},
                          state=disk / "state") as stack:
                try:
                    run = stack.run([fault.case], repeat=2, name=fault.name)
                    hit = stack.wait_phase(fault.phase)["attempt_id"]
                    said = fault.inject(stack, hit)
                    if said:
                        notes.append(said)
                    done, attempts = stack.finish(run, timeout=1500)
                    stack.stop_runner()
                    leaks = faults.leftovers(stack.name, stack.state)
                finally:
                    if fault.inject is restart_libvirtd:
                        faults.libvirt_up()  # whatever happened, libvirtd runs again
        except Exception as e:
            problems.append(f"scenario failed: {type(e).__name__}: {str(e)[:300]}")
            return Row(fault.name, fault.promise, [], 0, [], 0, time.monotonic() - started, [], problems, notes)

    outcomes = [f"{a['outcome']}{'(retry)' if a.get('retry_of') else ''}" for a in attempts]
    verdicts = [str(a["outcome"]) for a in attempts if a.get("is_last", True)]
    against = sum(1 for a in attempts if a["outcome"] == "failed")
    if done["status"] != "completed":
        problems.append(f"run {done['status']}")
    if any(v != fault.expect_verdict for v in verdicts):
        problems.append(f"verdicts {verdicts}, documented {fault.expect_verdict}")
    if against:
        problems.append(f"{against} attempt(s) scored failed against the agent")
    if leaks or stack.left:
        problems.append(f"left behind: {(leaks + stack.left)[:4]}")
    hit_row = next((a for a in attempts if a["attempt_id"] == hit), None)
    if hit_row is not None:
        notes.append(f"hit: {hit_row['outcome']} {' / '.join(str(hit_row.get('error') or '').splitlines())[:110]}")
    return Row(fault.name, fault.promise, outcomes, sum(1 for a in attempts if a.get("retry_of")), verdicts,
               against, time.monotonic() - started, leaks, problems, notes)


def only_linux_tiny(work: Path) -> Path:
    """An images dir with linux-tiny alone (a link to it): the runner advertises, warms and pools
    every image of its dir, and a desktop image there would boot beside each scenario."""
    d = work / "images"
    d.mkdir(exist_ok=True)
    (d / "linux-tiny").symlink_to(IMAGES / "linux-tiny")
    return d


@contextlib.contextmanager
def _plain_dir(d: Path) -> Iterator[Path]:
    d.mkdir(mode=0o755, exist_ok=True)
    yield d


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
        print(f"   {row.seconds:.0f} s: {','.join(row.outcomes)}; "
              f"{'as documented' if row.as_documented else 'NOT as documented: ' + '; '.join(row.problems)}",
              flush=True)
        for n in row.notes:
            print(f"   {n}", flush=True)
    print()
    print("| fault | documented | attempts (outcome) | retries | verdicts | against agent | leaks | s | result |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        result = "as documented" if r.as_documented else "NOT: " + "; ".join(r.problems)
        print(f"| {r.fault} | {r.promise} | {', '.join(r.outcomes)} | {r.retries} | {', '.join(r.verdicts)} | "
              f"{r.against_agent} | {len(r.leaks) or 'none'} | {r.seconds:.0f} | {result} |")
    return 0 if all(r.as_documented for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
