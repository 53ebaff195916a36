"""The daemon's operations observer: its hooks drive sd_notify (`notify.py`) and Prometheus (`metrics.py`).

`gh_runner.cli` calls `make_observers(config)` inside the running event loop and hands the result
to `Daemon(observers=...)`. The daemon calls the hooks on the event loop; every one is quick.

systemd contract (`systemd/gh-runner.service`, `Type=notify`):
- `READY=1` after the first `welcome`: "started" means connected and able to take leases.
- `STATUS=` one line: connection, busy/slots, unacknowledged results.
- `WATCHDOG=1` from the daemon's tick (its main loop). Before the first tick (provider start-up,
  journal recovery, the first reap) a start-up pinger proves the event loop is alive instead, and
  stops at the first tick.
- `STOPPING=1` when the first SIGTERM starts the drain.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import urlsplit

from gh_runner.log import get_logger
from gh_runner.metrics import MetricsListenError, RunnerMetrics
from gh_runner.notify import Notifier
from gh_wire.protocol import AttemptResult, Welcome

log = get_logger("gh_runner.observers")


class OpsObserver:
    def __init__(self, *, name: str, server: str | None, slots: int, notifier: Notifier,
                 metrics: RunnerMetrics | None) -> None:
        self.notifier = notifier
        self.metrics = metrics
        self.name = name
        self.server_host = urlsplit(server).netloc if server else "?"
        self.slots = slots
        self.busy = 0
        self.backlog = 0
        self.connection = f"connecting to {self.server_host}"
        self.ready_sent = False
        self._ticked = False
        self._startup_pinger: asyncio.Task[None] | None = None

    # -- start-up ------------------------------------------------------------------------------

    def start(self) -> None:
        self.notifier.status(f"starting: {self.name}, {self.slots} slot(s), server {self.server_host}")
        interval = self.notifier.watchdog_interval
        if interval is not None:
            with contextlib.suppress(RuntimeError):  # no running loop: the first tick will ping
                self._startup_pinger = asyncio.get_running_loop().create_task(
                    self._ping_until_first_tick(interval), name="watchdog-startup")

    async def _ping_until_first_tick(self, interval: float) -> None:
        while not self._ticked:
            self.notifier.watchdog(force=True)
            await asyncio.sleep(interval)

    def _status_line(self) -> str:
        line = f"{self.connection}; busy {self.busy}/{self.slots}"
        if self.backlog:
            line += f"; {self.backlog} result(s) awaiting ack"
        return line

    def _publish(self) -> None:
        self.notifier.status(self._status_line())

    # -- daemon hooks --------------------------------------------------------------------------

    def welcome(self, welcome: Welcome) -> None:
        self.connection = f"connected to {self.server_host} as {self.name} ({welcome.runner_id})"
        if self.metrics is not None:
            self.metrics.set_connection("connected")
        if not self.ready_sent:
            self.ready_sent = True
            self.notifier.ready(self._status_line())
        else:
            self._publish()

    def disconnected(self, reason: str) -> None:
        revoked = "revoked" in reason.lower() or "4001" in reason
        self.connection = f"disconnected from {self.server_host}: {reason}"
        if self.metrics is not None:
            self.metrics.set_connection("revoked" if revoked else "disconnected")
        self._publish()

    def reconnect_scheduled(self, failures: int, delay: float) -> None:
        if self.metrics is not None:
            self.metrics.reconnecting()
        self.connection = f"reconnecting to {self.server_host} in {delay:.0f} s ({failures} failed)"
        self._publish()

    def busy_changed(self, busy: int, slots: int) -> None:
        self.busy, self.slots = busy, slots
        if self.metrics is not None:
            self.metrics.set_slots(slots, busy)
            # Every busy slot holds one machine (an attempt's or an open start state's).
            self.metrics.set_machines_running(busy)
        self._publish()

    def attempt_finished(self, result: AttemptResult) -> None:
        if self.metrics is not None:
            self.metrics.attempt_finished(result)

    def journal_backlog(self, pending: int) -> None:
        self.backlog = pending
        if self.metrics is not None:
            self.metrics.set_journal_backlog(pending)
        self._publish()

    def reaped(self, machine_ids: list[str]) -> None:
        if self.metrics is not None:
            self.metrics.reaped_leftovers(len(machine_ids))

    def hypervisor(self, up: bool, reason: str | None) -> None:
        if self.metrics is not None:
            self.metrics.set_hypervisor_up(up)
        self.notifier.status("hypervisor answers" if up else f"paused: {reason}")

    def destroy_leftovers(self, n: int) -> None:
        if self.metrics is not None:
            self.metrics.set_destroy_leftovers(n)

    def draining(self, in_flight: int) -> None:
        if self.metrics is not None:
            self.metrics.set_connection("stopping")
        self.notifier.stopping(f"draining: {in_flight} attempt(s) in flight, no new leases")

    def stopped(self, exit_code: int) -> None:
        self._ticked = True
        if self._startup_pinger is not None:
            self._startup_pinger.cancel()
        self.notifier.status(f"stopped (exit code {exit_code})")
        self.notifier.close()
        if self.metrics is not None:
            self.metrics.close()

    def tick(self) -> None:
        if not self._ticked:
            self._ticked = True
            if self._startup_pinger is not None:
                self._startup_pinger.cancel()
        self.notifier.watchdog()
        if self.metrics is not None:
            self.metrics.tick()


def make_observers(config: Any) -> list[Any]:
    """The observers for one daemon: sd_notify always (a no-op outside systemd), metrics when
    `metrics_listen` is set. A listener that cannot bind stops the runner with a clear error."""
    metrics: RunnerMetrics | None = None
    if config.metrics_listen:
        metrics = RunnerMetrics(slots=config.slots, name=config.name)
        try:
            metrics.serve(config.metrics_listen)
        except MetricsListenError as e:
            log.error("cannot start the metrics listener", error=str(e))
            raise SystemExit(2) from None
    server = config.connect_url() if config.server else None
    obs = OpsObserver(name=config.name, server=server, slots=config.slots, notifier=Notifier(),
                      metrics=metrics)
    obs.start()
    return [obs]
