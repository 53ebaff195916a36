"""The control plane's tables (SQLAlchemy 2.0). SQLite by default, PostgreSQL at scale.

Everything the scheduler decides lives here, not in process memory, so several gh-server
processes on one PostgreSQL can share the work: a lease is an UPDATE of an attempt row guarded by
its status, and a runner's liveness is `last_seen_at`.

JSON columns hold the API's nested objects in the Evals API's shapes (success, customer, limits,
check, metrics, ...). Timestamps are timezone-aware UTC.
"""

from __future__ import annotations

import secrets
import string
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

_ALPHABET = string.ascii_letters + string.digits


def new_id(prefix: str) -> str:
    """`tc_8Kq2mZ0aLp4x`-style ids: a prefix and 12 random base62 characters."""
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(12))


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Stores UTC; always returns aware datetimes (SQLite drops the zone otherwise)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime, dict[str, Any]: JSON, list[Any]: JSON}


# ---------------------------------------------------------------------------------------------
# Access
# ---------------------------------------------------------------------------------------------


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # ak_...
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16))  # admin | member
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the whole key
    prefix: Mapped[str] = mapped_column(String(16))  # first characters, for display only
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)


class ConsoleSession(Base):
    """A browser's sign-in to the console (gh_server/console_sessions.py): the cookie's secret is kept only
    as its sha256, so a copy of the database signs nobody in."""

    __tablename__ = "console_sessions"
    secret_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id", ondelete="CASCADE"), index=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(index=True)


# ---------------------------------------------------------------------------------------------
# Runners
# ---------------------------------------------------------------------------------------------


class Runner(Base):
    __tablename__ = "runners"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # rn_...
    name: Mapped[str] = mapped_column(String(200))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    labels: Mapped[list[Any]] = mapped_column(default=list)
    slots: Mapped[int] = mapped_column(Integer, default=0)
    busy: Mapped[int] = mapped_column(Integer, default=0)
    images: Mapped[list[Any]] = mapped_column(default=list)  # [{name, os, version, checksum}]
    held_versions: Mapped[list[Any]] = mapped_column(default=list)  # [{start_state_id, version}]
    # The OCI registry it pulls start states from ("host[:port]/prefix", hello.registry), or None.
    oci_registry: Mapped[str | None] = mapped_column("registry", String(300), default=None)
    version: Mapped[str | None] = mapped_column(String(64), default=None)
    # The connection currently serving this runner (a gateway process's session id), or None.
    session_id: Mapped[str | None] = mapped_column(String(64), default=None)
    connected_at: Mapped[datetime | None] = mapped_column(default=None)
    disconnected_at: Mapped[datetime | None] = mapped_column(default=None)
    last_seen_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)
    # Why the connected runner takes no leases now (a LeaseRefusal code: hypervisor_down), or None.
    paused: Mapped[str | None] = mapped_column(String(32), default=None)
    # Its hello said `scores`: it reads a check's decimal last line as a score and runs checkpoints.
    scores: Mapped[bool] = mapped_column(Boolean, default=False)


# ---------------------------------------------------------------------------------------------
# Test cases and sets
# ---------------------------------------------------------------------------------------------


class TestCase(Base):
    __tablename__ = "test_cases"
    __test__ = False  # not a pytest class
    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # tc_...
    key: Mapped[str | None] = mapped_column(String(64), unique=True, default=None)
    name: Mapped[str] = mapped_column(String(200))
    prompt: Mapped[str] = mapped_column(Text)
    start_state: Mapped[str] = mapped_column(String(200))
    setup_script: Mapped[str | None] = mapped_column(Text, default=None)
    success: Mapped[dict[str, Any]] = mapped_column(default=dict)  # {check_script, rubric}
    customer: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    operator: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    limits: Mapped[dict[str, Any]] = mapped_column(default=dict)  # {minutes, steps}
    runs_on: Mapped[str] = mapped_column(String(64), default="vm")
    category: Mapped[str | None] = mapped_column(String(200), default=None)
    tags: Mapped[list[Any]] = mapped_column(default=list)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    # {status, runs, reasons, at, test_run_id}: the last validation run's verdict (gh_server/validation.py)
    validation: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)


class TestCaseTag(Base):
    """One row per (case, tag): tag filters and by_tag breakdowns in SQL on both databases."""

    __tablename__ = "test_case_tags"
    __test__ = False
    test_case_id: Mapped[str] = mapped_column(ForeignKey("test_cases.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)


class TestSet(Base):
    __tablename__ = "test_sets"
    __test__ = False
    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # ts_...
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    repeat: Mapped[int] = mapped_column(Integer, default=1)
    customer: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class TestSetCase(Base):
    __tablename__ = "test_set_cases"
    __test__ = False
    test_set_id: Mapped[str] = mapped_column(ForeignKey("test_sets.id", ondelete="CASCADE"), primary_key=True)
    test_case_id: Mapped[str] = mapped_column(ForeignKey("test_cases.id", ondelete="CASCADE"), primary_key=True)
    repeat: Mapped[int | None] = mapped_column(Integer, default=None)
    position: Mapped[int] = mapped_column(Integer, default=0)


# ---------------------------------------------------------------------------------------------
# Runs and attempts
# ---------------------------------------------------------------------------------------------


class TestRun(Base):
    __tablename__ = "test_runs"
    __test__ = False
    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # tr_...
    name: Mapped[str | None] = mapped_column(String(200), default=None)
    test_set_id: Mapped[str | None] = mapped_column(String(32), default=None)  # no FK: deleting a set keeps runs
    agents: Mapped[list[Any]] = mapped_column(default=list)
    status: Mapped[str] = mapped_column(String(16), default="queued")  # queued|running|completed|cancelled
    rerun_of: Mapped[str | None] = mapped_column(String(32), default=None)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    # An attempt queued longer than this ends as `error` with its queued_reason (None: it waits).
    queue_timeout_seconds: Mapped[float | None] = mapped_column(Float, default=None)


class RunCase(Base):
    """A case frozen into a run: the copy the attempts run, and the start-state version pinned."""

    __tablename__ = "run_cases"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    test_run_id: Mapped[str] = mapped_column(ForeignKey("test_runs.id", ondelete="CASCADE"), index=True)
    test_case_id: Mapped[str] = mapped_column(String(32))  # no FK: a deleted case keeps its runs
    position: Mapped[int] = mapped_column(Integer, default=0)
    tries: Mapped[int] = mapped_column(Integer, default=1)
    case: Mapped[dict[str, Any]] = mapped_column(default=dict)  # the test_case object as frozen
    start_state: Mapped[dict[str, Any]] = mapped_column(default=dict)  # protocol.StartStateRef as dict
    runner_id: Mapped[str | None] = mapped_column(String(32), default=None)  # pinned (a start state's holder)
    __table_args__ = (UniqueConstraint("test_run_id", "test_case_id"),)


class Attempt(Base):
    __tablename__ = "attempts"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # at_...
    test_run_id: Mapped[str] = mapped_column(ForeignKey("test_runs.id", ondelete="CASCADE"))
    run_case_id: Mapped[int] = mapped_column(ForeignKey("run_cases.id", ondelete="CASCADE"))
    test_case_id: Mapped[str] = mapped_column(String(32))
    agent_id: Mapped[str] = mapped_column(String(200))
    try_number: Mapped[int] = mapped_column("try", Integer)  # 1-based try of (case, agent)
    retry_of: Mapped[str | None] = mapped_column(String(32), default=None)
    is_last: Mapped[bool] = mapped_column(Boolean, default=True)  # the attempt that counts for its try
    # queued -> leased -> preparing -> running -> checking -> done
    status: Mapped[str] = mapped_column(String(16), default="queued")
    outcome: Mapped[str | None] = mapped_column(String(16), default=None)  # passed|failed|error
    error: Mapped[str | None] = mapped_column(Text, default=None)
    check: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)  # {before, after, passed, before_score}
    # In [0, 1]: the check's score or its checkpoints' weighted mean (intake.score_of); None for an error.
    score: Mapped[float | None] = mapped_column(Float, default=None)
    checkpoints: Mapped[list[Any] | None] = mapped_column(JSON, default=None)  # [{name, weight, score, before_score}]
    # The save points its runner keeps, oldest first: [{save_point_id, step, created_at, bytes}] (issue 51).
    save_points: Mapped[list[Any] | None] = mapped_column(JSON, default=None)
    judge: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    customer_turns: Mapped[list[Any] | None] = mapped_column(JSON, default=None)
    answer: Mapped[str | None] = mapped_column(Text, default=None)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    runs_on: Mapped[str] = mapped_column(String(64), default="vm")
    runner_id: Mapped[str | None] = mapped_column(String(32), default=None, index=True)
    required_runner_id: Mapped[str | None] = mapped_column(String(32), default=None)
    leased_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    seconds: Mapped[float | None] = mapped_column(Float, default=None)
    # A person took the machine over during the task (gh_server/takeover/desk.py): never the agent's pass.
    # Set when a takeover begins, never cleared; `takeovers` holds each hold's span and human steps.
    assisted: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    takeovers: Mapped[list[Any] | None] = mapped_column(JSON, default=None)
    __table_args__ = (
        Index("ix_attempts_queue", "status", "created_at"),
        Index("ix_attempts_run", "test_run_id", "is_last"),
    )


class AttemptLabel(Base):
    """A person's verdict on an attempt (judge calibration, gh_server/calibration.py); one per attempt."""

    __tablename__ = "attempt_labels"
    attempt_id: Mapped[str] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"), primary_key=True)
    passed: Mapped[bool] = mapped_column(Boolean)
    note: Mapped[str] = mapped_column(Text, default="")
    labelled_by: Mapped[str | None] = mapped_column(String(32), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ReplayFrame(Base):
    """A screen of an attempt's replay. (attempt_id, seq) is unique so a resent frame is stored once."""

    __tablename__ = "replay_frames"
    attempt_id: Mapped[str] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column()
    label: Mapped[str] = mapped_column(String(32))
    event: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    png: Mapped[bytes] = mapped_column(LargeBinary)


# ---------------------------------------------------------------------------------------------
# Start states
# ---------------------------------------------------------------------------------------------


class StartState(Base):
    __tablename__ = "start_states"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # ss_...
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="", server_default="")
    from_: Mapped[str] = mapped_column("from", String(200))  # an image name or another ss_ id
    image: Mapped[str] = mapped_column(String(200))  # the base image at the root of the chain
    method: Mapped[str] = mapped_column(String(16))  # script | instruction | hand | save_point
    script: Mapped[str | None] = mapped_column(Text, default=None)
    instruction: Mapped[str | None] = mapped_column(Text, default=None)
    agent_id: Mapped[str | None] = mapped_column(String(200), default=None)
    task_id: Mapped[str | None] = mapped_column(String(32), default=None)
    # building | ready | failed | open | saving | closing | deleting
    status: Mapped[str] = mapped_column(String(16), default="building")
    error: Mapped[str | None] = mapped_column(Text, default=None)
    version: Mapped[int] = mapped_column(Integer, default=0)  # current (latest ready) version; 0 = none yet
    runner_id: Mapped[str | None] = mapped_column(String(32), default=None)
    runner_labels: Mapped[list[Any]] = mapped_column(default=list)
    opened_at: Mapped[datetime | None] = mapped_column(default=None)
    last_input_at: Mapped[datetime | None] = mapped_column(default=None)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class StartStateVersion(Base):
    __tablename__ = "start_state_versions"
    start_state_id: Mapped[str] = mapped_column(ForeignKey("start_states.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    runner_id: Mapped[str] = mapped_column(String(32))
    size_bytes: Mapped[int | None] = mapped_column(Integer, default=None)
    # Pushed by its runner to an OCI registry ("host[:port]/prefix/states@sha256:..."): any runner with
    # that registry and the base image can take a lease on it (docs/start-states.md). None: its runner only.
    registry_ref: Mapped[str | None] = mapped_column(String(600), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(default=None)


class LiveInput(Base):
    """What a person sent an open machine through one live view (gh_server/live/screen_relay.py): who, when,
    how many events. Never what they typed."""

    __tablename__ = "live_inputs"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # li_...
    start_state_id: Mapped[str] = mapped_column(ForeignKey("start_states.id", ondelete="CASCADE"), index=True)
    key_id: Mapped[str] = mapped_column(String(32))
    key_name: Mapped[str] = mapped_column(String(200))
    started_at: Mapped[datetime] = mapped_column()  # the view's first input
    ended_at: Mapped[datetime] = mapped_column()  # its last
    key_events: Mapped[int] = mapped_column(Integer, default=0)  # key presses (a press and its release: one)
    pointer_events: Mapped[int] = mapped_column(Integer, default=0)  # moves, presses and releases
    clipboard_events: Mapped[int] = mapped_column(Integer, default=0)  # clipboard texts pasted in


class RunnerJob(Base):
    """A start-state job for a runner (build, open, save, close, delete), delivered over the gateway."""

    __tablename__ = "runner_jobs"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # jb_...
    runner_id: Mapped[str | None] = mapped_column(String(32), default=None, index=True)
    start_state_id: Mapped[str] = mapped_column(String(32), index=True)
    op: Mapped[str] = mapped_column(String(16))
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)  # protocol.Job fields
    status: Mapped[str] = mapped_column(String(16), default="queued")  # queued|sent|done|failed
    error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


# ---------------------------------------------------------------------------------------------
# Webhooks
# ---------------------------------------------------------------------------------------------


class WebhookEndpoint(Base):
    __tablename__ = "webhook_endpoints"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    url: Mapped[str | None] = mapped_column(String(2000), default=None)
    secret: Mapped[str] = mapped_column(String(128))  # signing secret (the SDK's verify_webhook)
    events: Mapped[list[Any]] = mapped_column(default=list)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookDelivery(Base):
    __tablename__ = "webhook_deliveries"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # evt_...
    event_type: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(default=utcnow, index=True)
    delivered_at: Mapped[datetime | None] = mapped_column(default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


# ---------------------------------------------------------------------------------------------
# Several processes on one database (docs/operations.md)
# ---------------------------------------------------------------------------------------------


class MachineGrant(Base):
    """What a machine-API token allows (an attempt's machine, while its task runs), shared by every
    gh-server process so that any of them answers an agent. The token itself is never stored."""

    __tablename__ = "machine_grants"
    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 hex
    attempt_id: Mapped[str] = mapped_column(String(32), index=True)
    runner_id: Mapped[str] = mapped_column(String(32))
    # Set for the agent of an instruction start state (its machine is addressed by start state).
    start_state_id: Mapped[str | None] = mapped_column(String(32), default=None)
    max_steps: Mapped[int | None] = mapped_column(Integer, default=None)
    steps: Mapped[int] = mapped_column(Integer, default=0)
    questions: Mapped[int] = mapped_column(Integer, default=0)
    approvals: Mapped[int] = mapped_column(Integer, default=0)
    # From then on the models get the screen masked (a guest may echo a typed secret).
    secret_typed: Mapped[bool] = mapped_column(Boolean, default=False)
    customer_error: Mapped[str | None] = mapped_column(Text, default=None)
    # A request the machine failed under the agent (ours: an agent that then gives up is our error).
    machine_failure: Mapped[str | None] = mapped_column(Text, default=None)
    # A step past max_steps was asked: the task ends (the process running the agent stops it).
    step_limit_hit: Mapped[bool] = mapped_column(Boolean, default=False)
    # A grant whose process died is dead at this time anyway (the task's time limit and a slack).
    expires_at: Mapped[datetime] = mapped_column(index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class MachineRelay(Base):
    """A machine request waiting for the process that holds its runner's websocket (PostgreSQL only;
    NOTIFY says one is here, a short poll catches a missed notification). The asker deletes it."""

    __tablename__ = "machine_relay"
    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    runner_id: Mapped[str] = mapped_column(String(32), index=True)
    request: Mapped[dict[str, Any]] = mapped_column(default=dict)  # protocol.MachineRequest
    claimed_by: Mapped[str | None] = mapped_column(String(64), default=None)
    response: Mapped[dict[str, Any] | None] = mapped_column(default=None)  # protocol.MachineResponse
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
