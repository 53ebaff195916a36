"""`GET /v1/attempts/{id}/steps?after=SEQ`: an attempt's steps as they arrive, for the console's watch page
(docs/console.md, "Watching an attempt").

A step is a replay frame (gh_server/replays.py): its label, the event before it (the model's words and
its action in a model agent's `note`, an exec's script and exit code) and a frame URL the console loads
with its session cookie. Redacted as the replay page is: the frozen case's secret facts never leave,
whatever the runner sent. At most MAX_STEPS a call: the page asks again with the last `seq` it got.

Besides the steps: the attempt's status and phase, the agent's time left (`Gateway.task_time_left`:
null when this process does not run its agent, or does not know), the hold in progress (from
`attempts.takeovers`) and whether the replay masks (a secret was typed: its first masked frame says
`"masked": true`, gh_runner/replay.py), which is when the page shows frames instead of the live screen.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from gh_server import replays, serialize
from gh_server.api.common import DB, Member, state_of
from gh_server.errors import not_found
from gh_server.models import Attempt, ReplayFrame, RunCase
from gh_server.timestamps import ts
from gh_wire.vocab import AttemptStatus

router = APIRouter(tags=["Test runs"])

MAX_STEPS = 200  # frames in one answer
FRAME_PATH = "/v1/attempts/{attempt_id}/replay/frames/{seq}"

# The API's status says the phase well enough for a watcher: the runner's finer phases (machine, setup,
# check_before) are not kept by the server.
_PHASE: dict[str, str] = {AttemptStatus.PREPARING: "preparing", AttemptStatus.RUNNING: "task",
                          AttemptStatus.CHECKING: "check_after"}


def _masked(s: Session, attempt_id: str) -> bool:
    first = s.scalar(select(ReplayFrame.seq).where(ReplayFrame.attempt_id == attempt_id,
                                                   ReplayFrame.event["masked"].as_boolean().is_(True)).limit(1))
    return first is not None


@router.get("/v1/attempts/{attempt_id}/steps", summary="An attempt's steps after a sequence number, as they arrive")
def attempt_steps(attempt_id: str, request: Request,
                  after: int = Query(default=-1, ge=-1, description="the last seq you have (-1: from the start)"),
                  s: Session = DB, _p: Any = Member) -> dict[str, Any]:
    a = s.get(Attempt, attempt_id)
    if a is None:
        raise not_found("attempt", attempt_id)
    case = s.scalar(select(RunCase.case).where(RunCase.id == a.run_case_id)) or {}
    rows = s.execute(
        select(ReplayFrame.seq, ReplayFrame.at, ReplayFrame.label, ReplayFrame.event)
        .where(ReplayFrame.attempt_id == attempt_id, ReplayFrame.seq > after)
        .order_by(ReplayFrame.seq).limit(MAX_STEPS)
    ).all()
    t0 = a.started_at
    steps = [{"seq": seq, "at": ts(at), "t": round((at - t0).total_seconds(), 3) if t0 is not None else None,
              "label": label, "event": event, "src": FRAME_PATH.format(attempt_id=attempt_id, seq=seq)}
             for seq, at, label, event in rows]
    st = state_of(request)
    status = serialize.attempt_status(a.status)
    gw = st.gateway
    time_left = gw.task_time_left(attempt_id) if gw is not None and status == AttemptStatus.RUNNING else None
    return {
        "object": "attempt_steps",
        "attempt_id": a.id,
        "status": status,
        "phase": _PHASE.get(status, status),
        "time_left_s": round(time_left, 1) if time_left is not None else None,
        "takeover": serialize.takeover_in_progress(a, st.settings),
        "masked": _masked(s, attempt_id),
        "data": replays.redact(steps, replays.secret_values(case)),
    }
