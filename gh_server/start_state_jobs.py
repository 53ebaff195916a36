"""Start states over time: open machines that closed themselves, and old versions collected.

`gh_server.api.start_states` moves a start state when someone asks (open, save, close) and when a job
ends; this module does what nobody asks for:

- idle close: an open machine without input for `idle_seconds` (2 hours unless configured) is closed
  like `POST .../close` would (a hand-made state never saved is deleted);
- version collection: a version older than the current one stays on its runners while any queued or
  running attempt, any unfinished run, or any unfinished job (a build `from` it) pins it; after that a
  `delete` job for that one version goes to every runner that may hold it (`holders`: the one that
  saved it, and those that pulled it from the registry);
- the `instruction` method: once the machine of such a state is open on its runner, the agent named
  by `agent_id` gets the instruction as its prompt and the machine (screen, input, exec through the
  runner); when it ends, the machine is saved as version 1 (or closed, and the state `failed`, when the
  agent fails). The state's `task_id` names that agent run.

Every change is an UPDATE/DELETE guarded by the state it expects, so several gh-server processes on one
database never close or collect the same thing twice.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.orm import Session

from gh_common.timeouts import within
from gh_server import serialize
from gh_server.agents.base import AgentContext, Machine, Relay
from gh_server.models import (
    Attempt,
    RunCase,
    Runner,
    RunnerJob,
    StartState,
    StartStateVersion,
    TestRun,
    new_id,
    utcnow,
)
from gh_server.state import ServerState
from gh_server.timestamps import ts
from gh_wire import protocol
from gh_wire.vocab import UNFINISHED

log = logging.getLogger("gh_server.start_state_jobs")

DEFAULT_IDLE_SECONDS = 7200.0
DEFAULT_INTERVAL_SECONDS = 5.0
INSTRUCTION_MINUTES = 60  # the agent's time budget for setting a machine up
INSTRUCTION_SLACK_SECONDS = 600.0  # past the budget, before a silent agent run is given up
ACTIVE_RUN = ("queued", "running")
ACTIVE_JOB = ("queued", "sent")


def _setting(st: ServerState, name: str, default: float) -> float:
    # Settings first (when the field exists there), then a per-process override in extras (tests, embedding).
    value: Any = st.extras.get(name)
    if value is None:
        value = getattr(st.settings, name, None)
    return float(value) if value is not None else default


def idle_seconds(st: ServerState) -> float:
    return _setting(st, "start_state_idle_seconds", DEFAULT_IDLE_SECONDS)


def interval_seconds(st: ServerState) -> float:
    return _setting(st, "start_state_housekeeping_seconds", DEFAULT_INTERVAL_SECONDS)


# -- idle close ---------------------------------------------------------------------------------


def close_idle(session: Session, idle: float, now: datetime | None = None) -> list[str]:
    """Close every open start state whose last input (or its opening) is older than `idle` seconds.

    Returns the ids of the `close` jobs queued for their runners."""

    now = now or utcnow()
    cutoff = now - timedelta(seconds=idle)
    last = func.coalesce(StartState.last_input_at, StartState.opened_at)
    guard = (StartState.status == "open", last < cutoff)
    jobs: list[str] = []
    for ss in session.scalars(select(StartState).where(*guard)):
        if ss.version < 1:
            gone = session.execute(
                delete(StartState).where(StartState.id == ss.id, StartState.version < 1, *guard),
                execution_options={"synchronize_session": False},
            )
            if gone.rowcount != 1:  # type: ignore[attr-defined]
                continue
            log.info("start state %s closed after %.0f s without input; never saved, so deleted", ss.id, idle)
        else:
            done = session.execute(
                update(StartState)
                .where(StartState.id == ss.id, *guard)
                .values(
                    status="ready",
                    error=f"closed after {idle:.0f} s without input; unsaved changes were discarded",
                    updated_at=now,
                )
                .execution_options(synchronize_session=False)
            )
            if done.rowcount != 1:  # type: ignore[attr-defined]
                continue
            log.info("start state %s closed after %.0f s without input", ss.id, idle)
        jobs.append(new_job(session, ss.id, "close", ss.runner_id).id)
    return jobs


# -- version collection -------------------------------------------------------------------------


def _active_run_cases() -> Any:
    active_runs = select(TestRun.id).where(TestRun.status.in_(ACTIVE_RUN))
    active_cases = select(Attempt.run_case_id).where(Attempt.status.in_(UNFINISHED))
    return or_(RunCase.test_run_id.in_(active_runs), RunCase.id.in_(active_cases))


def cases_running_on(session: Session, start_state_id: str) -> list[str]:
    """Test case ids of unfinished runs (or attempts) frozen on any version of this start state: deleting
    it now would pull the disk from under them."""
    out: set[str] = set()
    for case_id, ref in session.execute(select(RunCase.test_case_id, RunCase.start_state).where(_active_run_cases())):
        if isinstance(ref, dict) and ref.get("kind") == "state" and ref.get("start_state_id") == start_state_id:
            out.add(case_id)
    return sorted(out)


def pinned_versions(session: Session) -> set[tuple[str, int]]:
    """(start_state_id, version) pairs something still needs: unfinished runs and attempts, builds from it."""
    refs: list[dict[str, Any]] = list(session.scalars(select(RunCase.start_state).where(_active_run_cases())))
    for payload in session.scalars(
        select(RunnerJob.payload).where(RunnerJob.status.in_(ACTIVE_JOB), RunnerJob.op.in_(("build", "open")))
    ):
        refs.append((payload or {}).get("source") or {})
    out: set[tuple[str, int]] = set()
    for ref in refs:
        if isinstance(ref, dict) and ref.get("kind") == "state" and ref.get("start_state_id"):
            out.add((str(ref["start_state_id"]), int(ref.get("version") or 0)))
    return out


def holders(session: Session, start_state_id: str, version: int | None, known: Iterable[str | None] = ()) -> list[str]:
    """Runners that may hold `version` of a start state (any of its versions when None), for a delete:
    `known` (the runner that saved it), every runner whose hello listed it, and every runner an attempt
    on it ran on (with a registry, a runner pulls a version to run an attempt, and says it holds it only
    at its next hello). The version leaves every listing here, so no new lease counts on it. A runner
    that evicted it since answers the delete job with nothing to do."""

    def listed(h: Any) -> bool:
        return (isinstance(h, dict) and h.get("start_state_id") == start_state_id
                and (version is None or h.get("version") == version))

    out = {rid for rid in known if rid}
    for runner in session.scalars(select(Runner).where(Runner.revoked_at.is_(None))):
        held = list(runner.held_versions or [])
        kept = [h for h in held if not listed(h)]
        if len(kept) != len(held):
            runner.held_versions = kept
            out.add(runner.id)
    ref = RunCase.start_state
    ran_on = (
        select(Attempt.runner_id)
        .join(RunCase, RunCase.id == Attempt.run_case_id)
        .join(Runner, Runner.id == Attempt.runner_id)
        .where(Runner.revoked_at.is_(None), ref["kind"].as_string() == "state",
               ref["start_state_id"].as_string() == start_state_id)
        .distinct()
    )
    if version is not None:
        ran_on = ran_on.where(ref["version"].as_integer() == version)
    out.update(rid for rid in session.scalars(ran_on) if rid)
    return sorted(out)


def collect_versions(session: Session, now: datetime | None = None) -> list[str]:
    """Queue a `delete` job for every old, unpinned version; returns the job ids."""

    now = now or utcnow()
    old = session.execute(
        select(StartStateVersion, StartState)
        .join(StartState, StartState.id == StartStateVersion.start_state_id)
        .where(StartStateVersion.deleted_at.is_(None), StartStateVersion.version < StartState.version)
    ).all()
    if not old:
        return []
    pinned = pinned_versions(session)
    jobs: list[str] = []
    for v, ss in old:
        key = (v.start_state_id, v.version)
        if key in pinned:
            continue
        marked = session.execute(
            update(StartStateVersion)
            .where(
                StartStateVersion.start_state_id == v.start_state_id,
                StartStateVersion.version == v.version,
                StartStateVersion.deleted_at.is_(None),
            )
            .values(deleted_at=now)
            .execution_options(synchronize_session=False)
        )
        if marked.rowcount != 1:  # type: ignore[attr-defined]
            continue
        # The saver and every runner that pulled it from the registry; no new lease may count on it from now on.
        runner_ids = holders(session, v.start_state_id, v.version, known=[v.runner_id])
        for rid in runner_ids:
            jobs.append(new_job(session, ss.id, "delete", rid, version=v.version).id)
        log.info("start state %s version %d is no longer pinned; deleting it on runners %s", *key,
                 ", ".join(runner_ids) or "(none)")
    return jobs


def collect_save_points(session: Session, retention: timedelta, now: datetime | None = None) -> list[str]:
    """Queue a `delete` job on its runner for every save point of a try finished more than `retention` ago,
    but those a start state was made from (a fork: it is that start state's version 1 now, collected as
    one); each is marked `collected_at` on its attempt, so a fork of it is refused from then. Returns
    the job ids."""
    now = now or utcnow()
    rows = session.scalars(
        select(Attempt).where(Attempt.status == "done", Attempt.save_points.is_not(None),
                              Attempt.finished_at < now - retention)
    ).all()
    jobs: list[str] = []
    for a in rows:
        points = [dict(p) for p in a.save_points or []]
        due = [p for p in points if not p.get("collected_at")
               and session.get(StartState, str(p.get("save_point_id"))) is None]
        if not due:
            continue
        runner = session.get(Runner, a.runner_id) if a.runner_id else None
        for p in due:
            p["collected_at"] = ts(now)
            if runner is not None and runner.revoked_at is None:  # a revoked runner's disk is its operator's
                jobs.append(new_job(session, str(p["save_point_id"]), "delete", runner.id, version=1).id)
        a.save_points = points
        log.info("save points of attempt %s deleted on runner %s after %s: %s", a.id, a.runner_id, retention,
                 ", ".join(str(p["save_point_id"]) for p in due))
    return jobs


# -- the instruction method ---------------------------------------------------------------------


def new_job(
    session: Session,
    start_state_id: str,
    op: str,
    runner_id: str | None,
    *,
    source: dict[str, Any] | None = None,
    version: int | None = None,
    script: str | None = None,
) -> RunnerJob:
    """A queued start-state job for `runner_id` (sent by `dispatch_jobs` after the caller commits); the start
    state may have no row (a save point no start state was made from)."""
    job_id = new_id("jb_")
    msg = protocol.Job(
        job_id=job_id,
        op=op,  # type: ignore[arg-type]
        start_state_id=start_state_id,
        source=protocol.StartStateRef(**source) if source else None,
        version=version,
        script=script,
    )
    row = RunnerJob(
        id=job_id,
        runner_id=runner_id,
        start_state_id=start_state_id,
        op=op,
        payload=msg.model_dump(mode="json"),
        status="queued",
    )
    session.add(row)
    return row


async def dispatch_jobs(st: ServerState, job_ids: list[str]) -> None:
    """Send queued jobs to their runner when it is connected here; the row says `sent` once it went out."""
    if st.gateway is None:
        return
    for job_id in job_ids:

        def load(jid: str = job_id) -> tuple[str | None, dict[str, Any]] | None:
            with st.db() as s:
                row = s.get(RunnerJob, jid)
                return (row.runner_id, dict(row.payload)) if row is not None and row.status == "queued" else None

        got = await run_in_threadpool(load)
        if got is None or got[0] is None or not st.gateway.connected(got[0]):
            continue
        if await st.gateway.send(got[0], protocol.Job.model_validate(got[1])):

            def mark(jid: str = job_id) -> None:
                with st.db.begin() as s:
                    row = s.get(RunnerJob, jid)
                    if row is not None and row.status == "queued":
                        row.status = "sent"

            await run_in_threadpool(mark)


class StartStateMachine(Machine):
    """An open start state's machine, for an agent: the same requests, addressed by start state."""

    def __init__(self, relay: Relay, runner_id: str, start_state_id: str) -> None:
        super().__init__(relay, runner_id, attempt_id="")
        self.start_state_id = start_state_id

    def _req(self, op: str, note: dict[str, Any] | None = None, **kw: Any) -> protocol.MachineRequest:
        return protocol.MachineRequest(request_id=uuid.uuid4().hex, start_state_id=self.start_state_id,
                                       op=op, note=note, **kw)  # type: ignore[arg-type]


def claim_instructions(session: Session) -> list[dict[str, Any]]:
    """Instruction states whose machine is open and that no agent works on yet; each is claimed by
    setting its `task_id` (guarded), so one server process runs its agent."""
    opened = select(RunnerJob.start_state_id).where(RunnerJob.op == "open", RunnerJob.status == "done")
    out: list[dict[str, Any]] = []
    for ss in session.scalars(
        select(StartState).where(
            StartState.method == "instruction",
            StartState.status == "building",
            StartState.task_id.is_(None),
            StartState.id.in_(opened),
        )
    ):
        task_id = new_id("tk_")
        claimed = session.execute(
            update(StartState)
            .where(StartState.id == ss.id, StartState.status == "building", StartState.task_id.is_(None))
            .values(task_id=task_id, updated_at=utcnow())
            .execution_options(synchronize_session=False)
        )
        if claimed.rowcount == 1:  # type: ignore[attr-defined]
            out.append({"start_state_id": ss.id, "task_id": task_id, "runner_id": ss.runner_id,
                        "agent_id": ss.agent_id or "default", "instruction": ss.instruction or "",
                        "metadata": dict(ss.metadata_ or {})})
    return out


def finish_instruction(session: Session, start_state_id: str, task_id: str, error: str | None) -> list[str]:
    """The agent is done: save the machine as version 1, or close it and mark the state failed."""
    from gh_server import webhooks

    ss = session.get(StartState, start_state_id)
    if ss is None or ss.task_id != task_id or ss.status != "building":
        return []  # deleted or changed meanwhile: nothing of ours to finish
    if error is None:
        return [new_job(session, ss.id, "save", ss.runner_id, version=ss.version + 1).id]
    ss.status, ss.error, ss.updated_at = "failed", error, utcnow()
    job = new_job(session, ss.id, "close", ss.runner_id)
    session.flush()
    webhooks.enqueue(session, "start_state.failed", serialize.start_state(ss))
    return [job.id]


def expire_instructions(session: Session, now: datetime | None = None) -> list[str]:
    """Instruction states whose agent outlived its budget without finishing (its server process went
    away mid-run, say) fail instead of building for ever."""
    now = now or utcnow()
    cutoff = now - timedelta(seconds=INSTRUCTION_MINUTES * 60 + INSTRUCTION_SLACK_SECONDS)
    jobs: list[str] = []
    for ssid, task_id in session.execute(
        select(StartState.id, StartState.task_id).where(
            StartState.method == "instruction",
            StartState.status == "building",
            StartState.task_id.is_not(None),
            StartState.updated_at < cutoff,
        )
    ).all():
        jobs += finish_instruction(
            session, ssid, str(task_id),
            f"instruction: the agent did not finish within {INSTRUCTION_MINUTES} minutes (task {task_id})",
        )
    return jobs


async def run_instruction(st: ServerState, claim: dict[str, Any]) -> None:
    from gh_server.agents.registry import AgentRegistry
    from gh_server.ports import GrantSpec

    ssid, task_id, agent_id = claim["start_state_id"], claim["task_id"], claim["agent_id"]
    error: str | None = None
    if st.gateway is None or claim["runner_id"] is None:
        error = "instruction: no runner gateway in this server"
    else:
        machine = StartStateMachine(st.gateway.machine_request, claim["runner_id"], ssid)
        # The agent sees the instruction as its prompt; the state's metadata stands in for a case's
        # (the `reference` agent runs its `reference_fix`).
        case = {"test_case_id": ssid, "name": f"set up {ssid}", "prompt": claim["instruction"],
                "limits": {"minutes": INSTRUCTION_MINUTES}, "metadata": claim["metadata"]}
        # External agents reach the machine through the machine API, as in a case's task.
        sup = st.gateway.agents
        token = secrets.token_urlsafe(32)
        ctx = AgentContext(attempt_id=task_id, runner_id=claim["runner_id"], agent_id=agent_id, test_run_id="",
                           case=case, machine=machine, machine_api_url=sup.machine_api_url,
                           machine_api_token=token)
        try:
            agent = AgentRegistry.from_settings(st.settings).get(agent_id)
            async with sup.granted(token, GrantSpec(task_id, claim["runner_id"], max_steps=None,
                                                    minutes=INSTRUCTION_MINUTES, start_state_id=ssid)):
                outcome = await within(INSTRUCTION_MINUTES * 60 + 60, agent.run(ctx))
            log.info("start state %s: agent %s finished its instruction (task %s, %d steps)",
                     ssid, agent_id, task_id, outcome.steps)
        except TimeoutError:
            error = f"instruction: agent {agent_id} did not finish within {INSTRUCTION_MINUTES} minutes"
        except Exception as e:  # the agent's failure is the state's, with its reason
            error = f"instruction: agent {agent_id} failed: {e}"[:2000]
    jobs = await run_in_threadpool(lambda: _finish_in_tx(st, ssid, task_id, error))
    if jobs:
        await dispatch_jobs(st, jobs)


def _finish_in_tx(st: ServerState, ssid: str, task_id: str, error: str | None) -> list[str]:
    with st.db.begin() as s:
        return finish_instruction(s, ssid, task_id, error)


# -- the task -----------------------------------------------------------------------------------


async def housekeeping_once(st: ServerState) -> list[str]:
    """One pass (idle close, then collection); returns the jobs it queued, already sent when possible."""

    idle = idle_seconds(st)

    def work() -> tuple[list[str], list[dict[str, Any]]]:
        with st.db.begin() as s:
            jobs = close_idle(s, idle)
        with st.db.begin() as s:
            jobs += collect_versions(s)
        with st.db.begin() as s:
            jobs += collect_save_points(s, timedelta(hours=st.settings.save_point_retention_hours))
        with st.db.begin() as s:
            jobs += expire_instructions(s)
        with st.db.begin() as s:
            claims = claim_instructions(s) if st.gateway is not None else []
        return jobs, claims

    jobs, claims = await run_in_threadpool(work)
    if jobs:
        await dispatch_jobs(st, jobs)
    running: set[asyncio.Task[None]] = st.extras.setdefault("start_state_agents", set())  # type: ignore[assignment]
    for claim in claims:
        task = asyncio.create_task(run_instruction(st, claim), name=f"instruction-{claim['start_state_id']}")
        running.add(task)
        task.add_done_callback(running.discard)
    return jobs


async def housekeeping(st: ServerState) -> None:
    while True:
        try:
            await housekeeping_once(st)
        except Exception:  # a bad pass (database briefly away) must not end the task
            log.exception("start-state housekeeping failed; trying again next round")
        await asyncio.sleep(interval_seconds(st))


def install(app: FastAPI, st: ServerState) -> None:
    # The open view's expires_at is computed where start states are serialized.
    serialize.START_STATE_IDLE_SECONDS = idle_seconds(st)
    st.background.append(housekeeping)
