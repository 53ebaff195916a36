"""Machine-API grants as rows (`machine_grants`), so any gh-server process answers an agent's request.

A grant is made when an agent's task starts (in the process that runs the agent) and deleted when it
ends; `expires_at` (the task's time limit and a slack, moved on by the time a person held the machine:
`extend`) ends the grants of a process that died. The
counters the task ends with (steps, questions, approvals) and the customer's failure live on the row:
whichever process served a request updates them with one guarded UPDATE, so a step limit holds across
processes. A refused step flags the row (`step_limit_hit`): the task ends there, and the process
running the agent reads the flag (gh_server.agents.supervisor). Only the token's sha256 is stored.
Plain data in, plain data out (these run in the DbQueue).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, delete, select, update
from sqlalchemy.orm import Session

from gh_server.models import Attempt as AttemptRow
from gh_server.models import MachineGrant, RunCase, utcnow


@dataclass(frozen=True)
class GrantRow:
    attempt_id: str
    runner_id: str
    max_steps: int | None
    start_state_id: str | None
    case: dict[str, Any]  # the attempt's frozen case ({} for a start state's instruction)


@dataclass
class Tally:
    """What the task's requests added up to, read when its grant is deleted."""

    steps: int = 0
    questions: int = 0
    approvals: int = 0
    customer_error: str | None = None
    machine_failure: str | None = None  # the first request the machine failed under the agent (ours)


def add(session: Session, token_hash: str, attempt_id: str, runner_id: str, max_steps: int | None,
        expires_at: datetime, start_state_id: str | None = None) -> None:
    now = utcnow()
    session.execute(delete(MachineGrant).where(MachineGrant.expires_at < now)
                    .execution_options(synchronize_session=False))
    session.add(MachineGrant(token_hash=token_hash, attempt_id=attempt_id, runner_id=runner_id,
                             max_steps=max_steps, start_state_id=start_state_id, steps=0, questions=0, approvals=0,
                             secret_typed=False, step_limit_hit=False, expires_at=expires_at, created_at=now))


def load(session: Session, token_hash: str) -> GrantRow | None:
    g = session.get(MachineGrant, token_hash)
    if g is None or g.expires_at <= utcnow():
        return None
    case: dict[str, Any] = {}
    if g.start_state_id is None:
        row = session.execute(select(RunCase.case).join(AttemptRow, AttemptRow.run_case_id == RunCase.id)
                              .where(AttemptRow.id == g.attempt_id)).first()
        case = dict(row.case or {}) if row is not None else {}
    return GrantRow(g.attempt_id, g.runner_id, g.max_steps, g.start_state_id, case)


def take_step(session: Session, token_hash: str) -> bool | None:
    """True: counted. False: the step limit is reached (and the row flagged: the task ends). None: the
    grant is gone."""
    res = session.execute(
        update(MachineGrant)
        .where(MachineGrant.token_hash == token_hash, MachineGrant.expires_at > utcnow(),
               (MachineGrant.max_steps.is_(None)) | (MachineGrant.steps < MachineGrant.max_steps))
        .values(steps=MachineGrant.steps + 1)
        .execution_options(synchronize_session=False)
    )
    if cast(CursorResult[Any], res).rowcount == 1:
        return True
    res = session.execute(
        update(MachineGrant)
        .where(MachineGrant.token_hash == token_hash, MachineGrant.max_steps.is_not(None),
               MachineGrant.steps >= MachineGrant.max_steps)
        .values(step_limit_hit=True)
        .execution_options(synchronize_session=False)
    )
    return False if cast(CursorResult[Any], res).rowcount == 1 else None


def give_back_step(session: Session, token_hash: str) -> None:
    """A counted step that was not done (a person took the machine over while it waited): not the agent's."""
    session.execute(update(MachineGrant).where(MachineGrant.token_hash == token_hash, MachineGrant.steps > 0)
                    .values(steps=MachineGrant.steps - 1).execution_options(synchronize_session=False))


def extend(session: Session, attempt_id: str, seconds: float) -> None:
    """Move the expiry of the attempt's grants by `seconds` (a takeover's time is not the task's)."""
    for g in session.scalars(select(MachineGrant).where(MachineGrant.attempt_id == attempt_id,
                                                        MachineGrant.start_state_id.is_(None))):
        g.expires_at = g.expires_at + timedelta(seconds=seconds)


def resumed(session: Session, attempt_id: str, expires_at: datetime) -> None:
    """The attempt goes on from a save point (gh_server/attempts/resume.py): a machine failure met while
    the runner was away is forgotten (it is over), and the grant lasts the time the task has left. Its
    steps go back when the agent's next action is refused `machine_restored` (`set_steps`): an action
    counted while the runner was away is the one refused."""
    session.execute(update(MachineGrant)
                    .where(MachineGrant.attempt_id == attempt_id, MachineGrant.start_state_id.is_(None))
                    .values(machine_failure=None, expires_at=expires_at)
                    .execution_options(synchronize_session=False))


def moved(session: Session, attempt_id: str, runner_id: str) -> None:
    """The attempt went on on another runner (gh_server/attempts/resume.py): its grants lead there now."""
    session.execute(update(MachineGrant)
                    .where(MachineGrant.attempt_id == attempt_id, MachineGrant.start_state_id.is_(None))
                    .values(runner_id=runner_id).execution_options(synchronize_session=False))


def set_steps(session: Session, token_hash: str, steps: int) -> None:
    session.execute(update(MachineGrant).where(MachineGrant.token_hash == token_hash)
                    .values(steps=max(0, steps), step_limit_hit=False).execution_options(synchronize_session=False))


def step_limits_reached(session: Session, token_hashes: list[str]) -> list[str]:
    """Which of these grants had a step past their limit asked (in any process)."""
    return list(session.scalars(select(MachineGrant.token_hash).where(MachineGrant.token_hash.in_(token_hashes),
                                                                      MachineGrant.step_limit_hit.is_(True))))


def count(session: Session, token_hash: str, field: str) -> bool:
    """questions or approvals + 1. Returns whether a secret was typed on this machine (mask the screen)."""
    column = {"questions": MachineGrant.questions, "approvals": MachineGrant.approvals}[field]
    session.execute(update(MachineGrant).where(MachineGrant.token_hash == token_hash)
                    .values({column: column + 1}).execution_options(synchronize_session=False))
    return bool(session.scalar(select(MachineGrant.secret_typed).where(MachineGrant.token_hash == token_hash)))


def mark(session: Session, token_hash: str, *, secret_typed: bool | None = None,
         customer_error: str | None = None, machine_failure: str | None = None) -> None:
    if machine_failure is not None:  # the first one is what the agent gave up on
        session.execute(update(MachineGrant)
                        .where(MachineGrant.token_hash == token_hash, MachineGrant.machine_failure.is_(None))
                        .values(machine_failure=machine_failure[:2000]).execution_options(synchronize_session=False))
    values: dict[str, Any] = {}
    if secret_typed:
        values["secret_typed"] = True
    if customer_error is not None:
        values["customer_error"] = customer_error[:2000]
    if values:
        session.execute(update(MachineGrant).where(MachineGrant.token_hash == token_hash).values(**values)
                        .execution_options(synchronize_session=False))


def end(session: Session, token_hash: str) -> Tally:
    g = session.get(MachineGrant, token_hash)
    if g is None:
        return Tally()
    tally = Tally(g.steps, g.questions, g.approvals, g.customer_error, g.machine_failure)
    session.delete(g)
    return tally
