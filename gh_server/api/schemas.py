"""Request bodies, with every limit of the Evals API (docs/security.md lists them); a violation is a 400 that
names the field."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gh_server.counts import RerunOnly
from gh_server.ids import unaddressable
from gh_wire.protocol import MAX_TASK_MINUTES

KEY_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
SCRIPT_MAX = 100_000
FACTS_MAX = 50  # facts are what the customer knows, by name (up to 50)
FACT_NAME_MAX = 200  # a name is a label such as "Wi-Fi password"
FACT_VALUE_MAX = 2000  # plain or secret: what a person would type


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def decode_script(value: Any) -> str | None:
    """A script as a string, or {"base64": ...} (UTF-8) for firewalls that refuse script-looking bodies."""
    if value is None:
        return None
    if isinstance(value, dict):
        if set(value) != {"base64"} or not isinstance(value["base64"], str):
            raise ValueError('must be a string or {"base64": "..."}')
        try:
            text = base64.b64decode(value["base64"], validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            raise ValueError("base64 is not valid base64 of UTF-8 text") from None
        value = text
    if not isinstance(value, str):
        raise ValueError('must be a string or {"base64": "..."}')
    if len(value) > SCRIPT_MAX:
        raise ValueError(f"is {len(value):,} characters; the limit is {SCRIPT_MAX:,}")
    return value


Metadata = dict[str, str]


def check_metadata(v: dict[str, str] | None) -> dict[str, str] | None:
    if v is None:
        return v
    if len(v) > 50:
        raise ValueError("has more than 50 keys")
    for k, val in v.items():
        if len(k) > 64:
            raise ValueError(f"key {k[:20]!r}... is longer than 64 characters")
        if len(val) > 500:
            raise ValueError(f"value of {k!r} is longer than 500 characters")
    return v


class SecretFact(_Body):
    secret: str = Field(max_length=FACT_VALUE_MAX)


class Customer(_Body):
    persona: str | None = Field(default=None, max_length=4000)
    facts: dict[str, str | SecretFact] | None = None
    clicks_admin_prompts: bool | None = None
    does_steps: bool | None = None

    @field_validator("facts")
    @classmethod
    def _facts(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v
        if len(v) > FACTS_MAX:
            raise ValueError(f"has {len(v)} facts; the limit is {FACTS_MAX}")
        for name, value in v.items():
            if not name or len(name) > FACT_NAME_MAX:
                raise ValueError(f"fact name {name[:40]!r} must be 1 to {FACT_NAME_MAX} characters")
            if isinstance(value, str) and len(value) > FACT_VALUE_MAX:
                raise ValueError(f"fact {name[:40]!r} is longer than {FACT_VALUE_MAX} characters")
        return v


CHECKPOINTS_MAX = 100
CHECKPOINT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# When a case has both, its check_script is one more checkpoint of weight 1 by this name (docs/agents.md).
CHECK_AS_CHECKPOINT = "check"


class CheckpointIn(_Body):
    """One scored part of a case's check: its script prints True, False or a number in [0, 1]."""

    name: str
    check_script: Any
    weight: float = Field(default=1.0, gt=0.0, le=1_000_000.0, allow_inf_nan=False)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not CHECKPOINT_NAME.fullmatch(v):
            raise ValueError("must be 1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit")
        return v

    @field_validator("check_script", mode="before")
    @classmethod
    def _script(cls, v: Any) -> str:
        text = decode_script(v)
        if not (text or "").strip():
            raise ValueError("a checkpoint needs a check_script")
        return text or ""


def checkpoints_fault(check_script: str | None, checkpoints: list[dict[str, Any]] | None) -> str | None:
    """What is wrong with a case's checkpoints as a whole (unique names, `check` taken by its
    check_script when it has one), or None."""
    names = [c["name"] for c in checkpoints or []]
    if (check_script or "").strip() and CHECK_AS_CHECKPOINT in names:
        return (f"a checkpoint is named {CHECK_AS_CHECKPOINT!r}, the name the case's check_script takes beside "
                "its checkpoints: rename it")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        return f"checkpoint names must be unique; repeated: {', '.join(dup)}"
    return None


class Success(_Body):
    check_script: Any = None
    rubric: str | None = Field(default=None, max_length=8000)
    # Scored parts of the check (docs/agents.md, "Scores"); with a check_script beside them, that script
    # is one more, named `check`, of weight 1.
    checkpoints: list[CheckpointIn] | None = Field(default=None, max_length=CHECKPOINTS_MAX)

    @field_validator("check_script", mode="before")
    @classmethod
    def _script(cls, v: Any) -> str | None:
        return decode_script(v)

    # "A check_script or a rubric (or both)" is checked where the whole case is known: in what a create
    # sends (TestCaseCreate), and on the merged case for a PATCH, which may send only the rubric.


# Nested objects are partial on every write (gh_server.api.merge): null clears a field, back to its default.
class Operator(_Body):
    approvals: Literal["approve", "deny"] | None = "approve"


class Limits(_Body):
    # Up to the wire's bound here; the server's own max_task_minutes is checked where the case is
    # stored and again when a run freezes it (gh_server/api/test_cases.py, test_runs.py).
    minutes: int | None = Field(default=10, ge=1, le=MAX_TASK_MINUTES)
    steps: int | None = Field(default=None, ge=1, le=500)
    # Save the machine every this many minutes of the task (null: the server's save_point_minutes).
    save_point_minutes: int | None = Field(default=None, ge=1, le=MAX_TASK_MINUTES)


def check_key(v: str | None) -> str | None:
    if v is None:
        return v
    if not KEY_RE.match(v):
        raise ValueError("must be 1 to 64 of A-Za-z0-9._-")
    problem = unaddressable(v)
    if problem:
        raise ValueError(problem)
    if v.startswith("tc_"):
        raise ValueError('must not start with "tc_" (that is how ids start)')
    return v


def check_tags(v: list[str] | None) -> list[str] | None:
    if v is None:
        return v
    if len(v) > 50:
        raise ValueError(f"has {len(v)} tags; the limit is 50")
    for t in v:
        if not t or len(t) > 64:
            raise ValueError(f"tag {t[:70]!r} must be 1 to 64 characters")
    return list(dict.fromkeys(v))


class TestCaseFields(_Body):
    """Every field of a test case, all optional: PATCH uses it as is; create checks the required ones."""

    __test__ = False
    key: str | None = None
    name: str | None = Field(default=None, min_length=1, max_length=200)
    prompt: str | None = Field(default=None, min_length=1, max_length=8000)
    start_state: str | None = Field(default=None, min_length=1, max_length=200)
    setup_script: Any = None
    success: Success | None = None
    customer: Customer | None = None
    operator: Operator | None = None
    limits: Limits | None = None
    runs_on: str | None = Field(default=None, min_length=1, max_length=64)
    category: str | None = Field(default=None, max_length=200)
    tags: list[str] | None = None
    metadata: Metadata | None = None
    # Not stored: says the start_state names an image no runner has advertised yet, on purpose (a runner
    # with it is coming). Without it such a case is refused, so a misspelled image is caught at once.
    allow_unknown_image: bool | None = None

    _key = field_validator("key")(classmethod(lambda cls, v: check_key(v)))
    _tags = field_validator("tags")(classmethod(lambda cls, v: check_tags(v)))
    _meta = field_validator("metadata")(classmethod(lambda cls, v: check_metadata(v)))

    @field_validator("setup_script", mode="before")
    @classmethod
    def _setup(cls, v: Any) -> str | None:
        return decode_script(v)


class TestCaseCreate(TestCaseFields):
    __test__ = False
    name: str = Field(min_length=1, max_length=200)  # type: ignore[assignment]
    prompt: str = Field(min_length=1, max_length=8000)  # type: ignore[assignment]
    start_state: str = Field(min_length=1, max_length=200)  # type: ignore[assignment]
    success: Success  # type: ignore[assignment]

    @field_validator("success")
    @classmethod
    def _one(cls, v: Success) -> Success:
        # A new case (or a batch item, which may be one) needs a way to be judged in what it sends; a
        # PATCH is checked after it is merged into the stored case.
        if not (v.check_script or "").strip() and not (v.rubric or "").strip() and not v.checkpoints:
            raise ValueError("needs a check_script, checkpoints or a rubric")
        fault = checkpoints_fault(v.check_script, [c.model_dump() for c in v.checkpoints or []])
        if fault:
            raise ValueError(fault)
        return v


class TestCaseBatchBody(_Body):
    __test__ = False
    cases: list[TestCaseCreate] = Field(min_length=1, max_length=500)
    test_set_id: str | None = None


class TestSetCaseInput(_Body):
    __test__ = False
    test_case_id: str
    repeat: int | None = Field(default=None, ge=1, le=20)


class TestSetFields(_Body):
    __test__ = False
    name: str | None = Field(default=None, min_length=1, max_length=200)
    description: str | None = Field(default=None, max_length=4000)
    repeat: int | None = Field(default=None, ge=1, le=20)
    customer: Customer | None = None
    cases: list[TestSetCaseInput] | None = Field(default=None, max_length=5000)
    metadata: Metadata | None = None
    _meta = field_validator("metadata")(classmethod(lambda cls, v: check_metadata(v)))


class TestSetCreate(TestSetFields):
    __test__ = False
    name: str = Field(min_length=1, max_length=200)  # type: ignore[assignment]


class AddCases(_Body):
    test_case_ids: list[str] = Field(min_length=1, max_length=5000)
    repeat: int | None = Field(default=None, ge=1, le=20)


class TestRunCreate(_Body):
    __test__ = False
    test_set_id: str | None = None
    test_case_ids: list[str] | None = Field(default=None, min_length=1, max_length=5000)
    agents: list[str] | None = Field(default=None, min_length=1, max_length=20)
    repeat: int | None = Field(default=None, ge=1, le=20)
    repeat_by_case: dict[str, int] | None = None
    name: str | None = Field(default=None, max_length=200)
    metadata: Metadata | None = None
    # Seconds an attempt may wait in the queue; past it, it ends as `error` saying why it waited.
    queue_timeout: float | None = Field(default=None, gt=0, le=7 * 86400)
    # Accepted for SDK compatibility; a self-hosted control plane has no app or agent versions.
    app_version: str | None = None
    agent_version: str | None = None
    cold: bool | None = None
    _meta = field_validator("metadata")(classmethod(lambda cls, v: check_metadata(v)))

    @field_validator("repeat_by_case")
    @classmethod
    def _rbc(cls, v: dict[str, int] | None) -> dict[str, int] | None:
        for k, n in (v or {}).items():
            if not isinstance(n, int) or not 1 <= n <= 20:
                raise ValueError(f"{k}: tries must be 1 to 20")
        return v

    @model_validator(mode="after")
    def _source(self) -> TestRunCreate:
        if (self.test_set_id is None) == (self.test_case_ids is None):
            raise ValueError("send test_set_id or test_case_ids (one of them)")
        return self


class Rerun(_Body):
    only: RerunOnly | None = None
    agent_version: str | None = None


class RunnerCreate(_Body):
    name: str = Field(min_length=1, max_length=200)


class StartStateCreate(_Body):
    name: str = Field(min_length=1, max_length=200)
    from_: str = Field(alias="from", min_length=1, max_length=200)
    script: Any = None
    instruction: str | None = Field(default=None, max_length=8000)
    agent_id: str | None = Field(default=None, max_length=200)
    description: str | None = Field(default=None, max_length=4000)
    metadata: Metadata | None = None
    _meta = field_validator("metadata")(classmethod(lambda cls, v: check_metadata(v)))

    @field_validator("script", mode="before")
    @classmethod
    def _script(cls, v: Any) -> str | None:
        return decode_script(v)


class StartStateUpdate(_Body):
    name: str | None = Field(default=None, min_length=1, max_length=200)
    description: str | None = Field(default=None, max_length=4000)
    metadata: Metadata | None = None
    _meta = field_validator("metadata")(classmethod(lambda cls, v: check_metadata(v)))


class SavePointStartState(_Body):
    name: str | None = Field(default=None, min_length=1, max_length=200)  # default: "<case> at step <k>"


class InputBody(_Body):
    events: list[dict[str, Any]] = Field(min_length=1, max_length=500)


class WebhookUpdate(_Body):
    url: str | None = Field(default=None, max_length=2000)
    events: list[str] | None = None
    rotate_secret: bool | None = None


class KeyCreate(_Body):
    name: str = Field(min_length=1, max_length=200)
    role: Literal["admin", "member"] = "member"


class ConsoleSignInBody(_Body):
    api_key: str = Field(min_length=1, max_length=200, repr=False)
