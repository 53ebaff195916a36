"""The faults of a bad hour (a control plane gone, a libvirtd restart), injected for real, and the stack
they are injected into: one home for the fault tests (tests/e2e/test_outage.py, test_hypervisor_restart.py)
and bench/faults.py.

`Stack` is a real gh-server on a port that survives its restart, one real gh-runner registered with
it, and an SDK client; closing it stops all three and destroys whatever gh- domain of *its* runner is
left (after the caller has looked: `Stack.left` says what was). The injectors act on one process,
domain or port each and always undo themselves in `finally`, because this host is shared:

- `restart_libvirtd` starts libvirtd again the way scripts/libvirt-up.sh does, even when the
  caller fails, and only once the killed daemon is gone (a daemon still exiting would make
  libvirt-up.sh see it running, start nothing, and leave the host without libvirt);
- `link_cut` drops packets in an nftables table of its own matching only the one port;
- `small_tmpfs` mounts under the caller's temp dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from guidinghand import Eager
from kit.libvirt import LIBVIRT_URI, domains

from .procs import RestartableServer, Runner, wait_for_log

REPO = Path(__file__).resolve().parents[2]


def marker_case(key: str, *, fix: str | None = None, minutes: int = 2, image: str = "linux-tiny",
                marker: str = "/root/fixed") -> dict[str, Any]:
    """The fault tests' case: `reference` passes it (its fix, by default `touch marker`, makes the marker),
    `noop` fails it. On another image the marker goes where its scripts may write (linux-desktop's run as
    its signed-in user: /home/user/fixed)."""
    return {
        "key": key, "name": "Marker file", "prompt": f"Please create {marker}.",
        "start_state": image, "setup_script": f"rm -f {marker}",
        "success": {"check_script": f"[ -f {marker} ] && echo True || echo False"},
        "metadata": {"reference_fix": fix or f"touch {marker}", "reference_answer": "done"},
        "limits": {"minutes": minutes},
    }


def phase_entered(phase: str, attempt_id: str | None = None) -> Any:
    """A `wait_for_log` predicate: the runner's log line saying an attempt entered `phase`."""
    def pred(e: dict[str, Any]) -> bool:
        aid = str(e.get("attempt_id", ""))
        return (e.get("event") == "phase" and e.get("phase") == phase and aid.startswith("at_")
                and (attempt_id is None or aid == attempt_id))
    return pred


class Stack:
    """A real gh-server (SQLite, its data under `work`) and one real gh-runner registered with it."""

    def __init__(self, work: Path, name_prefix: str, images_dir: Path, *, slots: int,
                 server_settings: dict[str, Any], state: Path | None = None,
                 runner_config: Path | None = None) -> None:
        self.work, self.images_dir, self.slots = work, images_dir, slots
        self.name = name_prefix + secrets.token_hex(3)
        config = work / "server.yaml"
        config.write_text(yaml.safe_dump(server_settings))
        self.server = RestartableServer(work / "server", config, work / "gh-server.log")
        self.state = state or work / "runner-state"
        self.state.mkdir(mode=0o755, exist_ok=True)
        self.client: Eager | None = None
        self.runner: Runner | None = None
        self.token = ""
        self.left: list[str] = []
        self.runner_config = runner_config  # a gh-runner config file (a registry, say)

    def __enter__(self) -> Stack:
        try:
            self.server.start()
            self.client = Eager(api_key=self.server.api_key, base_url=self.server.base_url, timeout=60)
            self.token = self.client.runners.create(self.name)["token"]
            self.start_runner()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def api(self) -> Eager:
        assert self.client is not None, "the stack is not started"
        return self.client

    @property
    def runner_log(self) -> Path:
        assert self.runner is not None
        return Path(self.runner.log.name)

    def start_runner(self) -> None:
        self.runner = Runner(self.server.base_url, self.token, self.name, self.images_dir, self.state,
                             slots=self.slots, config=self.runner_config)

    def run(self, cases: list[dict[str, Any]], *, repeat: int, name: str, agents: tuple[str, ...] = ("reference",)
            ) -> str:
        ids = [c["test_case_id"] for c in self.api.test_cases.batch(cases)["data"]]  # type: ignore[arg-type]
        return str(self.api.test_runs.create(test_case_ids=ids, agents=list(agents), repeat=repeat,
                                             name=name)["test_run_id"])

    def wait_phase(self, phase: str, *, attempt_id: str | None = None, timeout: float = 900) -> dict[str, Any]:
        return wait_for_log(self.runner_log, phase_entered(phase, attempt_id), timeout=timeout)

    def finish(self, run_id: str, timeout: float = 1200) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The run once it ends, and every attempt of it (retries included)."""
        done = dict(self.api.test_runs.wait(run_id, timeout=timeout, poll_interval=2))
        return done, [dict(a) for a in self.api.test_runs.list_all_attempts(run_id)]

    def stop_runner(self, timeout: float = 180) -> None:
        if self.runner is not None:
            self.runner.stop(timeout=timeout)

    def close(self) -> None:
        """Stop everything; `left` keeps the runner's domains found still there (then destroyed)."""
        self.stop_runner()
        if self.client is not None:
            self.client.close()
            self.client = None
        self.server.stop()
        self.left = domains(f"gh-{self.name}-")
        for d in self.left:
            subprocess.run(["virsh", "-c", LIBVIRT_URI, "destroy", d], capture_output=True, timeout=60)


def leftovers(name: str, state: Path) -> list[str]:
    """What a stopped runner left: its gh- domains, machine files (overlays, consoles), in-flight
    records and half-written temp files in its state dir."""
    found = domains(f"gh-{name}-")
    for sub in ("machines", "journal/inflight"):
        d = state / sub
        if d.exists():
            found += [str(p.relative_to(state)) for p in d.rglob("*") if p.is_file()]
    found += [str(p.relative_to(state)) for p in state.rglob("*")
              if p.is_file() and (p.name.endswith(".tmp") or p.name.startswith(".tmp"))]
    return sorted(set(found))


def log_events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_bytes().splitlines():
        with contextlib.suppress(ValueError):
            e = json.loads(line)
            if isinstance(e, dict):
                out.append(e)
    return out


# -- the hypervisor ----------------------------------------------------------------------------------


def libvirt_up() -> None:
    subprocess.run([str(REPO / "scripts" / "libvirt-up.sh")], check=True, capture_output=True, timeout=120)


def restart_libvirtd(down_for: float) -> None:
    """SIGTERM libvirtd, keep it down `down_for` seconds, start it again as scripts/libvirt-up.sh does
    (always). Its domains keep running: QEMU is not libvirtd's child."""
    try:
        out = subprocess.run(["pgrep", "-x", "libvirtd"], capture_output=True, text=True, timeout=10)
        pids = [int(p) for p in out.stdout.split()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        time.sleep(down_for)
        deadline = time.monotonic() + 60
        while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        libvirt_up()


def qemu_pid(domain: str) -> int:
    out = subprocess.run(["pgrep", "-f", f"guest={domain},"], capture_output=True, text=True, timeout=10)
    pids = [int(p) for p in out.stdout.split()]
    if not pids:
        raise RuntimeError(f"no QEMU process for {domain}")
    return pids[0]


def kill_qemu(domain: str) -> None:
    os.kill(qemu_pid(domain), signal.SIGKILL)


def destroy_domain(domain: str) -> None:
    subprocess.run(["virsh", "-c", LIBVIRT_URI, "destroy", domain], check=True, capture_output=True, timeout=60)


def guest_exec(domain: str, script: str) -> None:
    """Start `script` in the guest through its agent (not waited for)."""
    cmd = {"execute": "guest-exec", "arguments": {"path": "/bin/sh", "arg": ["-c", script]}}
    subprocess.run(["virsh", "-c", LIBVIRT_URI, "qemu-agent-command", domain, json.dumps(cmd)],
                   check=True, capture_output=True, timeout=60)


# -- processes, the link, the disk -------------------------------------------------------------------


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The process frozen (SIGSTOP) for the block, and let go again (SIGCONT) whatever happens."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def link_cut(port: int) -> Iterator[None]:
    """Every packet to and from `port` on loopback dropped for the block, by an nftables table of our
    own that matches only that port (deleted in finally)."""
    table = f"gh_faults_{secrets.token_hex(3)}"
    script = (f"add table inet {table}\n"
              f"add chain inet {table} out {{ type filter hook output priority -10 ; }}\n"
              f"add rule inet {table} out oifname lo tcp dport {port} drop\n"
              f"add rule inet {table} out oifname lo tcp sport {port} drop\n")
    try:
        subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True, capture_output=True, timeout=30)
        yield
    finally:
        subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True, timeout=30)


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted on `where` (made, and unmounted in finally)."""
    where.mkdir(mode=0o755, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
                   check=True, capture_output=True, timeout=30)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


@contextlib.contextmanager
def disk_filled(directory: Path) -> Iterator[None]:
    """The filesystem of `directory` filled to the last byte for the block, then freed. Unbuffered
    writes, so ENOSPC comes from a write and not from close."""
    filler = directory / "filler"
    try:
        with contextlib.suppress(OSError), filler.open("wb", buffering=0) as f:
            while True:
                f.write(b"\0" * (1 << 16))
        yield
    finally:
        filler.unlink(missing_ok=True)
