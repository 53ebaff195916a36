"""The runner's configuration: one pydantic model, filled from defaults, a YAML file, env and flags.

Precedence is flags > env (`GH_RUNNER_<FLAG>`) > file (`--config`) > defaults, key by key. Unknown
keys and bad values are refused with the key's path and what is allowed, before anything starts.

The token is a `SecretStr`: `repr`/`str` of the config never show it. It comes from, in order:
`--token`, `GH_RUNNER_TOKEN`, `--token-file` (or `GH_RUNNER_TOKEN_FILE`, or `token_file:` in the
file), `token:` in the file, then `$CREDENTIALS_DIRECTORY/gh-runner-token` (systemd
`LoadCredential=gh-runner-token:/etc/gh-runner/token`).

Default directories (documented in `gh-runner --help`):
- root, or any user when `/var/lib/gh-runner` exists and is writable (the packaged service user):
  `/var/lib/gh-runner/images` and `/var/lib/gh-runner/state`. libvirt's `qemu:///system` runs QEMU as
  `libvirt-qemu`, which can traverse `/var/lib` but not `/root`, so a root daemon never defaults
  under its home.
- otherwise `$XDG_DATA_HOME/gh-runner/images` (`~/.local/share/gh-runner/images`) and
  `$XDG_STATE_HOME/gh-runner` (`~/.local/state/gh-runner`).
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from gh_common.configfile import ConfigFileError, read_mapping
from gh_runner.registry import DEFAULT_MIN_MIB_PER_S
from providers.manifest import IMAGE_NAME_RE
from providers.qemu.pool import KEEP_LEASED_S

SERVICE_DIR = Path("/var/lib/gh-runner")
CREDENTIAL_NAME = "gh-runner-token"
CONNECT_PATH = "/v1/runners/connect"
ENV_PREFIX = "GH_RUNNER_"


class ConfigError(Exception):
    """A configuration the runner refuses to start with; the message names the key and what is allowed."""


class Timeouts(BaseModel):
    """Per-phase attempt timeouts in seconds: the attempt's phase bounds (one definition), from which a
    start-state job's bounds (`gh_runner.jobs.JobTimeouts`) derive."""

    model_config = ConfigDict(extra="forbid")

    machine: float = Field(default=180.0, gt=0, le=3600)
    ready: float = Field(default=180.0, gt=0, le=3600)
    setup: float = Field(default=600.0, gt=0, le=7200)
    check: float = Field(default=300.0, gt=0, le=7200)
    task_grace: float = Field(default=30.0, gt=0, le=3600)
    screen: float = Field(default=30.0, gt=0, le=600)
    teardown: float = Field(default=60.0, gt=0, le=3600)
    # How long the check after waits for a guest channel that failed after the agent acted on the machine
    # (gh_runner.attempt): linux-tiny's init respawns qemu-ga and gh-execd at once, linux-desktop's systemd
    # within seconds; a minute covers their start under TCG on a busy host.
    channel_back: float = Field(default=60.0, gt=0, le=600)


class Pool(BaseModel):
    """The hot pool (providers/qemu/pool.py): paused machines per source kept hot, within a memory
    budget. It keeps hot the sources leased here within `keep_leased_s`, and the images in `keep`.
    Sizes not given are sized from the slots and free memory (gh_runner/poolsize.py)."""

    model_config = ConfigDict(extra="forbid")

    per_source: int | None = Field(default=None, ge=0, le=64,
                                   description="paused machines per image or start-state version kept hot")
    total_mib: int | None = Field(default=None, ge=0, le=4 * 1024 * 1024,
                                  description="guest memory all of them may hold")
    keep: list[str] = Field(default_factory=list, description="images kept hot from the start, leased or not "
                            "(a list, or comma-separated: GH_RUNNER_POOL_KEEP, --pool-keep)")
    keep_leased_s: float = Field(default=KEEP_LEASED_S, gt=0, le=7 * 86400,
                                 description="a source leased here stays hot this long after its last lease")

    @field_validator("keep", mode="before")
    @classmethod
    def _split_keep(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [p for p in (s.strip() for s in v.split(",")) if p]
        return v

    @field_validator("keep")
    @classmethod
    def _check_keep(cls, v: list[str]) -> list[str]:
        for name in v:
            if not re.fullmatch(IMAGE_NAME_RE, name):
                raise ValueError(f"{name!r} is not an image name (1-63 lower-case letters, digits, '.', '_', '-', "
                                 "e.g. linux-tiny)")
        return list(dict.fromkeys(v))

    @model_validator(mode="after")
    def _check_sizes(self) -> Pool:
        # Both sizes or neither: one alone would leave the other to a rule the reader does not see.
        # A 0 alone still means off, as it always did.
        if (self.per_source is None) != (self.total_mib is None):
            if 0 not in (self.per_source, self.total_mib):
                raise ValueError("per_source and total_mib are set together (or neither: the pool is then "
                                 "sized from the slots and the free memory)")
            self.per_source = self.per_source or 0
            self.total_mib = self.total_mib or 0
        return self

    @property
    def off(self) -> bool:
        return self.per_source == 0 or self.total_mib == 0


class Registry(BaseModel):
    """An OCI registry for start states and images (gh_runner/registry.py, docs/operations.md)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="https://HOST[:PORT] (http:// only for a loopback registry or with insecure)")
    repository: str = Field(default="gh-runner", description="repository prefix: PREFIX/states/ID, PREFIX/images/NAME")
    credentials_file: Path | None = Field(default=None, description="`user:password`, or a Docker config.json")
    ca_file: Path | None = Field(default=None, description="PEM bundle to trust for the registry's TLS")
    cache_mib: int = Field(default=20480, ge=64, description="pulled start-state versions kept under the state dir")
    min_mib_per_s: float = Field(
        default=DEFAULT_MIN_MIB_PER_S, gt=0, le=100_000,
        description="the slowest transfer waited for: a pull (or push) of N MiB is given 60 s plus N / this "
                    "seconds, then refused as registry_unavailable")

    @field_validator("url")
    @classmethod
    def _check_url(cls, v: str) -> str:
        url = urlsplit(v.strip())
        if url.scheme not in ("https", "http") or not url.hostname or url.path not in ("", "/"):
            raise ValueError("must be https://HOST[:PORT] (or http:// for a loopback registry), no path")
        return f"{url.scheme}://{url.netloc}"

    @field_validator("repository")
    @classmethod
    def _check_repository(cls, v: str) -> str:
        v = v.strip("/")
        if not v or not all(re.fullmatch(r"[a-z0-9]+(?:[._-][a-z0-9]+)*", p) for p in v.split("/")):
            raise ValueError("must be lower-case path components (a-z, 0-9, '.', '_', '-') separated by '/'")
        return v


class RunnerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    server: str | None = Field(default=None, description="control plane URL (wss://host or https://host); several "
                               "gh-server processes as a comma-separated list (or a YAML list), tried in turn")
    token: SecretStr | None = None
    token_file: Path | None = None
    name: str = Field(default_factory=socket.gethostname, min_length=1, max_length=128)
    labels: list[str] = Field(default_factory=list)
    slots: int = Field(default=1, ge=1, le=256)
    images_dir: Path = Field(default_factory=lambda: default_dirs()[0])
    state_dir: Path = Field(default_factory=lambda: default_dirs()[1])
    libvirt_uri: str = "qemu:///system"
    metrics_listen: str | None = Field(default=None, description="host:port for Prometheus /metrics")
    log_format: Literal["json", "console"] = "console"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    drain_grace: float = Field(default=600.0, ge=0, le=86400, description="seconds to let attempts finish")
    insecure: bool = False
    # Reconnect policy: capped exponential backoff with jitter.
    reconnect_min: float = Field(default=1.0, gt=0, le=60)
    reconnect_max: float = Field(default=60.0, gt=0, le=3600)
    revoked_retry: float = Field(default=600.0, gt=0, le=86400, description="retry pace after a revoked token")
    on_token_refused: Literal["auto", "exit", "retry"] = Field(
        default="auto", description="exit (code 2) or retry every revoked_retry seconds when the server refuses "
        "the token; auto: exit when run by hand on a terminal, retry as a service")
    connect_timeout: float = Field(default=15.0, gt=0, le=300)
    reap_interval: float = Field(default=300.0, gt=0, le=86400)
    result_resend: float = Field(default=30.0, gt=0, le=3600, description="resend unacked results this often")
    disk_reserve_mib: int = Field(default=2048, ge=0, description="refuse leases when the state dir has less free")
    machine_disk_cap_mib: int = Field(default=20480, ge=64, description="stop a machine whose overlay grows past this")
    timeouts: Timeouts = Field(default_factory=Timeouts)
    warm_snapshots: bool = Field(default=True, description="start machines on an image from its booted snapshot")
    pool: Pool | None = Field(default=None, description="the hot pool; unset: sized from the slots and free "
                              "memory (gh_runner/poolsize.py); `off` turns it off")
    registry: Registry | None = Field(default=None, description="OCI registry for start states and images")

    @field_validator("pool", mode="before")
    @classmethod
    def _pool_off(cls, v: Any) -> Any:
        word = _pool_word(v)
        if word == "off":
            return Pool(per_source=0, total_mib=0)
        if word == "auto":
            return None
        return v

    def keeping(self, images: Iterable[str]) -> RunnerConfig:
        """This config with `images` added to the hot pool's `keep` (gh-runner local keeps its cases'
        images); a pool turned off stays off.

        Raises:
            ConfigError: a name is not an image name.
        """
        pool = self.pool or Pool()
        if pool.off:
            return self
        try:
            kept = Pool.model_validate({**pool.model_dump(), "keep": [*pool.keep, *images]})
        except ValidationError as e:
            raise ConfigError(_format_validation(e, "images to keep hot", prefix="pool")) from None
        return self.model_copy(update={"pool": kept})

    @field_validator("labels", mode="before")
    @classmethod
    def _split_labels(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [p for p in (s.strip() for s in v.split(",")) if p]
        return v

    @field_validator("labels")
    @classmethod
    def _check_labels(cls, v: list[str]) -> list[str]:
        for label in v:
            if not label or len(label) > 64 or not all(c.isalnum() or c in "-_.:" for c in label):
                raise ValueError(f"label {label!r} must be 1-64 characters of letters, digits, '-', '_', '.', ':'")
        return v

    @field_validator("server", mode="before")
    @classmethod
    def _check_server(cls, v: Any) -> str | None:
        """One URL, a comma-separated list, or a list (repeated --server, YAML): kept as one normalised,
        comma-separated string, so the single-URL form reads as it always did."""
        if v is None:
            return None
        parts = v if isinstance(v, list | tuple) else [v]
        urls = [u.strip() for p in parts for u in str(p).split(",") if u.strip()]
        if not urls:
            raise ValueError("no server URL given")
        return ",".join(dict.fromkeys(normalize_server_url(u) for u in urls))

    @field_validator("metrics_listen")
    @classmethod
    def _check_listen(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        _host, _sep, port = v.rpartition(":")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("must be HOST:PORT or PORT (a bare port binds loopback), e.g. 127.0.0.1:9464")
        return v

    @model_validator(mode="after")
    def _check_registry_transport(self) -> RunnerConfig:
        reg = self.registry
        if reg is not None and reg.url.startswith("http://") and not self.insecure \
                and not is_loopback(urlsplit(reg.url).hostname or ""):
            raise ValueError(f"registry.url {reg.url} is not encrypted; use https:// (or --insecure to send "
                             "registry credentials in clear text to a non-loopback host)")
        return self

    @model_validator(mode="after")
    def _check_backoff(self) -> RunnerConfig:
        if self.reconnect_min > self.reconnect_max:
            raise ValueError(f"reconnect_min ({self.reconnect_min}) must not exceed "
                             f"reconnect_max ({self.reconnect_max})")
        return self

    def connect_urls(self) -> list[str]:
        """Every server URL, in the order given (the session moves to the next when one is lost)."""
        if self.server is None:
            raise ConfigError("server: required to run the daemon (--server wss://HOST or GH_RUNNER_SERVER)")
        return self.server.split(",")

    def exits_on_refused_token(self, stderr_is_tty: bool, env: Mapping[str, str]) -> bool:
        """Whether a refused token ends the runner (exit 2) rather than being retried. `auto`: a runner
        started by hand (stderr is a terminal, and no service manager: no INVOCATION_ID or NOTIFY_SOCKET
        from systemd) exits, so a typo is seen at once; a service keeps retrying every revoked_retry
        seconds, so a token fixed on the server side needs no restart."""
        if self.on_token_refused != "auto":
            return self.on_token_refused == "exit"
        return stderr_is_tty and not env.get("INVOCATION_ID") and not env.get("NOTIFY_SOCKET")

    def connect_url(self) -> str:
        return self.connect_urls()[0]

    def check_transport(self) -> None:
        """Refuse a cleartext websocket to a remote host unless `insecure` says so."""
        for raw in self.connect_urls():
            url = urlsplit(raw)
            if url.scheme == "ws" and not self.insecure and not is_loopback(url.hostname or ""):
                raise ConfigError(
                    f"server: {raw} is not encrypted; use wss:// (or https://), or pass --insecure "
                    "to send the runner token in clear text to a non-loopback host"
                )

    def token_value(self) -> str:
        if self.token is None:
            raise ConfigError(
                "token: required to run the daemon; pass --token, set GH_RUNNER_TOKEN, use --token-file, "
                f"or a systemd credential named {CREDENTIAL_NAME}"
            )
        return self.token.get_secret_value()


def default_dirs(env: Mapping[str, str] | None = None) -> tuple[Path, Path]:
    env = os.environ if env is None else env
    if os.geteuid() == 0 or (SERVICE_DIR.is_dir() and os.access(SERVICE_DIR, os.W_OK | os.X_OK)):
        return SERVICE_DIR / "images", SERVICE_DIR / "state"
    home = Path(env.get("HOME") or Path.home())
    data = Path(env.get("XDG_DATA_HOME") or home / ".local" / "share")
    state = Path(env.get("XDG_STATE_HOME") or home / ".local" / "state")
    return data / "gh-runner" / "images", state / "gh-runner"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def normalize_server_url(v: str) -> str:
    """Accept wss/ws/https/http; give back the websocket URL of the runner endpoint."""
    url = urlsplit(v.strip())
    schemes = {"wss": "wss", "https": "wss", "ws": "ws", "http": "ws"}
    if url.scheme not in schemes:
        raise ValueError(f"{v!r} must start with wss://, https://, ws:// or http://")
    if not url.hostname:
        raise ValueError(f"{v!r} has no host")
    path = url.path if url.path not in ("", "/") else CONNECT_PATH
    return urlunsplit((schemes[url.scheme], url.netloc, path, url.query, ""))


# Flags that are not config keys in their own right, and flags whose env twin is a boolean.
_BOOL_KEYS = {"insecure"}
_ENV_KEYS = (
    "server", "token", "token_file", "name", "labels", "slots", "images_dir", "state_dir", "libvirt_uri",
    "metrics_listen", "log_format", "log_level", "drain_grace", "insecure", "on_token_refused",
)


# GH_RUNNER_REGISTRY_<KEY> fill `registry.<key>` (GH_RUNNER_REGISTRY_URL alone turns it on).
_REGISTRY_ENV_KEYS = ("url", "repository", "credentials_file", "ca_file", "cache_mib", "min_mib_per_s")
# GH_RUNNER_POOL_<KEY> fill `pool.<key>`, key by key over the file's `pool:`.
_POOL_ENV_KEYS = ("keep", "keep_leased_s")


def _env_section(env: Mapping[str, str], section: str, keys: tuple[str, ...]) -> dict[str, Any] | None:
    prefix = f"{ENV_PREFIX}{section.upper()}_"
    values = {k: env[prefix + k.upper()] for k in keys if env.get(prefix + k.upper())}
    return values or None


def _pool_word(v: Any) -> Literal["off", "auto"] | None:
    """`pool:` given as a word: YAML reads a bare `off` as false, and "off" spelt as a string (env,
    JSON) means the same; `auto` (or true) is the pool sized from the slots and the free memory."""
    if v is False or (isinstance(v, str) and v.strip().lower() in ("off", "false", "no", "0")):
        return "off"
    if v is True or (isinstance(v, str) and v.strip().lower() in ("auto", "on")):
        return "auto"
    return None


def _pool_keys(v: Any) -> dict[str, Any] | None:
    """A `pool:` value as keys to merge with another source's: `off` as zero sizes, `auto` (or
    none) as no keys; None for a value that is none of these (validation names it)."""
    if isinstance(v, dict):
        return v
    word = _pool_word(v)
    if word == "off":
        return {"per_source": 0, "total_mib": 0}
    return {} if v is None or word == "auto" else None


def _env_values(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if (reg := _env_section(env, "registry", _REGISTRY_ENV_KEYS)) is not None:
        out["registry"] = reg
    if (pool := _env_section(env, "pool", _POOL_ENV_KEYS)) is not None:
        out["pool"] = pool
    for key in _ENV_KEYS:
        raw = env.get(ENV_PREFIX + key.upper())
        if raw is None or raw == "":
            continue
        if key in _BOOL_KEYS:
            low = raw.strip().lower()
            if low not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ConfigError(f"{ENV_PREFIX}{key.upper()}: {raw!r} is not a boolean; use true or false")
            out[key] = low in ("1", "true", "yes", "on")
        else:
            out[key] = raw
    return out


def _read_file(path: Path) -> dict[str, Any]:
    try:
        return read_mapping(path)
    except ConfigFileError as e:
        raise ConfigError(str(e)) from None


def _read_token_file(path: Path, where: str) -> SecretStr:
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ConfigError(f"{where}: cannot read token file {path}: {e.strerror or e}") from None
    if not value:
        raise ConfigError(f"{where}: token file {path} is empty")
    return SecretStr(value)


def _format_validation(e: ValidationError, source: str, env_names: bool = False, prefix: str = "") -> str:
    lines = []
    for err in e.errors():
        where = ".".join(str(p) for p in (prefix, *err.get("loc", ())) if p != "") or "(top level)"
        if env_names:
            where = ENV_PREFIX + where.upper().replace(".", "_")
        if err.get("type") == "extra_forbidden":
            allowed = ", ".join(sorted(RunnerConfig.model_fields))
            if len(err.get("loc", ())) > 1 and err["loc"][0] == "timeouts":
                allowed = ", ".join(sorted(Timeouts.model_fields))
            if len(err.get("loc", ())) > 1 and err["loc"][0] == "registry":
                allowed = ", ".join(sorted(Registry.model_fields))
            if len(err.get("loc", ())) > 1 and err["loc"][0] == "pool":
                allowed = ", ".join(sorted(Pool.model_fields))
            lines.append(f"{where}: unknown key; allowed keys: {allowed}")
        else:
            msg = err.get("msg", "invalid")
            given = err.get("input")
            shown = "" if where.startswith("token") else f" (got {given!r})"
            lines.append(f"{where}: {msg}{shown}")
    return f"invalid configuration ({source}):\n  " + "\n  ".join(lines)


def load_config(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> RunnerConfig:
    """Build the config: defaults < file < env < flags. `flags` holds only options given on the command line;
    `defaults` are a caller's own (gh-runner local's slots), in place of the model's."""
    env = os.environ if env is None else env
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    file_values: dict[str, Any] = {}
    if config_file is None and env.get(ENV_PREFIX + "CONFIG"):
        config_file = Path(env[ENV_PREFIX + "CONFIG"])
    if config_file is not None:
        file_values = _read_file(config_file)
        try:  # validate the file alone first so its errors name the file
            RunnerConfig.model_validate(file_values)
        except ValidationError as e:
            raise ConfigError(_format_validation(e, f"config file {config_file}")) from None
    env_values = _env_values(env)
    alone = env_values
    if "registry" in env_values and "url" not in env_values["registry"]:  # the url may come from the file
        alone = {**env_values, "registry": {"url": "https://registry.invalid", **env_values["registry"]}}
    try:  # validate the environment alone too, so its errors name the variable
        RunnerConfig.model_validate(alone)
    except ValidationError as e:
        raise ConfigError(_format_validation(e, "environment", env_names=True)) from None
    merged: dict[str, Any] = {**(defaults or {}), **file_values, **env_values, **flags}
    if isinstance(file_values.get("registry"), dict) and "registry" in env_values:  # key by key, as elsewhere
        merged["registry"] = {**file_values["registry"], **env_values["registry"]}
    if "pool" in env_values or "pool" in flags:  # key by key too; `pool: off` in the file stays off
        layers = [_pool_keys(src.get("pool")) for src in (defaults or {}, file_values, env_values, flags)]
        if all(layer is not None for layer in layers):
            merged["pool"] = {k: v for layer in layers if layer is not None for k, v in layer.items()}

    # The token: explicit value beats a file, an explicit file beats one in the config file,
    # and the systemd credential is the last resort.
    token_sources: list[tuple[str, Any]] = [
        ("--token", flags.get("token")),
        (ENV_PREFIX + "TOKEN", env_values.get("token")),
    ]
    token: SecretStr | None = None
    for _, v in token_sources:
        if v:
            token = v if isinstance(v, SecretStr) else SecretStr(str(v))
            break
    if token is None:
        tf_where, tf = next(
            ((w, v) for w, v in (("--token-file", flags.get("token_file")),
                                 (ENV_PREFIX + "TOKEN_FILE", env_values.get("token_file")),
                                 ("token_file", file_values.get("token_file"))) if v),
            ("", None),
        )
        if tf is not None:
            token = _read_token_file(Path(tf), tf_where)
        elif file_values.get("token"):
            token = SecretStr(str(file_values["token"]))
        elif env.get("CREDENTIALS_DIRECTORY"):
            cred = Path(env["CREDENTIALS_DIRECTORY"]) / CREDENTIAL_NAME
            if cred.is_file():
                token = _read_token_file(cred, "systemd credential")
    merged["token"] = token
    try:
        return RunnerConfig.model_validate(merged)
    except ValidationError as e:
        raise ConfigError(_format_validation(e, "flags, environment and config file")) from None
