"""Hypothesis fuzzing of the gateway (gh_server.gateway) with a hostile runner's frames, on a real
websocket: malformed frames each get an `error` reply and never end the session; well-formed frames
about another runner's attempt (status, result, replay frame, refusal, job result, machine response)
change nothing of it and never make the server fail ("internal"); what they say reaches the server's
log quoted, never as a forged line of its own; the session still works after."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any, TypeVar

from gateway.conftest import GwServer
from gateway.simrunner import SimRunner
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from gh_server.models import Attempt, ReplayFrame, Runner, utcnow
from gh_wire import protocol

T = TypeVar("T")
MALFORMED = 300
HOSTILE = 150
RUNNER_TYPES = ["hello", "heartbeat", "lease_accept", "lease_refuse", "attempt_status", "attempt_result",
                "replay_frame", "machine_response", "job_result", "error"]

json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_any = st.recursive(json_leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c,
                                                                                       max_size=4), max_leaves=12)
malformed: st.SearchStrategy[str | bytes] = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200),
    json_any.map(json.dumps),
    st.builds(lambda t, d: json.dumps({**d, "type": t}), st.sampled_from(RUNNER_TYPES),
              st.dictionaries(st.sampled_from(["attempt_id", "request_id", "status", "at", "job_id", "result",
                                               "seq", "png_b64", "ok", "slots"]), json_any, max_size=4)),
    st.just('{"type": "attempt_status", "attempt_id": ' + "[" * 5000 + "]" * 5000 + "}"),  # deep nesting
    st.just("{" * 100),
)


def hostile(victim: str) -> st.SearchStrategy[str]:
    """Valid frames, all about the victim runner's attempt (or ids nobody has)."""
    at = datetime.now(UTC)
    ids = st.sampled_from([victim, "at_nobody", "", "at_x\n2026-12-01 INFO gh_server: forged"]) | st.text(max_size=30)
    png = base64.b64encode(b"\x89PNG\r\n\x1a\nnot really").decode()
    return st.one_of(
        st.builds(lambda a, s: protocol.AttemptStatus(attempt_id=a, status=s, phase=s, at=at), ids,
                  st.sampled_from(["preparing", "running", "checking", "done"])),
        st.builds(lambda a, o: protocol.AttemptFinished(result=protocol.AttemptResult(attempt_id=a, outcome=o)),
                  ids, st.sampled_from(["passed", "failed", "error"])),
        st.builds(lambda a, n: protocol.ReplayFrame(attempt_id=a, seq=n, at=at, label="input", png_b64=png), ids,
                  st.integers(0, 10**6)),
        st.builds(lambda a, r: protocol.LeaseRefuse(attempt_id=a, reason=r), ids, st.text(max_size=50)),
        st.builds(lambda a: protocol.LeaseAccept(attempt_id=a), ids),
        st.builds(lambda j, ok: protocol.JobResult(job_id=j, ok=ok), st.text(max_size=30), st.booleans()),
        st.builds(lambda r, ok: protocol.MachineResponse(request_id=r, ok=ok), st.text(max_size=30), st.booleans()),
    ).map(protocol.encode)


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info is None:  # a traceback is multi-line by nature (and would fail the test anyway)
            self.messages.append(record.getMessage())


class Harness:
    """The hostile runner on an event loop in a thread, so plain hypothesis tests can drive it."""

    def __init__(self, srv: GwServer, token: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.r = SimRunner(srv.ws_url, token, name="hostile", slots=1, images=["linux-tiny"])

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _roundtrip(self, frame: str | bytes) -> Any:
        await self.r.send_raw(frame)
        return await self.r.expect("error")

    def roundtrip(self, frame: str | bytes) -> Any:
        return self.call(self._roundtrip(frame))

    def stop(self) -> None:
        try:
            self.call(self.r.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


def _victim_attempt(srv: GwServer) -> tuple[str, str]:
    victim, _ = srv.add_runner("victim")
    _, (aid,) = srv.add_run([{}], pin=victim)
    with srv.session() as s:
        a = s.get(Attempt, aid)
        assert a is not None
        a.status, a.runner_id = "running", victim  # leased to the victim, in its task
        r = s.get(Runner, victim)
        assert r is not None
        r.session_id, r.last_seen_at = "another-gh-server-process", utcnow()  # connected elsewhere, alive
        s.commit()
    return victim, aid


def test_gateway_survives_malformed_and_hostile_frames(server_factory: Any) -> None:
    # The victim is connected to "another process" (its row says so): a long grace keeps it alive meanwhile.
    server: GwServer = server_factory(runner_grace_seconds=600.0)
    victim, aid = _victim_attempt(server)
    _, token = server.add_runner("hostile")
    h = Harness(server, token)
    log_lines = _Keep()
    logging.getLogger("gh_server").addHandler(log_lines)
    try:
        h.call(h.r.connect())
        replies: list[Any] = []

        @settings(max_examples=MALFORMED, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(frame=malformed)
        def one_malformed(frame: str | bytes) -> None:
            try:
                protocol.parse_runner_message(frame)
            except protocol.ProtocolError:
                pass
            else:
                assume(False)  # a frame that happens to be valid is the other test's business
            replies.append(h.roundtrip(frame))

        one_malformed()
        assert len(replies) >= MALFORMED // 2, f"hypothesis produced only {len(replies)} malformed frames"
        assert {e.code for e in replies} <= {"bad_json", "bad_message", "unknown_type"}

        sent: list[str] = []

        @settings(max_examples=HOSTILE, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(frame=hostile(aid))
        def one_hostile(frame: str) -> None:
            h.call(h.r.send_raw(frame))
            sent.append(frame)

        one_hostile()
        h.call(h.r.sync())  # frames are handled in order: everything above has been handled now
        stashed = [m for m in h.r.stash if m.type == "error"]
        assert all(m.code != "internal" for m in stashed), [m.message for m in stashed if m.code == "internal"]
        assert h.r.close_code is None and not h.r.closed.is_set()  # still the same session
        with server.session() as s:
            a = s.get(Attempt, aid)
            assert a is not None
            assert (a.status, a.runner_id, a.outcome) == ("running", victim, None), a.error
            frames = s.scalar(select(func.count()).select_from(ReplayFrame).where(ReplayFrame.attempt_id == aid))
            assert frames == 0
        # and it still works: after a heartbeat (which ends the pause its fuzzed lease_refuses earned it, as
        # a real runner's would), a lease for it arrives as ever
        h.call(h.r.send(protocol.Heartbeat(at=datetime.now(UTC), busy=0)))
        _, (mine,) = server.add_run([{}])
        lease = h.call(h.r.expect("lease"))
        assert lease.attempt_id == mine
        forged = [m for m in log_lines.messages if any(c in m for c in "\n\r\x1b\x00\u2028")]
        assert not forged, forged[:5]  # a runner's text with a newline would start a fake log line
    finally:
        logging.getLogger("gh_server").removeHandler(log_lines)
        h.stop()
