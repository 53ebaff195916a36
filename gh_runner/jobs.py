"""Start-state jobs on the runner: build, open, save, close, delete (docs/start-states.md).

A start state is a machine saved from an image or from another start state. The server sends a
`job`; this module does it with the provider and answers one `job_result`:

- build:  boot `source`, run the script (elevated), save as `version`, destroy the machine.
- open:   boot `source` and keep the machine for hand work; screen/input/exec reach it through
          `machine_request`s carrying its `start_state_id`.
- save:   keep the open machine's disk (and memory, for warm starts) as `version`, then close it.
- close:  discard the open machine.
- delete: remove a version's files (`version`), or every version held when `version` is None.

With a registry configured, every version a build or save keeps is pushed to it (gh_runner.library)
before the result is sent, and the result carries its reference (`registry_ref`).

A `build` holds one of the runner's slots while it runs, an `open` from its start until the save or
close of its machine (`slot_key`, `slots_freed_by`); the daemon keeps the count
(`gh_runner.admission.Slots`). Screen, input and exec on an open machine are answered by the same
server as an attempt's (`gh_runner.machine_requests`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import structlog
from pydantic import ConfigDict, Field

from gh_runner.config import Timeouts
from gh_runner.inventory import source_of
from gh_runner.library import Library
from gh_runner.machine_requests import MachineRequests, refuse
from gh_runner.outcome import tail
from gh_runner.registry import RegistryError
from gh_wire import protocol
from providers.base import Machine, MachineSource, Provider, ProviderError, ScriptResult

log = structlog.get_logger("gh_runner.jobs")


class JobTimeouts(Timeouts):
    """A job's bounds: an attempt's (the config's `timeouts`: machine, ready, screen, teardown), and a save's.

    Derived, not copied, so a job and an attempt boot, wait and tear down a machine within the same
    bounds: `JobTimeouts(**config.timeouts.model_dump())` carries the configured ones over."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    save: float = Field(default=600.0, gt=0, le=7200)  # keep the disk (and memory) as a version


def _source(ref: protocol.StartStateRef | None) -> MachineSource:
    if ref is None:
        raise ValueError("this job needs a source (an image or a start-state version)")
    return source_of(ref)


def _script_failure(res: ScriptResult, timeout: float) -> str | None:
    if res.timed_out:
        return f"script did not finish within {timeout:.0f} s; last output: {tail(res.stdout + res.stderr)!r}"
    if res.exit_code != 0:
        return f"script exited with {res.exit_code}; stderr: {tail(res.stderr)!r}; stdout: {tail(res.stdout)!r}"
    return None


JobDone = Callable[[protocol.Job, protocol.JobResult], Awaitable[None]]


class StartStateJobs:
    """Runs start-state jobs and keeps the machines of open start states."""

    def __init__(self, provider: Provider, timeouts: JobTimeouts | None = None,
                 library: Library | None = None) -> None:
        self._provider = provider
        self._library = library  # with a registry: every saved version is pushed to it
        self._t = timeouts or JobTimeouts()
        self._open: dict[str, Machine] = {}  # start_state_id -> its open machine
        # start_state_id -> set once its machine has booted (or failed to): a save or close that
        # arrives while it boots waits for it instead of missing it (and leaking the machine).
        self._booting: dict[str, asyncio.Event] = {}
        # start_state_id -> its machine while it boots: the status is `open` from the moment the job is
        # sent, and screen and input go through the hypervisor, so they work on the boot screen too.
        self._starting: dict[str, Machine] = {}
        self._made: dict[str, asyncio.Event] = {}  # set once create_machine returned (or failed)
        self._lock = asyncio.Lock()
        self._servers: dict[str, MachineRequests] = {}  # machine id -> its request server
        self._running: dict[str, asyncio.Task[None]] = {}  # job id -> the task running it (`start`)

    @property
    def machine_ids(self) -> set[str]:
        """Every machine the jobs hold: the open ones, and those of running jobs (named by the job id)."""
        return {m.machine_id for m in self._open.values()} | set(self._running)

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The jobs running now (`start`)."""
        return list(self._running.values())

    @staticmethod
    def slot_key(job: protocol.Job) -> str | None:
        """The slot this job takes as it starts, or None: a build holds one while it runs, an open
        one until its machine is saved or closed (the key is the start state's, so the save or
        close frees it); save, close and delete take none."""
        if job.op == "open":
            return f"job:{job.start_state_id}"
        if job.op == "build":
            return f"job:{job.job_id}"
        return None

    def slots_freed_by(self, job: protocol.Job) -> list[str]:
        """The slot keys free once `job` has run: a build's own; the start state's, unless its
        machine is open now (an open that succeeded keeps it)."""
        freed = [f"job:{job.job_id}"] if job.op == "build" else []
        if not self.is_open(job.start_state_id):
            freed.append(f"job:{job.start_state_id}")
        return freed

    def is_open(self, start_state_id: str) -> bool:
        return start_state_id in self._open

    async def open_machine(self, start_state_id: str, timeout: float) -> Machine | None:
        """The open machine of a start state, also while it boots (its screen is the boot screen, as
        `_machine_for` serves it); one still being made is waited for, up to `timeout` seconds."""
        made = self._made.get(start_state_id)
        if start_state_id not in self._open and made is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await made.wait()
        return self._open.get(start_state_id) or self._starting.get(start_state_id)

    def start(self, job: protocol.Job, done: JobDone) -> None:
        """Run `job` in its own task; `done(job, result)` is awaited with its result (never raises
        but CancelledError: a crash is a failed result)."""
        self.expect(job)
        task = asyncio.create_task(self._run_then(job, done), name=f"job-{job.job_id[:64]}")
        self._running[job.job_id] = task
        task.add_done_callback(lambda _t: self._running.pop(job.job_id, None))

    async def _run_then(self, job: protocol.Job, done: JobDone) -> None:
        try:
            result = await self.run(job)
        except Exception as e:
            log.exception("start-state job crashed", job_id=job.job_id)
            result = protocol.JobResult(job_id=job.job_id, ok=False, start_state_id=job.start_state_id,
                                        error=f"internal runner error: {type(e).__name__}")
        await done(job, result)

    def expect(self, job: protocol.Job) -> None:
        """Called as the job arrives, before its task runs: a screen or input request that reaches the
        runner right after an `open` waits for that machine instead of finding nothing."""
        if job.op == "open" and job.start_state_id not in self._open:
            self._booting.setdefault(job.start_state_id, asyncio.Event())
            self._made.setdefault(job.start_state_id, asyncio.Event())

    async def run(self, job: protocol.Job) -> protocol.JobResult:
        """Do one job. Never raises (except CancelledError): failures are a result with a reason."""
        bound = log.bind(job_id=job.job_id, start_state_id=job.start_state_id, op=job.op)
        started = time.monotonic()
        try:
            handler: Callable[[protocol.Job], Awaitable[protocol.JobResult]] = {
                "build": self._build,
                "open": self._open_machine,
                "save": self._save,
                "close": self._close,
                "delete": self._delete,
            }[job.op]
            result = await handler(job)
        except (ProviderError, ValueError, TimeoutError) as e:
            reason = str(e) or type(e).__name__
            bound.warning("start-state job failed", reason=reason)
            return protocol.JobResult(job_id=job.job_id, ok=False, error=f"{job.op}: {reason}",
                                      start_state_id=job.start_state_id)
        bound.info("start-state job done", ok=result.ok, seconds=round(time.monotonic() - started, 2))
        return result

    async def _boot(self, machine_id: str, source: MachineSource) -> Machine:
        machine = await self._provider.create_machine(machine_id, source, timeout=self._t.machine)
        try:
            await machine.wait_ready(self._t.ready)
        except BaseException:
            await self._destroy(machine)
            raise
        return machine

    async def _destroy(self, machine: Machine) -> None:
        self._servers.pop(machine.machine_id, None)
        try:
            async with asyncio.timeout(self._t.teardown):
                await machine.destroy()
        except (ProviderError, TimeoutError) as e:  # the reaper gets it later; say so
            log.warning("machine not destroyed; the reaper will retry", machine_id=machine.machine_id, reason=str(e))

    async def _build(self, job: protocol.Job) -> protocol.JobResult:
        if not job.script or job.version is None:
            raise ValueError("a build job needs a script and the version to save")
        machine = await self._boot(job.job_id, _source(job.source))
        try:
            res = await machine.run_script(job.script, timeout=job.script_timeout)
        except BaseException:
            await self._destroy(machine)
            raise
        why = _script_failure(res, job.script_timeout)
        if why is not None:
            await self._destroy(machine)
            return protocol.JobResult(job_id=job.job_id, ok=False, start_state_id=job.start_state_id, error=why)
        return await self._save_and_close(machine, job, job.version)

    async def _save_and_close(self, machine: Machine, job: protocol.Job, version: int) -> protocol.JobResult:
        """Keep the machine as `version`, then destroy it: a saved state is `ready`, not open."""
        try:
            async with asyncio.timeout(self._t.save):
                saved = await machine.save(job.start_state_id, version)
        finally:
            await self._destroy(machine)
        ref, push_error = await self._publish(job.start_state_id, saved.version)
        return protocol.JobResult(job_id=job.job_id, ok=True, start_state_id=job.start_state_id,
                                  version=saved.version, size_bytes=saved.size_bytes,
                                  registry_ref=ref, registry_error=push_error)

    async def _publish(self, start_state_id: str, version: int) -> tuple[str | None, str | None]:
        """Push the saved version to the registry; a failed push leaves the save standing (the version
        is still served here, only not elsewhere) and says why."""
        if self._library is None:
            return None, None
        try:
            return await self._library.publish(start_state_id, version), None
        except (RegistryError, ProviderError, TimeoutError, OSError) as e:
            reason = str(e) or type(e).__name__
            log.warning("saved start state not pushed to the registry", start_state_id=start_state_id,
                        version=version, reason=reason)
            return None, f"push to the registry failed: {reason}"

    async def _open_machine(self, job: protocol.Job) -> protocol.JobResult:
        ssid = job.start_state_id
        async with self._lock:
            if ssid in self._open:
                return protocol.JobResult(job_id=job.job_id, ok=True, start_state_id=ssid)
            booted = self._booting.setdefault(ssid, asyncio.Event())
            made = self._made.setdefault(ssid, asyncio.Event())
        try:
            try:
                machine = await self._provider.create_machine(job.job_id, _source(job.source), timeout=self._t.machine)
                self._starting[ssid] = machine
            finally:
                made.set()
            try:
                await machine.wait_ready(self._t.ready)
            except BaseException:
                await self._destroy(machine)
                raise
            async with self._lock:
                self._open[ssid] = machine
        finally:
            self._starting.pop(ssid, None)
            booted.set()
            if self._booting.get(ssid) is booted:
                del self._booting[ssid]
            if self._made.get(ssid) is made:
                del self._made[ssid]
        return protocol.JobResult(job_id=job.job_id, ok=True, start_state_id=ssid)

    async def _machine_for(self, req: protocol.MachineRequest) -> Machine | None:
        """The open machine a request is for; while it boots, screen and input get the booting machine
        (the hypervisor shows the boot screen), exec waits for its guest."""
        ssid = req.start_state_id or ""
        if ssid in self._open:
            return self._open[ssid]
        made = self._made.get(ssid)
        if made is None:
            return None
        if req.op in ("screen", "input"):
            async with asyncio.timeout(self._t.machine):
                await made.wait()
            return self._starting.get(ssid) or self._open.get(ssid)
        await self._await_boot(ssid)
        return self._open.get(ssid)

    async def _await_boot(self, start_state_id: str) -> None:
        booting = self._booting.get(start_state_id)
        if booting is not None:
            async with asyncio.timeout(self._t.machine + self._t.ready):
                await booting.wait()

    async def _save(self, job: protocol.Job) -> protocol.JobResult:
        if job.version is None:
            raise ValueError("a save job needs the version to save")
        await self._await_boot(job.start_state_id)
        async with self._lock:
            machine = self._open.pop(job.start_state_id, None)
        if machine is None:
            raise ValueError(f"start state {job.start_state_id} has no open machine on this runner")
        return await self._save_and_close(machine, job, job.version)

    async def _close(self, job: protocol.Job) -> protocol.JobResult:
        await self._await_boot(job.start_state_id)
        async with self._lock:
            machine = self._open.pop(job.start_state_id, None)
        if machine is not None:
            await self._destroy(machine)
        return protocol.JobResult(job_id=job.job_id, ok=True, start_state_id=job.start_state_id)

    async def _delete(self, job: protocol.Job) -> protocol.JobResult:
        if job.version is None:  # the whole state goes; collecting one old version leaves an open machine be
            await self._close(job)
        held = await self._provider.held_versions()
        versions = [v for (ss, v) in held if ss == job.start_state_id and (job.version is None or v == job.version)]
        for v in versions:
            await self._provider.delete_version(job.start_state_id, v)
        return protocol.JobResult(job_id=job.job_id, ok=True, start_state_id=job.start_state_id)

    async def handle_request(self, req: protocol.MachineRequest) -> protocol.MachineResponse:
        """Screen, input or exec on an open start state's machine."""
        try:
            machine = await self._machine_for(req)
        except TimeoutError:
            machine = None
        if machine is None:
            return refuse(req, f"start state {req.start_state_id} is not open on this runner")
        server = self._servers.get(machine.machine_id)
        if server is None:
            server = self._servers[machine.machine_id] = MachineRequests(machine, self._t)
        return await server.serve(req)

    async def close_all(self) -> None:
        """Discard every open machine (drain, shutdown)."""
        async with self._lock:
            machines = list(self._open.values())
            self._open.clear()
        for m in machines:
            await self._destroy(m)
