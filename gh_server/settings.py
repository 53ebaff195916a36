"""gh-server's configuration: one pydantic model, filled from CLI flags > GH_SERVER_* env > defaults."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gh_common.configfile import read_mapping
from gh_server.ids import unaddressable


class AgentConfig(BaseModel):
    """An external agent: a command (stdin/stdout JSON) or an HTTP endpoint. See docs/agents.md.

    Checked when the server starts, so a typo fails there rather than in the first attempt."""

    model_config = ConfigDict(extra="forbid")

    id: str
    kind: Literal["builtin", "command", "http"] = "builtin"
    builtin: Literal["noop", "reference"] | None = None  # for kind=builtin
    command: list[str] | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    timeout: float = Field(default=3600.0, gt=0)
    # A command agent's environment beyond PATH, LANG, HOME and GH_MACHINE_*: these values, and these
    # names copied from gh-server's own environment (never a GH_SERVER_* one). Nothing else is passed.
    env: dict[str, str] = Field(default_factory=dict, repr=False)
    pass_env: list[str] = Field(default_factory=list)

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
        return self


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
    # A runner is shown online when connected and seen within this many seconds.
    online_window_seconds: float = 60.0
    agents: dict[str, AgentConfig] = Field(default_factory=dict)
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
    # Requests per second per API key (token bucket); 0 disables.
    rate_limit_per_second: float = 0.0
    rate_limit_burst: int = 100
    # An open start-state machine closes itself after this long without input (the seed's 2 hours).
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
        GH_SERVER_PUBLIC_URL, GH_SERVER_RUNNER_GRACE_SECONDS."""
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
        }
        for field, var in mapping.items():
            if os.environ.get(var):
                env[field] = os.environ[var]
        env.update({k: v for k, v in overrides.items() if v is not None})
        if "data_dir" not in env:
            env["data_dir"] = Path("/var/lib/gh-server")
        return cls(**env)
