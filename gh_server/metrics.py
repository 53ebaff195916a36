"""Prometheus metrics of one gh-server process, served on `/metrics` (any API key; docs/operations.md).

Named like the runner's (gh_runner/metrics.py): `gh_server_` prefix, counters without `_total` in the
code (the client adds it), seconds for durations. Own `CollectorRegistry`, so several servers in one
process (the tests, `gh-runner local`) never share series. Counters and histograms are this process's;
the gauges read from the database at scrape time (queue depth, webhook backlog) are the whole
deployment's, the same on every process: sum the first kind over processes, not the second.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import QueuePool

from gh_server.models import Attempt, WebhookDelivery

log = logging.getLogger(__name__)

OUTCOMES = ("passed", "failed", "error")
MODEL_KINDS = ("judge", "customer", "agent")
# From a lease handed out at once to one that waited an hour for a free slot.
LEASE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
# Model calls: a fast endpoint answers in a second, the default timeout is 120 s; agents run for minutes.
CALL_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    """Every series gh-server exports. Methods are cheap and thread-safe (prometheus-client)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.leases = Counter("gh_server_leases", "Attempts leased to a runner by this process", registry=r)
        self.results = Counter("gh_server_results_applied", "Results applied (once each) by outcome", ["outcome"],
                               registry=r)
        for o in OUTCOMES:  # zeros from the start, so rate() and alerts work before the first result
            self.results.labels(outcome=o)
        self.lease_latency = Histogram("gh_server_lease_latency_seconds", "From queued to leased, per attempt",
                                       buckets=LEASE_BUCKETS, registry=r)
        self.call_seconds = Histogram("gh_server_model_call_duration_seconds",
                                      "Judge, simulated customer and agent calls, waiting for a worker included",
                                      ["kind"], buckets=CALL_BUCKETS, registry=r)
        self.call_errors = Counter("gh_server_model_call_errors", "Judge, customer and agent calls that failed",
                                   ["kind", "reason"], registry=r)
        for k in MODEL_KINDS:
            self.call_seconds.labels(kind=k)
            for reason in ("timeout", "error"):
                self.call_errors.labels(kind=k, reason=reason)
        self.runners_connected = Gauge("gh_server_runners_connected", "Runner websockets this process holds",
                                       registry=r)
        self.relayed = Counter("gh_server_machine_requests_relayed",
                               "Machine requests relayed through PostgreSQL, by direction", ["direction"], registry=r)
        for d in ("sent", "served"):
            self.relayed.labels(direction=d)
        self._db_collector: _DbCollector | None = None

    def pool_observer(self, pool: str, seconds: float, outcome: str) -> None:
        """A gh_server.workpool observer: the duration of every call, and why it failed if it did."""
        self.call_seconds.labels(kind=pool).observe(seconds)
        if outcome != "ok":
            self.call_errors.labels(kind=pool, reason=outcome).inc()

    def leased(self, waited: list[float]) -> None:
        self.leases.inc(len(waited))
        for w in waited:
            self.lease_latency.observe(max(w, 0.0))

    def watch_db(self, engine: Engine, db: sessionmaker[Session], connected: Callable[[], int] | None = None) -> None:
        """Add the gauges read at scrape time: queue depth per label, webhook backlog, DB pool use."""
        if self._db_collector is None:
            self._db_collector = _DbCollector(engine, db)
            self.registry.register(self._db_collector)
        if connected is not None:
            self.runners_connected.set_function(lambda: float(connected()))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _DbCollector(Collector):
    def __init__(self, engine: Engine, db: sessionmaker[Session]) -> None:
        self.engine = engine
        self.db = db

    def describe(self) -> list[Any]:
        return []  # read at scrape time only (not when registering)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily("gh_server_queue_depth", "Queued attempts by the runner label they need",
                                  labels=["label"])
        backlog = GaugeMetricFamily("gh_server_webhook_backlog", "Webhook deliveries not yet delivered or given up")
        try:
            with self.db() as s:
                for label, n in s.execute(select(Attempt.runs_on, func.count()).where(Attempt.status == "queued")
                                          .group_by(Attempt.runs_on)).all():
                    depth.add_metric([label or "vm"], n)
                backlog.add_metric([], s.scalar(select(func.count()).select_from(WebhookDelivery).where(
                    WebhookDelivery.delivered_at.is_(None), WebhookDelivery.next_attempt_at.is_not(None))) or 0)
        except Exception:  # a scrape must not fail because the database is down: /healthz says that
            log.warning("metrics: the database could not be read", exc_info=True)
        yield depth
        yield backlog
        pool = self.engine.pool
        if isinstance(pool, QueuePool):
            size = GaugeMetricFamily("gh_server_db_pool_size", "Connections the DB pool keeps open")
            size.add_metric([], pool.size())
            used = GaugeMetricFamily("gh_server_db_pool_checked_out", "DB connections in use now")
            used.add_metric([], pool.checkedout())
            over = GaugeMetricFamily("gh_server_db_pool_overflow", "Connections open beyond the pool size now")
            over.add_metric([], max(pool.overflow(), 0))
            yield size
            yield used
            yield over
