"""The closed vocabularies both halves share: each a StrEnum whose values are what goes on the wire and
into the database (so a value never changes without a migration and a protocol version).

`LeaseRefusal`, `MachineRefusal` and `TaskEndReason` live beside the messages that carry them in
`gh_wire.protocol`; this module holds the ones the server's rows and API use as well.
"""

from __future__ import annotations

from enum import StrEnum


class AttemptStatus(StrEnum):
    """An attempt's row status (`attempts.status`), in the order an attempt moves through them."""

    QUEUED = "queued"  # waiting for a runner
    LEASED = "leased"  # offered to a runner, not yet started there
    PREPARING = "preparing"  # the machine is made, the setup and the check before run
    RUNNING = "running"  # the agent's task
    CHECKING = "checking"  # the check after the task
    DONE = "done"  # has an outcome
    CANCELLED = "cancelled"  # its run was cancelled (no outcome)


# Held by a runner (they count against its slots).
ACTIVE: frozenset[AttemptStatus] = frozenset(
    {AttemptStatus.LEASED, AttemptStatus.PREPARING, AttemptStatus.RUNNING, AttemptStatus.CHECKING}
)
# Not finished yet: a run with any of these is not complete.
UNFINISHED: frozenset[AttemptStatus] = ACTIVE | {AttemptStatus.QUEUED}
# Final: nothing changes the row any more.
FINISHED: frozenset[AttemptStatus] = frozenset({AttemptStatus.DONE, AttemptStatus.CANCELLED})


class Outcome(StrEnum):
    """A finished attempt's outcome. `error` is ours (infrastructure), never a verdict on the agent."""

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"


class CancelReason(StrEnum):
    """Why the server cancels an attempt on a runner (`Cancel.reason`)."""

    RUN_CANCELLED = "the test run was cancelled"
    NOT_WANTED = "the server no longer wants this attempt"  # a reconnecting runner still had it
    CANCELLED = "cancelled"  # no reason given
    # The runner asked to hand the attempt off (`drain --migrate`) and another runner goes on with it from
    # the save point it just made: this runner's copy ends, its result is not the attempt's.
    MIGRATED = "migrated to another runner"


class ErrorCode(StrEnum):
    """`ErrorMsg.code`: why a frame was not applied (either side; the session stays up)."""

    BAD_JSON = "bad_json"
    BAD_MESSAGE = "bad_message"
    UNKNOWN_TYPE = "unknown_type"
    UNSUPPORTED = "unsupported"
    REFUSED = "refused"
    INTERNAL = "internal"


class ErrorCause(StrEnum):
    """Whose an `error` is. Both stay `error` and never count against the agent; they are told apart
    so a case's author sees their case is at fault, not the platform."""

    INFRASTRUCTURE = "infrastructure"  # machine, guest channel, runner, hypervisor, model endpoint, judge
    CASE = "case"  # the setup script failed, the check printed no verdict, or printed True before the task


class QueueWait(StrEnum):
    """What a queued attempt waits for (`attempt.queued_reason.code`, gh_server.queue_wait)."""

    NO_RUNNER = "no_runner"  # no runner is online
    PINNED_RUNNER_OFFLINE = "pinned_runner_offline"  # it must run on one runner (its start state's), offline
    NO_LABEL = "no_label"  # no runner online has the label the case runs on
    NO_IMAGE = "no_image"  # none of those has the image
    NO_VERSION = "no_version"  # none of those holds the start-state version
    # The case may score between 0 and 1 (checkpoints, an OSWorld import) and every runner that could take
    # it is older than scores: it would read the check's `0.5` as the case's error (docs/protocol.md, "Scores").
    NO_SCORES = "no_scores"
    NO_FREE_SLOT = "no_free_slot"  # a runner can take it, but every slot of every such runner is busy
    NEXT_PASS = "next_pass"  # a runner with a free slot can take it: the next lease pass offers it


class ViewEndReason(StrEnum):
    """Why a live view of a machine was refused or ended (docs/protocol.md, "Live views"). The
    runner sends it in `view_refused` or as its view socket's close reason; the server as the
    viewer's close reason."""

    # refused before any screen byte
    NO_MACHINE = "no_machine"  # the start state (attempt) has no machine running on that runner
    NO_SCREEN = "no_screen"  # the machine has no screen stream (a provider or domain without a display)
    TOO_MANY_VIEWS = "too_many_views"  # the runner's or the machine's limit of views is reached
    SCREEN_FAILED = "screen_failed"  # the hypervisor would not open the screen stream
    DIAL_FAILED = "dial_failed"  # the runner could not open its view socket to the server
    RUNNER_UNAVAILABLE = "runner_unavailable"  # the runner holding the machine is not connected, or too old
    TICKET_INVALID = "ticket_invalid"  # unknown, used or expired ticket, or a page of another origin
    # ended
    MACHINE_GONE = "machine_gone"  # the machine stopped (closed, saved, destroyed, its attempt ended)
    VIEWER_CLOSED = "viewer_closed"  # the viewer went away
    VIEWER_TOO_SLOW = "viewer_too_slow"  # the viewer stopped reading: its queue stayed full past the bound
    SEND_TIMEOUT = "send_timeout"  # the runner could not hand screen bytes to the server within the bound
    RFB_PROTOCOL = "rfb_protocol"  # the viewer sent something that is not RFB 3.8 as we accept it
    CLOSED = "closed"  # the server ended it (view_close), or the runner is shutting down
    KEY_REVOKED = "key_revoked"  # the viewer's API key was revoked (DELETE /v1/api_keys/{id})
    # The viewer sent more than a view's share (bytes or messages a second, gh_server/live/budget.py),
    # or a message over the live socket's bound (gh_server/live/sockets.py).
    VIEWER_TOO_FAST = "viewer_too_fast"
    WATCH_IDLE = "watch_idle"  # a watcher asked for no screen for the server's bound (a driver's view never idles out)
    # A secret was typed in the attempt: from then on its watchers see what its replay shows (masked
    # frames), never the display as it is. Ends a watch-only view, and refuses a new one.
    MASKED = "masked"


class TakeoverEnd(StrEnum):
    """How a person's hold on an attempt's machine ended (`attempts.takeovers[].ended_by`)."""

    HANDED_BACK = "handed_back"  # the person pressed Hand back (POST /v1/attempts/{id}/handback)
    IDLE = "idle"  # no input for the server's takeover_idle_seconds (the browser closed, the person left)
    CAP = "cap"  # the hold reached the server's takeover_cap_minutes
    ATTEMPT_ENDED = "attempt_ended"  # the attempt left its task (cancelled, its runner's link lost, an error)
    # The holder's view failed to open before any input (the runner refused it, no screen): the hold is
    # undone, its entry removed and the attempt not assisted by it. Never on an attempt's row.
    VIEW_FAILED = "view_failed"


class ExecFreeze(StrEnum):
    """Why an agent's exec was frozen while it ran (`machine_response.frozen.reason`): the exec and
    every process it started stood still, and the exec's answer says for how long (docs/agents.md)."""

    # A person held the machine (a takeover, docs/server-api.md "Takeovers"): frozen at the hold's
    # start, thawed at the hand-back.
    TAKEOVER = "takeover"


class HumanKey(StrEnum):
    """The keys a takeover's record may name (`attempts.takeovers[].events[]` of kind `key`,
    gh_server/live/human_steps.py): a closed list of keys that type no character. A chord
    (ctrl, alt, super or meta held) names its key from this list, a letter a-z, a digit 0-9 or `space`;
    any other key of a chord, and a key that types nothing and is not listed, is `other`."""

    BACKSPACE = "BackSpace"
    TAB = "Tab"
    RETURN = "Return"
    KP_ENTER = "KP_Enter"
    ESCAPE = "Escape"
    DELETE = "Delete"
    INSERT = "Insert"
    HOME = "Home"
    END = "End"
    PAGE_UP = "Page_Up"
    PAGE_DOWN = "Page_Down"
    LEFT = "Left"
    UP = "Up"
    RIGHT = "Right"
    DOWN = "Down"
    PRINT = "Print"
    PAUSE = "Pause"
    SCROLL_LOCK = "Scroll_Lock"
    CAPS_LOCK = "Caps_Lock"
    NUM_LOCK = "Num_Lock"
    MENU = "Menu"
    F1 = "F1"
    F2 = "F2"
    F3 = "F3"
    F4 = "F4"
    F5 = "F5"
    F6 = "F6"
    F7 = "F7"
    F8 = "F8"
    F9 = "F9"
    F10 = "F10"
    F11 = "F11"
    F12 = "F12"
    OTHER = "other"  # a key of a chord not named above, or a key that types nothing and is not listed


class AgentFault(StrEnum):
    """What the agent sent that broke its contract (docs/agents.md, "The answer"): the task ends as
    `agent_failed` with this as `task_end.fault`, before any check reads it. Never retried, never ours."""

    ANSWER_TOO_LONG = "answer_too_long"  # over gh_wire.answer.ANSWER_MAX_CHARS characters
    ANSWER_HAS_NUL = "answer_has_nul"  # a NUL character: no guest can carry it in an environment variable
    ANSWER_NOT_UTF8 = "answer_not_utf8"  # bytes (an HTTP body, a command's stdout) or a lone surrogate
    MODEL_STALLED = "model_stalled"  # the model's reply did not end within the agent's own call timeout


class FailReason(StrEnum):
    """Why an attempt is `failed` other than by its check's verdict (`metrics.failed_reason`), counted apart
    in results (docs/server-api.md, "How a task ended")."""

    # The agent, with exec or input during its task, left the guest's script channel dead (its guest agent
    # and executor killed for good, stopped, or removed) while the guest's kernel still runs: the check
    # cannot look, and the agent broke the one thing it was told to leave alone (gh_runner.attempt).
    CHECK_CHANNEL_LOST_IN_TASK = "check_channel_lost_in_task"
