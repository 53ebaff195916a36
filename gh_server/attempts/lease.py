"""Leases: queued attempts, oldest first, become leases for the free slots of this process's runners.

`lease_pass` reads the runners' capabilities from their rows, lets `matching` pick a runner per attempt,
claims the row (`queued` -> `leased`, guarded by `states.TRANSITIONS`) and builds the `Lease` message
from the frozen run case (`RunCaseCache`: frozen cases never change, so they are read once).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from pydantic import ValidationError
from sqlalchemy import Table, and_, bindparam, func, or_, select, update
from sqlalchemy.orm import Session

from gh_server.attempts.intake import rubric_of
from gh_server.attempts.matching import Candidate, RunnerCaps, pick_runner
from gh_server.attempts.states import fail_attempt, may
from gh_server.models import Attempt, RunCase, Runner, TestRun, utcnow
from gh_wire import protocol
from gh_wire.vocab import ACTIVE, AttemptStatus


@dataclass(frozen=True)
class RunCaseInfo:
    id: int
    case: dict[str, Any]
    start_state: dict[str, Any]
    runner_id: str | None

    @property
    def rubric(self) -> str | None:
        return rubric_of(self.case)


def checkpoints_of(success: dict[str, Any]) -> list[protocol.Checkpoint]:
    """What the runner scores, when the case has checkpoints: its check_script first, as one more
    checkpoint named `check` of weight 1 (docs/agents.md, "Scores"), then the checkpoints in order."""
    given = success.get("checkpoints") or []
    if not given:
        return []
    first = [protocol.Checkpoint(name="check", check_script=success["check_script"])] \
        if (success.get("check_script") or "").strip() else []
    return first + [protocol.Checkpoint(name=c["name"], check_script=c["check_script"],
                                        weight=c.get("weight", 1.0)) for c in given]


def needs_scores(case: dict[str, Any]) -> bool:
    """Whether a frozen case may score between 0 and 1, so that only a runner whose hello said `scores`
    may run it: it has checkpoints, or it is an OSWorld import (its check prints gh_osworld's score,
    docs/osworld.md, "Scores"). A plain check_script that prints a decimal is the author's to run on
    current runners: an older one reports it as the case's error, never as a verdict."""
    success = case.get("success") or {}
    metadata = case.get("metadata") or {}
    return bool(success.get("checkpoints")) or (isinstance(metadata, dict) and metadata.get("benchmark") == "osworld")


@dataclass(frozen=True)
class SavePointPolicy:
    """The server's save-point settings (gh_server/settings.py): a case's own `limits.save_point_minutes`
    wins over `every_minutes`."""

    every_minutes: int | None = None
    kept: int = 3


def frozen_case(case: dict[str, Any], save_points: SavePointPolicy = SavePointPolicy()) -> protocol.FrozenCase:
    success = case.get("success") or {}
    limits = case.get("limits") or {}
    return protocol.FrozenCase(
        test_case_id=case.get("test_case_id", ""),
        key=case.get("key"),
        name=case.get("name", ""),
        prompt=case.get("prompt", ""),
        setup_script=case.get("setup_script"),
        check_script=success.get("check_script"),
        checkpoints=checkpoints_of(success),
        limits=protocol.Limits(minutes=limits.get("minutes") or 10, steps=limits.get("steps"),
                               save_point_minutes=limits.get("save_point_minutes") or save_points.every_minutes),
        runs_on=case.get("runs_on") or "vm",
    )


@dataclass(frozen=True)
class Grant:
    attempt_id: str
    runner_id: str
    test_run_id: str
    agent_id: str
    try_number: int
    run_case_id: int


def lease_message(g: Grant, rc: RunCaseInfo, script_timeout: float,
                  save_points: SavePointPolicy = SavePointPolicy()) -> protocol.Lease:
    return protocol.Lease(
        attempt_id=g.attempt_id,
        test_run_id=g.test_run_id,
        agent_id=g.agent_id,
        try_number=g.try_number,
        case=frozen_case(rc.case, save_points),
        start_state=protocol.StartStateRef.model_validate(rc.start_state),
        script_timeout=script_timeout,
        save_points_kept=save_points.kept,
    )



def load_run_cases(session: Session, ids: Iterable[int]) -> dict[int, RunCaseInfo]:
    wanted = list(set(ids))
    out: dict[int, RunCaseInfo] = {}
    for i in range(0, len(wanted), 500):
        rows = session.execute(
            select(RunCase.id, RunCase.case, RunCase.start_state, RunCase.runner_id).where(
                RunCase.id.in_(wanted[i : i + 500])
            )
        ).all()
        for rid, case, ss, pinned in rows:
            out[rid] = RunCaseInfo(id=rid, case=dict(case or {}), start_state=dict(ss or {}), runner_id=pinned)
    return out


def active_counts(session: Session, runner_ids: Sequence[str]) -> dict[str, int]:
    if not runner_ids:
        return {}
    # By status only (the queue index): the few active rows, not every attempt these runners ever ran.
    rows = session.execute(
        select(Attempt.runner_id, func.count()).where(Attempt.status.in_(ACTIVE)).group_by(Attempt.runner_id)
    ).all()
    wanted = set(runner_ids)
    return {rid: n for rid, n in rows if rid in wanted}


def load_runner_caps(session: Session, runner_ids: Sequence[str]) -> list[RunnerCaps]:
    if not runner_ids:
        return []
    rows = session.scalars(select(Runner).where(Runner.id.in_(list(runner_ids)), Runner.revoked_at.is_(None))).all()
    counts = active_counts(session, [r.id for r in rows])
    caps = []
    for r in rows:
        images = frozenset(str(i.get("name")) for i in (r.images or []) if isinstance(i, dict))
        held = frozenset(
            (str(h.get("start_state_id")), int(h.get("version") or 0))
            for h in (r.held_versions or [])
            if isinstance(h, dict)
        )
        hot = frozenset(
            [("image", str(i.get("name"))) for i in (r.images or []) if isinstance(i, dict) and i.get("pooled")]
            + [("state", str(h.get("start_state_id")), str(int(h.get("version") or 0)))
               for h in (r.held_versions or []) if isinstance(h, dict) and h.get("pooled")]
        )
        caps.append(
            RunnerCaps(
                r.id, r.name, frozenset(r.labels or []), images, held, free=max(0, r.slots - counts.get(r.id, 0)),
                hot=hot, registry=r.oci_registry, scores=bool(r.scores),
            )
        )
    return caps


_T = cast(Table, Attempt.__table__)


@dataclass
class LeasePass:
    grants: list[Grant] = field(default_factory=list)
    messages: dict[str, protocol.Lease] = field(default_factory=dict)  # by attempt id
    failed_runs: set[str] = field(default_factory=set)  # runs with an attempt errored here (no judge)
    scanned: int = 0
    waited: list[float] = field(default_factory=list)  # seconds each leased attempt was queued


# The one move not made through `states.move`: built once, as the hottest statement of a pass.
assert may(AttemptStatus.QUEUED, AttemptStatus.LEASED)
_CLAIM = (
    update(_T)
    .where(_T.c.id == bindparam("b_id"), _T.c.status == AttemptStatus.QUEUED)
    .values(status=AttemptStatus.LEASED, runner_id=bindparam("runner_id"), leased_at=bindparam("leased_at"))
)


def lease_pass(
    session: Session,
    runner_ids: Sequence[str],
    skip: Callable[[str, str], bool],
    cache: RunCaseCache,
    judge_configured: bool,
    scan_budget: int = 5_000,
    script_timeout: float = 600.0,
    save_points: SavePointPolicy = SavePointPolicy(),
) -> LeasePass:
    """Lease queued attempts, oldest first, to these runners' free slots. The caller commits."""
    out = LeasePass()
    runners = load_runner_caps(session, runner_ids)
    free = sum(r.free for r in runners)
    if free <= 0:
        return out
    now = utcnow()
    conn = session.connection()
    after: tuple[datetime, str] | None = None
    started_runs: set[str] = set()
    while free > 0 and out.scanned < scan_budget:
        q = select(
            Attempt.id,
            Attempt.created_at,
            Attempt.runs_on,
            Attempt.required_runner_id,
            Attempt.run_case_id,
            Attempt.test_run_id,
            Attempt.agent_id,
            Attempt.try_number,
        ).where(Attempt.status == AttemptStatus.QUEUED)
        if after is not None:
            q = q.where(or_(Attempt.created_at > after[0], and_(Attempt.created_at == after[0], Attempt.id > after[1])))
        page = session.execute(q.order_by(Attempt.created_at, Attempt.id).limit(min(1000, max(64, free * 2)))).all()
        if not page:
            break
        infos = cache.get_many(session, [row.run_case_id for row in page])
        for row in page:
            out.scanned += 1
            rc = infos[row.run_case_id]
            if rc.rubric is not None and not judge_configured:
                # Retrying cannot help: no model will be there to judge the next attempt either.
                if (
                    fail_attempt(
                        session,
                        row.id,
                        "this case has a rubric and no judge model is configured on "
                        "this server (set the judge endpoint in the server settings)",
                        retry=False,
                        now=now,
                        expect_status=AttemptStatus.QUEUED,
                        phase="judge",
                    )
                    is not None
                ):
                    out.failed_runs.add(row.test_run_id)
                continue
            cand = Candidate(row.id, row.runs_on or "vm", rc.start_state, row.required_runner_id or rc.runner_id,
                             scored=needs_scores(rc.case))
            r = pick_runner(cand, runners, skip)
            if r is None:
                continue
            grant = Grant(row.id, r.runner_id, row.test_run_id, row.agent_id, row.try_number, row.run_case_id)
            try:
                message = lease_message(grant, rc, script_timeout, save_points)
            except ValidationError as e:
                # A frozen copy no runner could take (e.g. written by an older server): say so, once.
                first = e.errors()[0]
                where = ".".join(str(p) for p in first.get("loc", ()))
                why = f"the frozen test case cannot be sent to a runner: {where}: {first.get('msg')}"
                failed = fail_attempt(session, row.id, why, retry=False, now=now, expect_status=AttemptStatus.QUEUED,
                                      phase="server")
                if failed is not None:
                    out.failed_runs.add(row.test_run_id)
                continue
            claimed = conn.execute(_CLAIM, {"b_id": row.id, "runner_id": r.runner_id, "leased_at": now})
            if claimed.rowcount != 1:
                continue  # another process took it
            r.free -= 1
            free -= 1
            started_runs.add(row.test_run_id)
            out.grants.append(grant)
            out.messages[row.id] = message
            out.waited.append((now - row.created_at).total_seconds())
            if free <= 0:
                break
        after = (page[-1].created_at, page[-1].id)
    if started_runs:
        session.execute(
            update(TestRun)
            .where(TestRun.id.in_(list(started_runs)), TestRun.status == "queued")
            .values(status="running", started_at=now)
            .execution_options(synchronize_session=False)
        )
    return out



class RunCaseCache:
    """Frozen run cases never change, so they are read once (bounded, LRU)."""

    def __init__(self, size: int = 20_000) -> None:
        self._size = size
        self._items: OrderedDict[int, RunCaseInfo] = OrderedDict()

    def get_many(self, session: Session, ids: Iterable[int]) -> dict[int, RunCaseInfo]:
        ids = list(ids)
        missing = [i for i in ids if i not in self._items]
        if missing:
            for rid, info in load_run_cases(session, missing).items():
                self._items[rid] = info
        out = {}
        for i in ids:
            found = self._items.get(i)
            if found is None:
                found = RunCaseInfo(i, {}, {}, None)  # deleted under us; it will not match any runner
            else:
                self._items.move_to_end(i)
            out[i] = found
        while len(self._items) > self._size:
            self._items.popitem(last=False)
        return out
