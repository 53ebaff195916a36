"""The runner <-> server protocol: one module, shared by gh_runner and gh_server.

JSON text frames over one websocket that the runner opens to `/v1/runners/connect` with
`Authorization: Bearer gh_rn_...`. Every frame is one of the pydantic models below, told apart
by `type`. `docs/protocol.md` explains who sends what, when, and the guarantees.

Parsing never raises anything but `ProtocolError`, so a peer can always answer a bad frame with
an `error` message and carry on.
"""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from gh_wire.input import InputEvent
from gh_wire.vocab import AgentFault, CancelReason, ErrorCause, ErrorCode, ExecFreeze, FailReason, ViewEndReason

PROTOCOL_VERSION = 1
# The longest task the wire carries (limits.minutes): a day. A server allows up to its own
# max_task_minutes (60 by default, the Evals API's documented bound); a lab raises it for long tries.
MAX_TASK_MINUTES = 24 * 60
MAX_FRAME_BYTES = 16 * 1024 * 1024  # a replay frame (PNG, base64) fits well under this

# Websocket close codes (4000-4999 are ours, RFC 6455 section 7.4.2).
# Every runner token starts with this (API keys start gh_live_): a runner can tell an API key pasted as its token.
RUNNER_TOKEN_PREFIX = "gh_rn_"
CLOSE_TOKEN_REVOKED = 4001  # token unknown or revoked: do not retry hot
CLOSE_PROTOCOL_UNSUPPORTED = 4002  # no common protocol version
CLOSE_REPLACED = 4003  # another connection with the same token took over
CLOSE_SERVER_SHUTDOWN = 4004  # server going away: reconnect with backoff
CLOSE_HEARTBEAT_TIMEOUT = 4008  # the peer was silent past the dead-peer bound
CLOSE_VIEW_ENDED = 4010  # a live view's socket (runner's or viewer's) ended; the close reason is a ViewEndReason

# A live view's bytes go on a websocket of their own, never on the control connection: the runner
# dials this (Bearer runner token) when the server sends `view_open` (docs/protocol.md, "Live views").
VIEW_PATH = "/v1/runners/views/{view_id}"

ATTEMPT_STATUSES = ("preparing", "running", "checking", "done")
Outcome = Literal["passed", "failed", "error"]


class MachineRefusal(StrEnum):
    """Why a machine request was answered `ok=False` without reaching (or leaving) the machine."""

    REQUEST_TOO_LARGE = "request_too_large"  # the request, encoded, is over the websocket frame limit
    RESPONSE_TOO_LARGE = "response_too_large"  # the answer (exec output, screenshot) is over it
    # An input event the machine cannot deliver (an unknown key name, a character outside the keymap):
    # the agent's request was wrong, the machine is fine.
    INPUT_NOT_SUPPORTED = "input_not_supported"
    # The guest channel failed while the requester's own script ran (an agent's exec runs elevated: it can
    # kill or stop the guest agent), on a guest the hypervisor still runs: its script's doing, not ours.
    CHANNEL_LOST_IN_EXEC = "channel_lost_in_exec"
    # A person took the machine over while the request waited (docs/agents.md, "Takeover"): an input or
    # exec planned on the screen before is not done; the agent looks again. Neither side's fault.
    TAKEN_OVER = "taken_over"
    # The accessibility tree (op `accessibility`, docs/desktop-guests.md): the image has no signed-in
    # desktop session or no AT-SPI bus in it (linux-tiny); the tree is over the size cap; its read ran
    # past its time bound. None is the machine's failure.
    NO_ACCESSIBILITY = "no_accessibility"
    ACCESSIBILITY_TOO_LARGE = "accessibility_too_large"
    ACCESSIBILITY_TIMEOUT = "accessibility_timeout"
    # The machine went back to a save point since the agent last acted (its runner was lost and the
    # attempt goes on from the save point: docs/agents.md, "Save points"): the input or exec was
    # planned on a screen now gone and is not done; the agent looks again. Neither side's fault.
    RESTORED = "machine_restored"
    # The machine cannot be reached right now: its runner is not connected, or the machine is being made
    # again from a save point. Nothing was done: the server sends the request again once it can.
    AWAY = "machine_away"
    # The runner's link was lost after the request was sent and before it answered: whether an input or
    # exec was done is not known (a look is simply asked again). Ours, not the agent's.
    LINK_LOST = "link_lost"
    # The runner holds no such attempt: not yet (the server moved a lost runner's attempt here and its lease
    # is still on the way) or no more (it ended here). Nothing was done. Sent only to a server whose welcome
    # said `not_here_refusals`: the server asks again while the attempt is still running on that runner.
    NOT_HERE = "attempt_not_here"


class LeaseRefusal(StrEnum):
    """Typed reasons a runner refuses a lease (the `reason` text says the details). The server reads
    the code: how long it leaves that runner alone for that attempt depends on it."""

    DISK_LOW = "disk_low"  # the runner's state dir has less free space than it keeps in reserve
    IMAGE_MISSING = "image_missing"  # the lease's image is not (or no longer) on this runner
    VERSION_MISSING = "version_missing"  # the start-state version is not held here
    DRAINING = "draining"  # the runner is draining or shutting down: it takes no new work
    NO_SLOT = "no_slot"  # every slot is busy (the server's count was stale)
    LABEL_MISMATCH = "label_mismatch"  # the case's runs_on is not a label of this runner
    INVALID_LEASE = "invalid_lease"  # the lease cannot be run as sent (an id unsafe for a file name)
    DUPLICATE = "duplicate"  # the attempt already finished here; its result is being re-sent
    JOURNAL_FAILED = "journal_failed"  # the runner cannot write its journal (disk full, read-only)
    START_FAILED = "start_failed"  # the runner could not set the attempt up
    HYPERVISOR_DOWN = "hypervisor_down"  # the hypervisor does not answer: the runner is paused
    REGISTRY_UNAVAILABLE = "registry_unavailable"  # the version is not held here and the registry is down,
    # answers 5xx, times out or refuses our credentials: offer it to a holder, or again later
    REGISTRY_INVALID = "registry_invalid"  # what the registry sent is not the version: a blob's digest did not
    # match, or the manifest is not a start state of ours (nothing was kept)


class FrameTooLarge(Exception):
    """A message whose encoded frame is over `MAX_FRAME_BYTES`: it must not be sent, since the peer
    (websockets' `max_size`, uvicorn's `ws_max_size`) would close the whole connection with 1009."""

    def __init__(self, msg_type: str, size: int, limit: int) -> None:
        super().__init__(f"{msg_type} frame of {size} bytes is over the websocket limit of {limit} bytes")
        self.msg_type = msg_type
        self.size = size
        self.limit = limit


class TaskEndReason(StrEnum):
    """Why an agent's task ended. None of these is an `error`: the agent's own failures are scored by
    the check after, and only our side (machine, setup, checks, runner, judge, customer) makes errors."""

    FINISHED = "finished"  # the agent said it was done
    TIME_LIMIT = "time_limit"  # limits.minutes stopped it (perhaps mid-exec or mid-input)
    STEP_LIMIT = "step_limit"  # limits.steps stopped it
    AGENT_FAILED = "agent_failed"  # its process exited non-zero, or its endpoint answered an error


class ProtocolError(Exception):
    """A frame that is not valid JSON, not an object, or not a known, well-formed message."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Msg(BaseModel):
    # Unknown fields are ignored so a newer peer can add optional fields without breaking us.
    model_config = ConfigDict(extra="ignore")


# ---------------------------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------------------------


class ImageAd(_Msg):
    name: str
    os: str
    version: str
    checksum: str
    pooled: bool = False  # machines of it wait paused in the runner's hot pool: a lease starts at once


class HeldVersion(_Msg):
    start_state_id: str
    version: int
    pooled: bool = False  # runner -> server: machines of it wait paused in the runner's hot pool


class Limits(_Msg):
    minutes: int = Field(default=10, ge=1, le=MAX_TASK_MINUTES)
    steps: int | None = Field(default=None, ge=1, le=500)
    # Added without a protocol bump: save the machine every this many minutes of the task (None: only
    # when the agent asks). An older runner ignores it and saves nothing (docs/start-states.md).
    save_point_minutes: int | None = Field(default=None, ge=1, le=MAX_TASK_MINUTES)


class StartStateRef(_Msg):
    """The frozen start state of a lease: an image, or a saved version of a start state."""

    kind: Literal["image", "state"]
    image: str  # the base image (for a state: the image it was made from)
    start_state_id: str | None = None
    version: int | None = None


class Checkpoint(_Msg):
    """One scored part of a case's check (`success.checkpoints`): its script prints a score like a
    check_script does, and the try's score is the weighted mean (docs/agents.md, "Scores")."""

    name: str
    check_script: str
    weight: float = Field(default=1.0, gt=0.0)


class CheckpointScore(_Msg):
    """What one checkpoint scored, in the result: after the task, and before it (None when no
    before ran, as for a case that errored first)."""

    name: str
    weight: float
    score: float = Field(ge=0.0, le=1.0)
    before_score: float | None = Field(default=None, ge=0.0, le=1.0)


class FrozenCase(_Msg):
    """What the runner needs of a test case: the copy frozen when the run started.

    Never the customer's secrets: the simulated customer runs on the server side and only what it
    types reaches the machine, as input events.
    """

    test_case_id: str
    key: str | None = None
    name: str
    prompt: str
    setup_script: str | None = None
    check_script: str | None = None
    # Added without a protocol bump: the case's checkpoints, its check_script first as `check` when it
    # has both (gh_server/attempts/lease.py). This runner runs these in place of check_script; an older
    # one ignores the field and scores check_script alone (docs/protocol.md, "Scores").
    checkpoints: list[Checkpoint] = Field(default_factory=list)
    limits: Limits = Field(default_factory=Limits)
    runs_on: str = "vm"


class CheckOutput(_Msg):
    exit_code: int | None = None
    stdout_tail: str = ""
    stderr_tail: str = ""
    # "True" only at score 1, "False" below (what a runner before scores sent; an older server reads it).
    verdict: Literal["True", "False"] | None = None
    # The check's score in [0, 1] (True 1, False 0; gh_runner/outcome.py); None when it printed none, or
    # from an older runner (the server then reads the verdict).
    score: float | None = Field(default=None, ge=0.0, le=1.0)
    timed_out: bool = False
    truncated: bool = False

    def scored(self) -> float | None:
        """The score, from an older runner's verdict when it sent none."""
        if self.score is not None:
            return self.score
        return None if self.verdict is None else 1.0 if self.verdict == "True" else 0.0


class AttemptMetrics(_Msg):
    active_seconds: float = 0.0
    steps: int = 0
    questions: int = 0
    approvals: int = 0
    phase_seconds: dict[str, float] = Field(default_factory=dict)
    # How the attempt's machine was made: cold (booted), restored (memory image read in full),
    # lazy (memory mapped, read on touch) or pooled (a paused machine from the hot pool).
    machine_origin: str | None = None
    # A model agent's own account (TaskEnd.usage), passed through: turns, tokens, cost_cents, seconds.
    agent_usage: dict[str, Any] | None = None
    # The agent started this many seconds into the task (the link was down when the task began, and
    # the server started the agent when it heard of the task from the hello): time the agent lost.
    task_seconds_lost: float | None = None
    # Seconds a person held the machine during the task (`task_hold`): not counted in active_seconds
    # nor against limits.minutes. None when nobody took it over.
    held_seconds: float | None = None
    # Added without a protocol bump: how many times the attempt went on from a save point after its
    # runner was lost (`Lease.restore`). None when it never did.
    resumed: int | None = None


class SavePoint(_Msg):
    """A running attempt's machine (disk and memory) saved without ending its task: a start-state
    version on the runner that made it, stored as `save_point_id` version 1 (docs/start-states.md)."""

    save_point_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,128}$")
    step: int = Field(ge=0)  # the agent's input and exec requests served before it
    created_at: datetime
    bytes: int = Field(ge=0)
    # Added without a protocol bump: the task's own time when it was made (held time not counted), so
    # an attempt that goes on from it has the rest of its time limit (None from an older runner).
    task_seconds: float | None = Field(default=None, ge=0)
    # Added without a protocol bump: where the runner pushed it ("host[:port]/prefix/states@sha256:..."),
    # when it has a registry: another runner pulling from there can go on from it (docs/start-states.md).
    registry_ref: str | None = Field(default=None, max_length=600)


class Restore(_Msg):
    """A lease that goes on with an attempt from its save point (its runner was lost mid-task): the
    machine is the save point's, the task picks up at its step and task time, and the agent is told
    (docs/agents.md, "Save points"). The lease's start state is the save point's version."""

    save_point: SavePoint
    kept: list[SavePoint] = Field(default_factory=list)  # the attempt's save points so far, oldest first
    resumed: int = Field(ge=1)  # this is the attempt's n-th resume
    replay_seq: int = Field(default=0, ge=0)  # the replay's next frame number (frames go on after the old ones)


class AttemptResult(_Msg):
    attempt_id: str
    outcome: Outcome
    error: str | None = None  # plain reason an operator can act on (phase, what the guest said)
    error_phase: str | None = None
    error_cause: ErrorCause | None = None  # for an error: the case's, or ours (None from an older runner: ours)
    check_before: CheckOutput | None = None
    check_after: CheckOutput | None = None
    answer: str | None = None
    metrics: AttemptMetrics = Field(default_factory=AttemptMetrics)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    # The case has no check_script (rubric only): the runner ran no check, so outcome "passed" is
    # provisional and the server decides it with the rubric judge.
    check_absent: bool = False
    task_limit_reached: bool = False  # the task was stopped at limits.minutes (and then checked)
    task_end: TaskEndReason | None = None  # why the task ended (None: it never started)
    task_note: str | None = None  # what the agent's side said as it ended (an exit code, a refusal)
    task_fault: AgentFault | None = None  # agent_failed because of what it sent (gh_wire.answer)
    failed_reason: FailReason | None = None  # `failed` by a rule, not by the check's verdict
    # Added without a protocol bump: each checkpoint's score when the lease had checkpoints (check_after
    # then carries their weighted mean as its score, check_before the mean before the task).
    checkpoints: list[CheckpointScore] | None = None
    # Added without a protocol bump: the save points still kept on the runner, oldest first.
    save_points: list[SavePoint] | None = None
    # Added without a protocol bump: the error a restarted runner reports for an attempt its previous
    # process left in flight. The server decided that attempt at the runner's hello (an error, or it
    # went on from a save point), so it applies no such result to an attempt still running.
    interrupted: bool = False


# ---------------------------------------------------------------------------------------------
# Runner -> server
# ---------------------------------------------------------------------------------------------


class SavePointMade(_Msg):
    """A running attempt's machine was saved (periodically, or the agent asked): the server keeps it on
    the attempt, so the attempt can go on from it if this runner is lost. Best effort: sent only to a
    server whose welcome said `save_points_told`; one the server missed is in the result's list."""

    type: Literal["save_point_made"] = "save_point_made"
    attempt_id: str
    save_point: SavePoint


class AttemptHandoff(_Msg):
    """The runner is draining with `--migrate`: it saved the attempt's machine now and pushed it to its
    registry (`save_point`, with its `registry_ref`), and asks the server to have the attempt go on on
    another runner from there. The server answers `cancel` (reason `migrated`) once another runner has
    it; without one, the attempt runs on here as any attempt of a draining runner. Sent only to a server
    whose welcome said `save_points_told`."""

    type: Literal["attempt_handoff"] = "attempt_handoff"
    attempt_id: str
    save_point: SavePoint


class InFlightPhase(_Msg):
    """Where an in-flight attempt is, as the hello reports it: the runner's last `attempt_status`,
    which may never have reached the server (sent while the link was down)."""

    attempt_id: str
    status: Literal["preparing", "running", "checking", "done"]
    phase: str
    at: datetime  # when the attempt entered this phase (the runner's clock)


class Hello(_Msg):
    type: Literal["hello"] = "hello"
    protocol: int = PROTOCOL_VERSION
    version: str
    name: str
    labels: list[str] = Field(default_factory=list)
    slots: int = Field(ge=1, le=256)
    images: list[ImageAd] = Field(default_factory=list)
    start_states: list[HeldVersion] = Field(default_factory=list)
    in_flight: list[str] = Field(default_factory=list, description="attempt ids still running here")
    # The OCI registry this runner pulls start states from ("host[:port]/repository-prefix"), None
    # without one: the server may lease it a version published there that it does not hold.
    registry: str | None = None
    # Added without a protocol bump (an older server ignores both): each in-flight attempt's phase,
    # and that this runner understands `status_ack`.
    in_flight_phases: list[InFlightPhase] = Field(default_factory=list)
    status_acks: bool = False
    # Added without a protocol bump: this runner takes `view_open` (an older one is sent none).
    live_views: bool = False
    # Added without a protocol bump: this runner takes `task_hold` (an attempt on an older one cannot
    # be taken over: its task's clock would run while a person holds the machine).
    task_holds: bool = False
    # Added without a protocol bump: this runner reads a check's decimal last line (`0.5`) as a score
    # and runs a lease's `case.checkpoints`. An older one reads `0.5` as the case's error and ignores
    # checkpoints, so the server leases it no case that may score between 0 and 1 (docs/protocol.md, "Scores").
    scores: bool = False
    # Added without a protocol bump: this runner takes a lease's `restore` (an attempt going on from a
    # save point); the server does not resume an attempt on an older one.
    restores: bool = False


class LeaseAccept(_Msg):
    type: Literal["lease_accept"] = "lease_accept"
    attempt_id: str


class LeaseRefuse(_Msg):
    type: Literal["lease_refuse"] = "lease_refuse"
    attempt_id: str
    reason: str
    code: LeaseRefusal | None = None  # set when the refusal has a typed reason


class AttemptStatus(_Msg):
    type: Literal["attempt_status"] = "attempt_status"
    attempt_id: str
    status: Literal["preparing", "running", "checking", "done"]
    phase: str
    at: datetime


class AttemptFinished(_Msg):
    """Sent after the result is journaled; re-sent until the server answers `result_ack`."""

    type: Literal["attempt_result"] = "attempt_result"
    result: AttemptResult


class ReplayFrame(_Msg):
    type: Literal["replay_frame"] = "replay_frame"
    attempt_id: str
    seq: int = Field(ge=0)
    at: datetime
    label: str  # "first", "last", "input", "change", a phase name
    png_b64: str
    event: dict[str, Any] | None = None  # the input event that preceded this frame, redacted


class ExecFrozen(_Msg):
    """An exec that stood still while it ran (gh_runner/machine_requests.py): why, and for how many
    seconds in all (a hold that began before it started counts from its start)."""

    reason: ExecFreeze
    seconds: float = Field(ge=0)


class MachineResponse(_Msg):
    type: Literal["machine_response"] = "machine_response"
    request_id: str
    ok: bool
    error: str | None = None
    refusal: MachineRefusal | None = None  # set when the request was refused rather than failed
    png_b64: str | None = None  # for screen
    xml: str | None = None  # for accessibility: the session's AT-SPI tree (providers/qemu/atspi_tree.py)
    exit_code: int | None = None  # for exec
    stdout: str | None = None
    stderr: str | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    frozen: ExecFrozen | None = None  # for exec: it was frozen while it ran (None: never)
    # Refused because the task was stopped (its time limit): the agent's end, not a machine failure.
    stopped: TaskEndReason | None = None
    save_point: SavePoint | None = None  # for save_point


class JobResult(_Msg):
    """The end of a start-state job (build, save, delete)."""

    type: Literal["job_result"] = "job_result"
    job_id: str
    ok: bool
    error: str | None = None
    start_state_id: str | None = None
    version: int | None = None
    size_bytes: int | None = None
    # The saved version, pushed to the runner's registry: "host[:port]/repo@sha256:..." (None: not
    # pushed; `registry_error` says why when a push was tried and failed; the save itself stands).
    registry_ref: str | None = None
    registry_error: str | None = None


class ViewRefused(_Msg):
    """A `view_open` the runner could not serve (it dials no view socket), or a view it ended
    before its socket was up."""

    type: Literal["view_refused"] = "view_refused"
    view_id: str
    reason: ViewEndReason
    message: str = ""


# ---------------------------------------------------------------------------------------------
# Server -> runner
# ---------------------------------------------------------------------------------------------


class Welcome(_Msg):
    type: Literal["welcome"] = "welcome"
    protocol: int = PROTOCOL_VERSION
    runner_id: str
    heartbeat_interval: float = Field(default=10.0, gt=0)
    dead_after: float = Field(default=45.0, gt=0)
    resume: list[str] = Field(
        default_factory=list, description="in-flight attempt ids the server still wants finished"
    )
    name: str | None = Field(
        default=None, description="the name the runner was registered with (a runner not given --name takes it)"
    )
    # The server acknowledges every `attempt_status` it applies with `status_ack` (the runner said it
    # understands them in its hello): a task whose start was never acknowledged had no agent.
    status_acks: bool = False
    # Added without a protocol bump: this server takes `save_point_made` (a runner tells it of a save
    # point only then: an older server would answer each with an error).
    save_points_told: bool = False
    # Added without a protocol bump: this server reads the machine refusal `attempt_not_here` (an older
    # server would take the unknown value for a broken answer).
    not_here_refusals: bool = False


class Lease(_Msg):
    type: Literal["lease"] = "lease"
    attempt_id: str
    test_run_id: str | None = None
    agent_id: str
    try_number: int = 1
    case: FrozenCase
    start_state: StartStateRef
    script_timeout: float = Field(default=600.0, gt=0)
    # Added without a protocol bump: how many of the attempt's save points the runner keeps (the
    # server's `save_points_kept`); older ones are deleted as new ones are made.
    save_points_kept: int = Field(default=3, ge=1, le=50)
    # Added without a protocol bump: the attempt goes on from this save point (sent only to a runner
    # whose hello said `restores`).
    restore: Restore | None = None


class Cancel(_Msg):
    type: Literal["cancel"] = "cancel"
    attempt_id: str
    reason: str = CancelReason.CANCELLED  # the server sends a CancelReason; a runner shows any text


class ResultAck(_Msg):
    type: Literal["result_ack"] = "result_ack"
    attempt_id: str


class StatusAck(_Msg):
    """The server applied an attempt's status (for `running`: its agent was started, or it was
    answered with a `task_end` saying why it cannot be). Sent only to a runner whose hello said
    `status_acks`; the hello's `in_flight_phases` carries every status not yet acknowledged."""

    type: Literal["status_ack"] = "status_ack"
    attempt_id: str
    status: Literal["preparing", "running", "checking", "done"]
    phase: str
    # Set when the agent started late: the task had begun this many seconds before the server knew.
    late_seconds: float | None = None


class MachineRequest(_Msg):
    """A request on the machine of an attempt (task phase) or of an open start state."""

    type: Literal["machine_request"] = "machine_request"
    request_id: str
    attempt_id: str | None = None
    job_id: str | None = None
    start_state_id: str | None = None  # the open machine of a start state (after an `open` job)
    op: Literal["screen", "input", "exec", "save_point", "accessibility"]
    events: list[InputEvent] = Field(default_factory=list)
    script: str | None = Field(default=None, max_length=100_000)
    env: dict[str, str] = Field(default_factory=dict)
    timeout: float = Field(default=120.0, gt=0, le=3600)
    redact: list[str] = Field(default_factory=list, description="values never to echo into a replay")
    # What the agent meant by this request (a model agent's step number, its words, the action), put on
    # the request's replay frame; redacted like typed text.
    note: dict[str, Any] | None = None


class TaskEnd(_Msg):
    """The agent is done (or gave up): the runner moves on to the check after."""

    type: Literal["task_end"] = "task_end"
    attempt_id: str
    answer: str = ""
    steps: int = 0
    questions: int = 0
    approvals: int = 0
    error: str | None = None  # a failure on our side (customer model, machine): the attempt becomes `error`
    reason: TaskEndReason = TaskEndReason.FINISHED  # why the agent stopped, when there is no error
    note: str | None = None  # e.g. "agent cmd exited with code 3: ..." (for the attempt, never an error)
    fault: AgentFault | None = None  # with agent_failed: what the agent sent broke its contract (gh_wire.answer)
    # A model agent's usage (steps, tokens in/out/cached, cost_cents, model seconds per step); the runner
    # puts it in the attempt's metrics.
    usage: dict[str, Any] | None = None


class Job(_Msg):
    """A start-state job: build from a script, open for hand work, save, close, delete."""

    type: Literal["job"] = "job"
    job_id: str
    op: Literal["build", "open", "save", "close", "delete"]
    start_state_id: str
    source: StartStateRef | None = None
    version: int | None = None
    script: str | None = None
    script_timeout: float = Field(default=1800.0, gt=0)


class ViewOpen(_Msg):
    """Open a live view of a machine: the runner opens the machine's screen stream and dials
    `VIEW_PATH` with this `view_id`, then pipes RFB bytes both ways on that socket. Exactly one of
    `start_state_id` (its open machine) and `attempt_id` (the attempt's machine) is set."""

    type: Literal["view_open"] = "view_open"
    view_id: str = Field(min_length=8, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    start_state_id: str | None = None
    attempt_id: str | None = None
    # A watcher of an attempt (never its input): the runner ends the view with `masked` once a secret
    # is typed in that attempt, as its replay is masked from then. The person holding a takeover, and
    # an admin at an open start state, are not watch-only.
    watch_only: bool = False


class TaskHold(_Msg):
    """A person holds (`held`) or has handed back (not `held`) an attempt's machine during its task:
    the task's clock (limits.minutes) stops while it is held, and resumes at hand-back."""

    type: Literal["task_hold"] = "task_hold"
    attempt_id: str
    held: bool


class ViewClose(_Msg):
    """End a live view (the viewer left, or its ticket's key was revoked)."""

    type: Literal["view_close"] = "view_close"
    view_id: str
    reason: ViewEndReason = ViewEndReason.CLOSED


# ---------------------------------------------------------------------------------------------
# Both ways
# ---------------------------------------------------------------------------------------------


class Heartbeat(_Msg):
    type: Literal["heartbeat"] = "heartbeat"
    at: datetime
    busy: int | None = None  # runner -> server
    slots: int | None = None
    draining: bool | None = None  # runner -> server: shutting down, offer it no leases
    paused: LeaseRefusal | None = None  # runner -> server: takes no leases for this reason (hypervisor_down)


class ErrorMsg(_Msg):
    """The answer to a frame that could not be understood; the session stays up."""

    type: Literal["error"] = "error"
    code: ErrorCode
    message: str
    ref_type: str | None = None


RunnerMessage = Annotated[
    Hello
    | Heartbeat
    | LeaseAccept
    | LeaseRefuse
    | AttemptStatus
    | AttemptFinished
    | ReplayFrame
    | MachineResponse
    | JobResult
    | ViewRefused
    | SavePointMade
    | AttemptHandoff
    | ErrorMsg,
    Field(discriminator="type"),
]
ServerMessage = Annotated[
    Welcome | Heartbeat | Lease | Cancel | ResultAck | StatusAck | MachineRequest | TaskEnd | Job | ViewOpen
    | ViewClose | TaskHold | ErrorMsg,
    Field(discriminator="type"),
]

_runner_adapter: TypeAdapter[Any] = TypeAdapter(RunnerMessage)
_server_adapter: TypeAdapter[Any] = TypeAdapter(ServerMessage)
_RUNNER_TYPES = {"hello", "heartbeat", "lease_accept", "lease_refuse", "attempt_status", "attempt_result",
                 "replay_frame", "machine_response", "job_result", "view_refused", "save_point_made",
                 "attempt_handoff", "error"}
_SERVER_TYPES = {"welcome", "heartbeat", "lease", "cancel", "result_ack", "status_ack", "machine_request",
                 "task_end", "job", "view_open", "view_close", "task_hold", "error"}


def _parse(raw: str | bytes, adapter: TypeAdapter[Any], known: set[str]) -> Any:
    if isinstance(raw, bytes):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "binary frames are not part of the protocol; send JSON text")
    if len(raw) > MAX_FRAME_BYTES:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"frame of {len(raw)} bytes is over the {MAX_FRAME_BYTES} limit")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise ProtocolError(ErrorCode.BAD_JSON, f"frame is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(data, dict):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "a frame must be a JSON object with a 'type'")
    mtype = data.get("type")
    if not isinstance(mtype, str):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "a frame must have a string 'type'")
    if mtype not in known:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {mtype[:64]!r}")
    try:
        return adapter.validate_python(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"{mtype}: {where}: {first.get('msg', 'invalid')}"[:500]) from None
    except RecursionError:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "frame nests too deeply") from None


def parse_runner_message(raw: str | bytes) -> Any:
    """Parse a frame the runner sent (used by the server)."""
    return _parse(raw, _runner_adapter, _RUNNER_TYPES)


def parse_server_message(raw: str | bytes) -> Any:
    """Parse a frame the server sent (used by the runner)."""
    return _parse(raw, _server_adapter, _SERVER_TYPES)


def encode(msg: BaseModel) -> str:
    return msg.model_dump_json(exclude_none=False)


def frame_bytes(frame: str) -> int:
    """The size a websocket peer counts against its limit: the UTF-8 payload."""
    return len(frame) if frame.isascii() else len(frame.encode("utf-8", "surrogatepass"))


def encode_checked(msg: BaseModel, limit: int = MAX_FRAME_BYTES) -> str:
    """`encode`, refusing a frame the peer would not accept.

    Every sender calls this before `send`, on both sides: a frame over the peer's `max_size` makes
    the peer close the connection (1009), which fails every other request on it.

    Raises:
        FrameTooLarge: the encoded frame is over `limit` bytes.
    """
    frame = encode(msg)
    size = frame_bytes(frame)
    if size > limit:
        raise FrameTooLarge(str(getattr(msg, "type", type(msg).__name__)), size, limit)
    return frame


def too_large_reply(msg: BaseModel, err: FrameTooLarge) -> BaseModel | None:
    """What the sender of a too-large message sends instead, if anything: a machine answer becomes
    a typed refusal of that request (small, so it always fits); other messages have no stand-in."""
    if isinstance(msg, MachineResponse):
        return MachineResponse(
            request_id=msg.request_id, ok=False, refusal=MachineRefusal.RESPONSE_TOO_LARGE,
            error=f"the machine's answer is {err.size} bytes encoded, over the runner-server frame limit of "
                  f"{err.limit} bytes; ask for less output (a smaller screen, a shorter exec output)",
        )
    return None
