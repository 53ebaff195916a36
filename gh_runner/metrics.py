"""Prometheus metrics of one runner, served on `--metrics-listen HOST:PORT` (off by default).

Own `CollectorRegistry` (not the process-global one) so two runners in one process, as in the
tests and `gh-runner local`, never share or double-register series.

Bind policy: a bare port (`9464` or `:9464`) binds 127.0.0.1. Any other host is the operator's
explicit choice and is honoured with a warning, because the series carry no secrets (no tokens,
no scripts, only counts, labels and the version) but do reveal what the lab is doing.
"""

from __future__ import annotations

import ipaddress
import platform
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

import structlog
from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram, Info, generate_latest
from prometheus_client.exposition import start_http_server

from gh_runner import __version__
from gh_wire.protocol import PROTOCOL_VERSION, AttemptResult

log = structlog.get_logger(__name__)

CONNECTION_STATES = ["connecting", "connected", "disconnected", "revoked", "stopping"]
OUTCOMES = ("passed", "failed", "error")
# Phases run from tens of milliseconds (a check on a restored machine) to an hour (a long task).
PHASE_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600)

DEFAULT_HOST = "127.0.0.1"


class MetricsListenError(ValueError):
    """A `--metrics-listen` value that is not HOST:PORT."""


@dataclass(frozen=True)
class ListenAddress:
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False  # a hostname: we cannot tell what it resolves to, treat as exposed


def parse_listen(value: str) -> ListenAddress:
    """`9464`, `:9464`, `127.0.0.1:9464`, `[::1]:9464`, `0.0.0.0:9464`."""
    raw = value.strip()
    if not raw:
        raise MetricsListenError("--metrics-listen is empty; give HOST:PORT such as 127.0.0.1:9464")
    if raw.startswith("["):
        host, sep, port_s = raw[1:].partition("]:")
        if not sep:
            raise MetricsListenError(f"--metrics-listen {value!r}: an IPv6 address is written [ADDR]:PORT")
    elif ":" in raw:
        host, _, port_s = raw.rpartition(":")
        if ":" in host:
            raise MetricsListenError(f"--metrics-listen {value!r}: write an IPv6 address as [ADDR]:PORT")
    else:
        host, port_s = "", raw
    try:
        port = int(port_s)
    except ValueError:
        raise MetricsListenError(f"--metrics-listen {value!r}: port {port_s!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise MetricsListenError(f"--metrics-listen {value!r}: port must be 0-65535")
    return ListenAddress(host or DEFAULT_HOST, port)


class RunnerMetrics:
    """Every series the runner exports. Methods are cheap and thread-safe (prometheus-client)."""

    def __init__(self, *, slots: int = 0, name: str = "") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.build_info = Info("gh_runner_build", "Version of the runner and its protocol", registry=r)
        self.build_info.info({
            "version": __version__,
            "protocol": str(PROTOCOL_VERSION),
            "python": platform.python_version(),
            "name": name,
        })
        self.attempts = Counter("gh_runner_attempts", "Finished attempts by outcome", ["outcome"], registry=r)
        for o in OUTCOMES:  # export zeros so rate() and alerts work before the first attempt
            self.attempts.labels(outcome=o)
        self.phase_duration = Histogram(
            "gh_runner_phase_duration_seconds", "Duration of attempt phases (boot, setup, check, task...)",
            ["phase"], buckets=PHASE_BUCKETS, registry=r,
        )
        self.slots_total = Gauge("gh_runner_slots", "Slots this runner offers", registry=r)
        self.slots_busy = Gauge("gh_runner_slots_busy", "Slots running an attempt or job", registry=r)
        self.connection = Enum(
            "gh_runner_connection_state", "State of the websocket to the control plane",
            states=CONNECTION_STATES, registry=r,
        )
        self.connected = Gauge("gh_runner_connected", "1 while the runner holds a welcomed session", registry=r)
        self.reconnects = Counter("gh_runner_reconnects", "Reconnect attempts after a lost session", registry=r)
        self.journal_backlog = Gauge(
            "gh_runner_journal_backlog", "Finished results journaled but not yet acknowledged", registry=r
        )
        self.machines_running = Gauge("gh_runner_machines_running", "Machines (VMs) alive now", registry=r)
        self.reaped = Counter("gh_runner_reaped_leftovers", "Leftover machines of a previous run reaped", registry=r)
        self.hypervisor_up = Gauge(
            "gh_runner_hypervisor_up", "1 while the hypervisor (libvirt) answers; 0: the runner is paused", registry=r
        )
        self.hypervisor_up.set(1)
        self.destroy_leftovers = Gauge(
            "gh_runner_destroy_leftovers",
            "Machines whose destroy failed and is being retried (their files are kept until the domain is gone)",
            registry=r,
        )
        self.last_tick = Gauge(
            "gh_runner_main_loop_last_tick_timestamp_seconds", "When the main loop last ran (unix time)", registry=r
        )
        self.slots_total.set(slots)
        self.connection.state("connecting")
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    # -- events -------------------------------------------------------------------------------

    def set_slots(self, total: int, busy: int | None = None) -> None:
        self.slots_total.set(total)
        if busy is not None:
            self.slots_busy.set(busy)

    def set_busy(self, busy: int) -> None:
        self.slots_busy.set(busy)

    def set_connection(self, state: str) -> None:
        if state not in CONNECTION_STATES:
            raise ValueError(f"unknown connection state {state!r}; one of {CONNECTION_STATES}")
        self.connection.state(state)
        self.connected.set(1 if state == "connected" else 0)

    def reconnecting(self) -> None:
        self.reconnects.inc()
        self.set_connection("connecting")

    def attempt_finished(self, result: AttemptResult) -> None:
        self.attempts.labels(outcome=result.outcome).inc()
        self.observe_phases(result.metrics.phase_seconds)

    def observe_phases(self, phase_seconds: Mapping[str, float]) -> None:
        for phase, seconds in phase_seconds.items():
            if seconds >= 0:
                self.phase_duration.labels(phase=phase).observe(seconds)

    def set_journal_backlog(self, n: int) -> None:
        self.journal_backlog.set(n)

    def set_machines_running(self, n: int) -> None:
        self.machines_running.set(n)

    def reaped_leftovers(self, n: int = 1) -> None:
        if n > 0:
            self.reaped.inc(n)

    def set_hypervisor_up(self, up: bool) -> None:
        self.hypervisor_up.set(1 if up else 0)

    def set_destroy_leftovers(self, n: int) -> None:
        self.destroy_leftovers.set(n)

    def tick(self) -> None:
        self.last_tick.set_to_current_time()

    # -- exposition ---------------------------------------------------------------------------

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, listen: str | ListenAddress) -> ListenAddress:
        """Start the HTTP listener in a daemon thread; returns the bound address (port 0 → real port)."""
        addr = parse_listen(listen) if isinstance(listen, str) else listen
        if self._server is not None:
            raise RuntimeError("metrics listener already running")
        if not addr.loopback:
            log.warning("metrics listener bound to a non-loopback address; firewall it to your Prometheus",
                        host=addr.host, port=addr.port)
        try:
            self._server, self._thread = start_http_server(addr.port, addr=addr.host, registry=self.registry)
        except OSError as e:
            raise MetricsListenError(f"cannot listen for metrics on {addr.host}:{addr.port}: {e.strerror or e}") from e
        bound = ListenAddress(addr.host, int(self._server.server_address[1]))
        log.info("metrics listening", host=bound.host, port=bound.port)
        return bound

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
