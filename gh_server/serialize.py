"""Rows -> the API's objects, in the shapes of the Evals API (docs/server-api.md) and the official SDK's types."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from gh_server import replays
from gh_server.models import ApiKey, Attempt, Runner, StartState, TestCase, TestRun, TestSet
from gh_server.timestamps import ts as ts  # re-exported: the routers and results read it from here
from gh_wire.vocab import AttemptStatus


def test_case(row: TestCase) -> dict[str, Any]:
    success = dict(row.success or {})
    limits = dict(row.limits or {})
    return {
        "object": "test_case",
        "test_case_id": row.id,
        "key": row.key,
        "name": row.name,
        "prompt": row.prompt,
        "start_state": row.start_state,
        "setup_script": row.setup_script,
        "success": {"check_script": success.get("check_script"), "rubric": success.get("rubric"),
                    "checkpoints": success.get("checkpoints")},
        "customer": row.customer,
        "operator": row.operator or {"approvals": "approve"},
        # save_point_minutes only when set: the Evals API's limits are minutes and steps.
        "limits": {"minutes": limits.get("minutes", 10), "steps": limits.get("steps"),
                   **({"save_point_minutes": limits["save_point_minutes"]} if limits.get("save_point_minutes")
                      else {})},
        "runs_on": row.runs_on,
        "category": row.category,
        "tags": list(row.tags or []),
        "metadata": dict(row.metadata_ or {}),
        "created_at": ts(row.created_at),
        "updated_at": ts(row.updated_at),
        # Whether noop fails, reference passes and the check before prints False, every time (validation.py).
        "validation": case_validation(row),
    }


UNVALIDATED: dict[str, Any] = {"status": "unvalidated", "runs": 0, "reasons": [], "at": None, "test_run_id": None}


def case_validation(row: TestCase) -> dict[str, Any]:
    return dict(row.validation) if row.validation else dict(UNVALIDATED)


def test_set(row: TestSet, cases: list[tuple[str, str | None, int | None]]) -> dict[str, Any]:
    return {
        "object": "test_set",
        "test_set_id": row.id,
        "name": row.name,
        "description": row.description or "",
        "repeat": row.repeat,
        "customer": row.customer,
        "cases": [{"test_case_id": cid, "key": key, "repeat": rep} for cid, key, rep in cases],
        "case_count": len(cases),
        "metadata": dict(row.metadata_ or {}),
        "created_at": ts(row.created_at),
        "updated_at": ts(row.updated_at),
    }


def test_run(
    session: Session,
    row: TestRun,
    computed: tuple[dict[str, int], dict[str, float | None], dict[str, float | None]] | None = None,
) -> dict[str, Any]:
    """The run with its progress and pass rates (`computed` when a list page already grouped them)."""
    if computed is None:
        from gh_server.results import progress_for

        computed = progress_for(session, [row])[row.id]
    progress, pass_rate, mean_score = computed
    return {
        "object": "test_run",
        "test_run_id": row.id,
        "name": row.name or "",
        "test_set_id": row.test_set_id,
        "agents": list(row.agents or []),
        "status": row.status,
        "app_version": None,
        "progress": progress,
        "pass_rate": pass_rate,
        "mean_score": mean_score,  # per agent, over the same tries as pass_rate (docs/server-api.md, "Scores")
        "agent_versions": {a: None for a in row.agents or []},
        "rerun_of": row.rerun_of,
        "queue_timeout": row.queue_timeout_seconds,
        "metadata": dict(row.metadata_ or {}),
        "created_at": ts(row.created_at),
        "started_at": ts(row.started_at),
        "finished_at": ts(row.finished_at),
    }


# Internal attempt statuses -> the API's (a lease not yet accepted is already being prepared for).
_ATTEMPT_STATUS: dict[str, str] = {AttemptStatus.LEASED: AttemptStatus.PREPARING}

# While the attempt is in these statuses its machine can be watched live: `live_url`, the console's page.
_LIVE = frozenset({AttemptStatus.PREPARING, AttemptStatus.RUNNING, AttemptStatus.CHECKING})


def attempt_status(status: str) -> str:
    """An attempt row's status as the API says it."""
    return _ATTEMPT_STATUS.get(status, status)


def replay_url(settings: Any, base_url: str, attempt_id: str) -> str:
    """A link that opens in a browser: signed and short-lived (gh_server/replays.py)."""
    url: str = replays.replay_url(settings, base_url, attempt_id)
    return url


def error_cause(row: Attempt) -> str | None:
    """Whose an `error` is: "case" (its setup or check at fault) or "infrastructure" (ours). An error
    the runner did not say (the server's own: a runner lost, a judge missing) is ours."""
    if row.outcome != "error":
        return None
    return "case" if (row.metrics or {}).get("error_cause") == "case" else "infrastructure"


def takeover_in_progress(row: Attempt, settings: Any = None, cap_s: float | None = None) -> dict[str, Any] | None:
    """The hold in progress (its `takeovers` entry not ended, during the task): `{by, started_at, cap_at}`
    (`cap_s`, else the settings' takeover_cap_minutes). Every gh-server process reads it so
    (gh_server/takeover/desk.py: an agent's requests wait on it)."""
    if row.status != AttemptStatus.RUNNING:
        return None
    open_ = [t for t in (row.takeovers or []) if isinstance(t, dict) and t.get("ended_at") is None]
    if not open_:
        return None
    t = open_[-1]
    if cap_s is None:
        cap_s = float(getattr(settings, "takeover_cap_minutes", 30.0)) * 60.0
    try:
        started = datetime.fromisoformat(str(t["started_at"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return None
    return {"by": t.get("by"), "started_at": t.get("started_at"), "cap_at": ts(started + timedelta(seconds=cap_s))}


def attempt_score(row: Attempt) -> float | None:
    """The stored score; an attempt finished before scores (migration 0012) reads as its outcome."""
    if row.score is not None:
        return float(row.score)
    return {"passed": 1.0, "failed": 0.0}.get(row.outcome or "") if row.status == "done" else None


def attempt(row: Attempt, key: str | None, base_url: str, settings: Any = None,
            queued_reason: dict[str, Any] | None = None) -> dict[str, Any]:
    """An attempt object; `queued_reason` (gh_server.queue_wait) for a queued one: why it waits."""
    check = row.check or None
    if check is not None:
        check = {"before": check.get("before"), "after": check.get("after"), "passed": check.get("passed"),
                 "before_score": check.get("before_score")}
    metrics = row.metrics
    if metrics is not None:
        m = dict(metrics)
        metrics = {
            **m,
            "active_seconds": round(float(m.get("active_seconds") or 0)),
            "steps": int(m.get("steps") or 0),
            "questions": int(m.get("questions") or 0),
            "approvals": int(m.get("approvals") or 0),
            "cost_cents": m.get("cost_cents"),
        }
    return {
        "object": "attempt",
        "attempt_id": row.id,
        "test_run_id": row.test_run_id,
        "test_case_id": row.test_case_id,
        "key": key,
        "agent_id": row.agent_id,
        "try": row.try_number,
        "retry_of": row.retry_of,
        "is_last": row.is_last,
        "status": attempt_status(row.status),
        "outcome": row.outcome,
        # A person took the machine over: the outcome is the check's, counted apart (gh_server/counts.py).
        "assisted": bool(row.assisted),
        "task_id": None,
        "app_version": None,
        "replay_url": replay_url(settings, base_url, row.id),
        "takeovers": list(row.takeovers or []),
        "takeover": takeover_in_progress(row, settings),
        # The console's attempt page, where it can be watched live (docs/console.md), while its machine is up.
        "live_url": f"{base_url.rstrip('/')}/attempts/{row.id}" if attempt_status(row.status) in _LIVE else None,
        "check": check,
        # In [0, 1], passed exactly at 1 (docs/agents.md, "Scores"); None for an error or one not done.
        "score": attempt_score(row),
        "checkpoints": list(row.checkpoints) if row.checkpoints is not None else None,
        # The machine saved mid-task (docs/start-states.md, "Save points"), oldest first; a start state
        # can be made from each (POST /v1/attempts/{id}/save_points/{save_point_id}/start_state).
        "save_points": list(row.save_points or []),
        "judge": row.judge,
        "explanation": None,
        "customer": list(row.customer_turns or []),
        "answer": row.answer,
        "error": row.error,
        "error_cause": error_cause(row),
        "queued_reason": queued_reason if row.status == "queued" else None,
        "metrics": metrics,
        # Why the agent's task ended (finished, time_limit, step_limit, agent_failed) and what it said.
        "task_end": (row.metrics or {}).get("task_end"),
        "runner_id": row.runner_id,
        "created_at": ts(row.created_at),
        "started_at": ts(row.started_at),
        "finished_at": ts(row.finished_at),
    }


def runner(row: Runner, online: bool) -> dict[str, Any]:
    return {
        "object": "runner",
        "runner_id": row.id,
        "name": row.name,
        "scope": "org",
        "status": "online" if online else "offline",
        # Why an online runner takes no leases now (its hypervisor does not answer: `hypervisor_down`).
        "paused": row.paused if online else None,
        "provider": "qemu" if row.images else None,
        "labels": list(row.labels or []),
        "slots": row.slots,
        "busy": row.busy,
        "images": [i.get("name") if isinstance(i, dict) else str(i) for i in row.images or []],
        # The start-state versions on its disk ({start_state_id, version}), from its last hello.
        "held_versions": [dict(v) for v in row.held_versions or [] if isinstance(v, dict)],
        "version": row.version,
        "last_seen_at": ts(row.last_seen_at),
        "created_at": ts(row.created_at),
    }


# Internal start-state statuses the SDK does not know are shown as the nearest it does.
_SS_STATUS = {"closing": "open", "deleting": "ready"}
# An open machine closes itself after this long without input (gh_server.start_state_jobs sets it from settings).
START_STATE_IDLE_SECONDS = 7200.0


def _plus(t: datetime | None, seconds: float) -> datetime | None:
    return t + timedelta(seconds=seconds) if t is not None else None


def start_state(row: StartState, labels: list[str] | None = None, os_name: str = "") -> dict[str, Any]:
    meta = dict(row.metadata_ or {})
    view = None
    if row.status == "open":
        view = {
            "screen_url": f"/v1/start_states/{row.id}/screen",
            "input_url": f"/v1/start_states/{row.id}/input",
            "expires_at": ts(_plus(row.last_input_at or row.opened_at, START_STATE_IDLE_SECONDS)),
        }
    return {
        "object": "start_state",
        "start_state_id": row.id,
        "kind": "state",
        "name": row.name,
        "description": row.description or "",
        "from": row.from_,
        "image": row.image,
        "method": row.method,
        "script": row.script,
        "instruction": row.instruction,
        "agent_id": row.agent_id,
        "task_id": row.task_id,
        "status": _SS_STATUS.get(row.status, row.status),
        "version": row.version,
        "os": os_name,
        "labels": list(labels if labels is not None else row.runner_labels or []),
        "runner_id": row.runner_id,
        "error": row.error,
        "view": view,
        "metadata": meta,
        "created_at": ts(row.created_at),
        "updated_at": ts(row.updated_at),
    }


def image(name: str, os_name: str, labels: list[str], version: str | None) -> dict[str, Any]:
    return {
        "object": "start_state",
        "start_state_id": name,
        "kind": "image",
        "name": name,
        "description": "",
        "from": None,
        "method": None,
        "script": None,
        "instruction": None,
        "agent_id": None,
        "status": "ready",
        "version": 0,
        "image_version": version,
        "os": os_name,
        "labels": labels,
        "runner_id": None,
        "error": None,
        "view": None,
        "metadata": {},
        "created_at": None,
        "updated_at": None,
    }


def api_key(row: ApiKey) -> dict[str, Any]:
    return {
        "object": "api_key",
        "id": row.id,
        "name": row.name,
        "role": row.role,
        "prefix": row.prefix,
        "created_at": ts(row.created_at),
        "revoked_at": ts(row.revoked_at),
    }
