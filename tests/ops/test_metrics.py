"""Metrics: the series a Prometheus scrape of a runner's listener gets."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gh_runner import __version__
from gh_runner.metrics import MetricsListenError, RunnerMetrics, parse_listen
from gh_wire.protocol import AttemptMetrics, AttemptResult


@pytest.fixture
def metrics() -> Iterator[RunnerMetrics]:
    m = RunnerMetrics(slots=2, name="lab-1")
    try:
        yield m
    finally:
        m.close()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_endpoint_serves_the_expected_series(metrics: RunnerMetrics) -> None:
    bound = metrics.serve("127.0.0.1:0")
    assert bound.port > 0
    metrics.set_connection("connected")
    metrics.set_busy(1)
    metrics.reconnecting()
    metrics.set_connection("connected")
    metrics.attempt_finished(AttemptResult(
        attempt_id="at_1", outcome="passed",
        metrics=AttemptMetrics(phase_seconds={"boot": 3.2, "setup": 0.4, "check_after": 0.07}),
    ))
    metrics.attempt_finished(AttemptResult(attempt_id="at_2", outcome="error", error="guest never answered"))
    metrics.set_journal_backlog(3)
    metrics.set_machines_running(1)
    metrics.reaped_leftovers(2)
    metrics.tick()

    r = httpx.get(f"http://127.0.0.1:{bound.port}/metrics", timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    s = samples(r.text)
    assert s[("gh_runner_attempts_total", (("outcome", "passed"),))] == 1
    assert s[("gh_runner_attempts_total", (("outcome", "error"),))] == 1
    assert s[("gh_runner_attempts_total", (("outcome", "failed"),))] == 0
    assert s[("gh_runner_phase_duration_seconds_count", (("phase", "boot"),))] == 1
    assert s[("gh_runner_phase_duration_seconds_sum", (("phase", "boot"),))] == pytest.approx(3.2)
    assert s[("gh_runner_phase_duration_seconds_bucket", (("le", "5.0"), ("phase", "boot")))] == 1
    assert s[("gh_runner_phase_duration_seconds_bucket", (("le", "2.5"), ("phase", "boot")))] == 0
    assert s[("gh_runner_slots", ())] == 2
    assert s[("gh_runner_slots_busy", ())] == 1
    assert s[("gh_runner_connected", ())] == 1
    assert s[("gh_runner_connection_state", (("gh_runner_connection_state", "connected"),))] == 1
    assert s[("gh_runner_connection_state", (("gh_runner_connection_state", "connecting"),))] == 0
    assert s[("gh_runner_reconnects_total", ())] == 1
    assert s[("gh_runner_journal_backlog", ())] == 3
    assert s[("gh_runner_machines_running", ())] == 1
    assert s[("gh_runner_reaped_leftovers_total", ())] == 2
    assert s[("gh_runner_main_loop_last_tick_timestamp_seconds", ())] > 1.7e9
    info = [k for k in s if k[0] == "gh_runner_build_info"]
    assert len(info) == 1 and ("version", __version__) in info[0][1] and ("name", "lab-1") in info[0][1]


def test_two_runners_in_one_process_do_not_collide() -> None:
    a, b = RunnerMetrics(slots=1), RunnerMetrics(slots=4)
    a.set_busy(1)
    assert samples(a.render().decode())[("gh_runner_slots_busy", ())] == 1
    assert samples(b.render().decode())[("gh_runner_slots_busy", ())] == 0
    assert samples(b.render().decode())[("gh_runner_slots", ())] == 4


def test_unknown_connection_state_is_refused(metrics: RunnerMetrics) -> None:
    with pytest.raises(ValueError, match="unknown connection state"):
        metrics.set_connection("wobbly")


def test_busy_port_gives_a_clear_error(metrics: RunnerMetrics) -> None:
    bound = metrics.serve("127.0.0.1:0")
    other = RunnerMetrics()
    try:
        with pytest.raises(MetricsListenError, match=f"127.0.0.1:{bound.port}"):
            other.serve(f"127.0.0.1:{bound.port}")
    finally:
        other.close()


@pytest.mark.parametrize(("raw", "host", "port", "loopback"), [
    ("9464", "127.0.0.1", 9464, True),
    (":9464", "127.0.0.1", 9464, True),
    ("127.0.0.1:9100", "127.0.0.1", 9100, True),
    ("localhost:9100", "localhost", 9100, True),
    ("[::1]:9100", "::1", 9100, True),
    ("0.0.0.0:9100", "0.0.0.0", 9100, False),
    ("10.1.2.3:9100", "10.1.2.3", 9100, False),
])
def test_parse_listen(raw: str, host: str, port: int, loopback: bool) -> None:
    a = parse_listen(raw)
    assert (a.host, a.port, a.loopback) == (host, port, loopback)


@pytest.mark.parametrize("raw", ["", "host:", "127.0.0.1:http", "::1:9100", "[::1]9100", "1.2.3.4:70000"])
def test_parse_listen_rejects(raw: str) -> None:
    with pytest.raises(MetricsListenError, match="metrics-listen"):
        parse_listen(raw)
