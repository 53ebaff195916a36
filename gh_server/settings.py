"""gh-server's configuration: one pydantic model, filled from CLI flags > GH_SERVER_* env > defaults."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails

from gh_common.configfile import read_mapping
from gh_server.ids import unaddressable
from gh_wire.protocol import MAX_TASK_MINUTES


class AgentConfig(BaseModel):
    """An external agent: a command (stdin/stdout JSON) or an HTTP endpoint. See docs/agents.md.

    Checked when the server starts, so a typo fails there rather than in the first attempt."""

    model_config = ConfigDict(extra="forbid")

    id: str
    kind: Literal["builtin", "command", "http", "osworld"] = "builtin"  # `model`: ModelAgentConfig
    builtin: Literal["noop", "reference"] | None = None  # for kind=builtin
    command: list[str] | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    timeout: float = Field(default=3600.0, gt=0)
    # A command agent's environment beyond PATH, LANG, HOME and GH_MACHINE_*: these values, and these
    # names copied from gh-server's own environment (never a GH_SERVER_* one). Nothing else is passed.
    env: dict[str, str] = Field(default_factory=dict, repr=False)
    pass_env: list[str] = Field(default_factory=list)
    # kind osworld (gh_server/agents/osworld/): an agent written to OSWorld's loop, `module:factory` returning
    # an object with reset() and predict(instruction, obs), imported with `python_path` ahead of sys.path.
    agent: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    python_path: list[str] = Field(default_factory=list)
    # The interpreter of the loop and the user's agent (its dependencies' venv); the sandbox's uid must reach it.
    python: str = "/usr/bin/python3"
    observation: Literal["screenshot", "a11y_tree", "screenshot_a11y_tree"] = "screenshot"
    action_space: Literal["pyautogui", "computer_13"] = "pyautogui"
    max_steps: int = Field(default=15, ge=1, le=10_000)  # OSWorld's run.py default
    sleep_after_execution: float = Field(default=0.0, ge=0, le=60)  # OSWorld's run.py default

    @field_validator("id")
    @classmethod
    def _addressable(cls, v: str) -> str:
        # GET /v1/test_runs/{id}/agents/{agent_id} takes it as a path segment.
        problem = unaddressable(v) if v else "must not be empty"
        if problem:
            raise ValueError(f"agent id {v!r} {problem}")
        return v

    @model_validator(mode="after")
    def _complete(self) -> AgentConfig:
        if self.kind == "command" and not self.command:
            raise ValueError("kind command needs a non-empty `command` (argv list)")
        if self.kind == "http" and not self.url:
            raise ValueError("kind http needs a `url`")
        if self.kind == "osworld" and not self.agent:
            raise ValueError("kind osworld needs `agent`: module:factory")
        return self


class ModelApi(StrEnum):
    """The wire API a model agent speaks (gh_server.agents.model)."""

    ANTHROPIC = "anthropic"  # Messages API with the computer-use tool
    OPENAI_RESPONSES = "openai-responses"  # Responses API with the computer tool
    OPENAI_CHAT = "openai-chat"  # Chat Completions with images, on any OpenAI-compatible server


class ChatOutput(StrEnum):
    """How an `openai-chat` model writes its actions."""

    TOOL_CALLS = "tool_calls"  # a `computer` function tool over our action schema (pixels of the scaled screen)
    PYAUTOGUI = "pyautogui"  # pyautogui code in the reply, as OSWorld's baselines and OpenCUA emit
    UI_TARS = "ui-tars"  # UI-TARS action text (Thought: ... Action: click(start_box='(x,y)')), 0-1000 grid


class ModelObservation(StrEnum):
    """What a model agent is shown at each look (OSWorld's observation types)."""

    SCREENSHOT = "screenshot"
    A11Y_TREE = "a11y_tree"  # the accessibility tree as OSWorld's linearized table, no image
    SCREENSHOT_A11Y_TREE = "screenshot_a11y_tree"  # both


class ModelTool(StrEnum):
    COMPUTER = "computer"  # screen, pointer and keyboard
    SHELL = "shell"  # run a script on the machine (the image's script language), as the exec request


# The tool versions each API's SDK defines; the first is the default. Anthropic's toolset is the current
# one, computer_20251124 the previous one still served; OpenAI's GA tool and the preview one.
TOOL_VERSIONS: dict[ModelApi, tuple[str, ...]] = {
    ModelApi.ANTHROPIC: ("computer_toolset_20260801", "computer_20251124"),
    ModelApi.OPENAI_RESPONSES: ("computer", "computer_use_preview"),
    ModelApi.OPENAI_CHAT: ("function",),
}


class ModelPrice(BaseModel):
    """US dollars per million tokens; `cost_cents` of an attempt is computed from it."""

    model_config = ConfigDict(extra="forbid")

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached_input: float | None = Field(default=None, ge=0)  # None: cached input tokens cost `input`


class ModelAgentConfig(BaseModel):
    """A built-in computer-use agent driving a model (`kind: model`). See docs/agents.md.

    The API key is read from gh-server's environment (`api_key_env`) at each call: it is never stored
    here, logged, sent to a runner, put in a replay, or given to an agent process."""

    model_config = ConfigDict(extra="forbid")

    id: str
    kind: Literal["model"]
    api: ModelApi
    model: str = Field(min_length=1)
    api_key_env: str | None = None  # None: no key (a local OpenAI-compatible server)
    base_url: str | None = None  # None: the API's own service
    output: ChatOutput | None = None  # openai-chat only (default tool_calls)
    tool_version: str | None = None  # one of TOOL_VERSIONS[api]; None: the first
    tools: list[ModelTool] = Field(default_factory=lambda: [ModelTool.COMPUTER])
    max_steps: int = Field(default=50, ge=1, le=10_000)  # model turns, when the case has no limits.steps
    max_tokens: int = Field(default=4096, ge=1, le=200_000)
    temperature: float | None = Field(default=None, ge=0, le=2)
    # The size screenshots are scaled to for the model, and its coordinates scaled back from (None: the
    # guest's own size).
    screen: tuple[int, int] | None = None
    keep_screens: int = Field(default=3, ge=1, le=100)  # past screenshots (and trees) kept in the model's context
    # The accessibility tree beside or instead of the screen (openai-chat only; docs/agents.md), cut at
    # a11y_max_chars (about OSWorld's 10,000-token default at 4 characters a token).
    observation: ModelObservation = ModelObservation.SCREENSHOT
    a11y_max_chars: int = Field(default=40_000, ge=1_000, le=1_000_000)
    # Past turns kept whole in the model's context; older ones are condensed to a line each
    # (gh_server/agents/model/window.py), so a try of hundreds of steps keeps its requests bounded.
    keep_turns: int = Field(default=50, ge=1, le=10_000)
    price: ModelPrice | None = None
    system: str | None = Field(default=None, max_length=100_000)  # extra instructions after ours
    timeout: float = Field(default=120.0, gt=0, le=3600)  # one model call, retries excluded
    retries: int = Field(default=3, ge=0, le=10)  # 429/5xx/connection, with the SDK's backoff (Retry-After)
    max_invalid: int = Field(default=3, ge=1, le=100)  # unparseable replies or invalid actions in a row

    @field_validator("id")
    @classmethod
    def _addressable(cls, v: str) -> str:
        problem = unaddressable(v) if v else "must not be empty"
        if problem:
            raise ValueError(f"agent id {v!r} {problem}")
        return v

    @field_validator("screen")
    @classmethod
    def _screen(cls, v: tuple[int, int] | None) -> tuple[int, int] | None:
        if v is not None and not (64 <= v[0] <= 8192 and 64 <= v[1] <= 8192):
            raise ValueError("screen is [width, height] in pixels, each 64 to 8192")
        return v

    @field_validator("api_key_env")
    @classmethod
    def _key_env(cls, v: str | None) -> str | None:
        if v is not None and (not v.replace("_", "").isalnum() or v.upper().startswith("GH_SERVER_")):
            raise ValueError("api_key_env names an environment variable (letters, digits, _), never a GH_SERVER_ one")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> ModelAgentConfig:
        if ModelTool.COMPUTER not in self.tools:
            raise ValueError("tools must include computer ([computer] or [computer, shell])")
        if len(set(self.tools)) != len(self.tools):
            raise ValueError("tools lists a tool twice")
        if self.output is not None and self.api != ModelApi.OPENAI_CHAT:
            raise ValueError(f"output is for api openai-chat, not {self.api}")
        if self.observation != ModelObservation.SCREENSHOT and self.api != ModelApi.OPENAI_CHAT:
            # The computer-use APIs take the screen in their own tool results, with no place for a tree.
            raise ValueError(f"observation {self.observation} is for api openai-chat, not {self.api}")
        versions = TOOL_VERSIONS[self.api]
        if self.tool_version is not None and self.tool_version not in versions:
            raise ValueError(f"tool_version for api {self.api} is one of {', '.join(versions)}")
        if self.api != ModelApi.OPENAI_CHAT and self.api_key_env is None:
            raise ValueError(f"api {self.api} needs api_key_env (the environment variable holding the key)")
        return self

    @property
    def chat_output(self) -> ChatOutput:
        return self.output or ChatOutput.TOOL_CALLS

    @property
    def tool(self) -> str:
        return self.tool_version or TOOL_VERSIONS[self.api][0]


AGENT_KINDS = ("builtin", "command", "http", "osworld", "model")


def agent_config(agent_id: str, raw: Any) -> AgentConfig | ModelAgentConfig:
    """One `agents` entry by its kind: a model (ModelAgentConfig), else a built-in, command or HTTP agent.

    Raises:
        pydantic.ValidationError: located at the entry's id (agents.<id>.<setting>), not at a union member.
    """
    if isinstance(raw, AgentConfig | ModelAgentConfig):
        return raw
    kind = raw.get("kind", "builtin") if isinstance(raw, dict) else None
    if isinstance(raw, dict) and kind not in AGENT_KINDS:
        raise ValidationError.from_exception_data("AgentConfig", [InitErrorDetails(
            type="value_error", loc=(agent_id, "kind"), input=kind,
            ctx={"error": ValueError(f"kind is one of {', '.join(AGENT_KINDS)}, not {kind!r}")})])
    cls: type[AgentConfig] | type[ModelAgentConfig] = (
        ModelAgentConfig if isinstance(raw, dict) and raw.get("kind") == "model" else AgentConfig)
    try:
        return cls.model_validate(raw)
    except ValidationError as e:
        errors = [InitErrorDetails(type=err["type"], loc=(agent_id, *err["loc"]), input=err["input"],
                                   ctx=err.get("ctx", {})) for err in e.errors()]
        raise ValidationError.from_exception_data(e.title, errors) from None


class ModelEndpoint(BaseModel):
    """An OpenAI-compatible chat endpoint (judge, simulated customer)."""

    base_url: str
    model: str
    api_key: str | None = Field(default=None, repr=False)
    timeout: float = 120.0


class Settings(BaseModel):
    data_dir: Path
    database_url: str | None = None  # None: sqlite in data_dir
    host: str = "127.0.0.1"
    port: int = 8700
    # The admin key's plain value when it came from GH_SERVER_API_KEY (never logged).
    admin_api_key: str | None = Field(default=None, repr=False)
    # Public base URL for links (replay_url); defaults to http://host:port.
    public_url: str | None = None
    runner_grace_seconds: float = 120.0
    heartbeat_interval: float = 10.0
    dead_after: float = 45.0
    # A retry after an error of ours waits this long, by the attempts its try has had (1, 2), and twice
    # that on the runner the error came from (another runner goes first): a fault that passes by itself
    # (libvirtd restarting) must not burn a try's retries within milliseconds.
    retry_backoff_seconds: list[float] = Field(default_factory=lambda: [5.0, 20.0], min_length=1)
    # A runner is shown online when connected and seen within this many seconds.
    online_window_seconds: float = 60.0
    # An entry is a ModelAgentConfig when its kind is `model` (picked in _agent_kinds, so an error names
    # agents.<id>.<setting>), else an AgentConfig.
    agents: dict[str, AgentConfig | ModelAgentConfig] = Field(default_factory=dict)
    judge: ModelEndpoint | None = None
    customer_model: ModelEndpoint | None = None
    # Bounded worker pools (gh_server.workpool): how many of each slow call run at once in one process.
    agent_workers: int = Field(default=256, ge=1)
    judge_workers: int = Field(default=8, ge=1)
    customer_workers: int = Field(default=8, ge=1)
    webhook_timeout: float = 10.0
    webhook_max_attempts: int = 8
    # Seconds between webhook delivery retries start here and double (capped).
    webhook_backoff_base: float = 2.0
    webhook_backoff_cap: float = 600.0
    # One caller's HTTP requests served at once (its key, console session or address); more wait their turn,
    # and past api_waiting_per_caller waiting get 429 (gh_server.fair_share). 2 keeps a caller's requests
    # overlapping a database wait, and another caller's request behind at most two of them.
    api_in_flight_per_caller: int = Field(default=2, ge=1)
    api_waiting_per_caller: int = Field(default=64, ge=0)
    # Requests per second per API key (token bucket); 0 disables.
    rate_limit_per_second: float = 0.0
    rate_limit_burst: int = 100
    # An open start-state machine closes itself after this long without input: 2 hours (docs/start-states.md).
    start_state_idle_seconds: float = Field(default=7200.0, gt=0)
    start_background_tasks: bool = True
    # The runner gateway and scheduler (gh_server.gateway); off only for API-only tests and tools.
    gateway: bool = True
    # Request bodies (gh_server.bodylimit): refused with 413 before auth or parsing.
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    max_batch_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    # Command agents (gh_server.agents.sandbox): how they are kept away from gh-server's own files.
    # auto: a transient systemd unit with DynamicUser where systemd is PID 1 and gh-server is root,
    # else `user` when root, else refused. none: as gh-server's own user (trusted agents only).
    agent_sandbox: Literal["auto", "user", "systemd", "none"] = "auto"
    # The group every agent runs in (scripts/setup.sh creates it), and its uid when agent_uids is empty.
    agent_user: str = "gh-agent"
    # Each running command agent gets a uid of its own from this range (first, last), so no agent can
    # read another's /proc (its token); none of them may belong to an account. Empty: agent_user's uid.
    agent_uids: tuple[int, int] | None = (60500, 60999)
    # At most this many machine-API requests in flight per attempt token; more get 429.
    machine_api_max_in_flight: int = Field(default=4, ge=1)
    # Webhook receivers on loopback, private, link-local or metadata addresses are refused at send time
    # unless their host (name, address or CIDR) is listed here: a lab's own receiver.
    webhook_allow: list[str] = Field(default_factory=list)
    # How long a request waits for a locked SQLite database before it answers 503 (Retry-After).
    db_busy_timeout: float = Field(default=5.0, gt=0)
    # Proxies whose X-Forwarded-Proto and X-Forwarded-For gh-server believes (addresses or CIDRs, `*` any):
    # a TLS proxy in front. Its https is the request's scheme: the console's cookie is then `__Host-` and
    # Secure (gh_server/console_sessions.py). Loopback by default; env GH_SERVER_TRUSTED_PROXIES (comma-
    # separated), else uvicorn's FORWARDED_ALLOW_IPS.
    trusted_proxies: list[str] = Field(default_factory=lambda: ["127.0.0.1", "::1"])
    # Debian's noVNC (the `novnc` package), served to the console's live screen at /console/novnc/.
    novnc_dir: Path = Path("/usr/share/novnc")
    # A person's takeover of an attempt's machine (gh_server/takeover/desk.py): at most this long, and it
    # ends on its own after this long without input (the browser closed); the agent then goes on.
    takeover_cap_minutes: float = Field(default=30.0, gt=0, le=24 * 60)
    takeover_idle_seconds: float = Field(default=300.0, gt=0)
    # The longest `limits.minutes` a case may ask of this server: the Evals API's 60 by default, up to a
    # day where a lab runs long tries (OSWorld 2.0's run for hours). A case over it is refused when it
    # is stored and when a run would freeze it (this setting may have been lowered since).
    max_task_minutes: int = Field(default=60, ge=1, le=MAX_TASK_MINUTES)
    # Save points (docs/start-states.md): a running try's machine saved every this many minutes of its
    # task (None: only when its agent asks; a case's `limits.save_point_minutes` overrides it), and
    # how many of a try's save points its runner keeps.
    save_point_minutes: int | None = Field(default=None, ge=1, le=MAX_TASK_MINUTES)
    save_points_kept: int = Field(default=3, ge=1, le=50)
    # How long a finished try's save points stay on its runner for a fork (POST .../start_state); past
    # it they are deleted there (start_state_jobs.collect_save_points), but one a start state was made
    # from, which lives on as that start state.
    save_point_retention_hours: float = Field(default=72.0, gt=0, le=24 * 365)

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _comma_separated(cls, v: Any) -> Any:
        return [p.strip() for p in v.split(",") if p.strip()] if isinstance(v, str) else v

    @field_validator("agents", mode="before")
    @classmethod
    def _agent_kinds(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        return {k: agent_config(str(k), c) for k, c in v.items()}

    @property
    def sqlalchemy_url(self) -> str:
        if self.database_url is None:
            return f"sqlite:///{self.data_dir / 'gh-server.db'}"
        url = self.database_url
        # psycopg 3 is the driver we ship; accept the plain libpq-style scheme operators type.
        if url.startswith("postgresql://") or url.startswith("postgres://"):
            url = "postgresql+psycopg://" + url.split("://", 1)[1]
        return url

    @property
    def base_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        return f"http://{self.host}:{self.port}"

    @classmethod
    def from_file(cls, path: Path | str) -> dict[str, Any]:
        """A YAML (or JSON) config file's fields. `agents` may be a mapping id -> config or a list with ids."""
        out = read_mapping(path)  # its ConfigFileError is a ValueError naming the file
        agents = out.get("agents")
        if isinstance(agents, list):
            out["agents"] = {a.get("id"): a for a in agents if isinstance(a, dict)}
        elif isinstance(agents, dict):
            out["agents"] = {k: {"id": k, **(v or {})} for k, v in agents.items()}
        return out

    @classmethod
    def from_env(cls, config_file: Path | str | None = None, **overrides: Any) -> Settings:
        """Defaults < config file (--config / GH_SERVER_CONFIG) < GH_SERVER_* env < `overrides` (flags).

        Env: GH_SERVER_DATA_DIR, GH_SERVER_DATABASE_URL, GH_SERVER_HOST, GH_SERVER_PORT, GH_SERVER_API_KEY,
        GH_SERVER_PUBLIC_URL, GH_SERVER_RUNNER_GRACE_SECONDS, GH_SERVER_NOVNC_DIR, GH_SERVER_TRUSTED_PROXIES,
        GH_SERVER_MAX_TASK_MINUTES."""
        env: dict[str, Any] = {}
        path = config_file or os.environ.get("GH_SERVER_CONFIG")
        if path:
            env.update(cls.from_file(path))
        mapping = {
            "data_dir": "GH_SERVER_DATA_DIR",
            "database_url": "GH_SERVER_DATABASE_URL",
            "host": "GH_SERVER_HOST",
            "port": "GH_SERVER_PORT",
            "admin_api_key": "GH_SERVER_API_KEY",
            "public_url": "GH_SERVER_PUBLIC_URL",
            "runner_grace_seconds": "GH_SERVER_RUNNER_GRACE_SECONDS",
            "novnc_dir": "GH_SERVER_NOVNC_DIR",
            "takeover_cap_minutes": "GH_SERVER_TAKEOVER_CAP_MINUTES",
            "takeover_idle_seconds": "GH_SERVER_TAKEOVER_IDLE_SECONDS",
            "trusted_proxies": "GH_SERVER_TRUSTED_PROXIES",
            "max_task_minutes": "GH_SERVER_MAX_TASK_MINUTES",
            "save_point_minutes": "GH_SERVER_SAVE_POINT_MINUTES",
            "save_points_kept": "GH_SERVER_SAVE_POINTS_KEPT",
            "save_point_retention_hours": "GH_SERVER_SAVE_POINT_RETENTION_HOURS",
        }
        if os.environ.get("FORWARDED_ALLOW_IPS") and "trusted_proxies" not in env:
            env["trusted_proxies"] = os.environ["FORWARDED_ALLOW_IPS"]  # what uvicorn read before this setting
        for field, var in mapping.items():
            if os.environ.get(var):
                env[field] = os.environ[var]
        env.update({k: v for k, v in overrides.items() if v is not None})
        if "data_dir" not in env:
            env["data_dir"] = Path("/var/lib/gh-server")
        return cls(**env)
