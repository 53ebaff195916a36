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


class ErrorCode(StrEnum):
    """`ErrorMsg.code`: why a frame was not applied (either side; the session stays up)."""

    BAD_JSON = "bad_json"
    BAD_MESSAGE = "bad_message"
    UNKNOWN_TYPE = "unknown_type"
    UNSUPPORTED = "unsupported"
    REFUSED = "refused"
    INTERNAL = "internal"
