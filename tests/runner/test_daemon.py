"""The daemon against a real websocket peer: slots, routing, results exactly once, restart, drain."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from gh_runner.journal import Journal
from gh_wire.protocol import Cancel, LeaseRefusal, MachineRequest, ResultAck, StartStateRef, StatusAck, TaskEnd

from .doubles import FakeProvider, ScriptedAttempt
from .peer import Peer, make_lease


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *a: self.events.append((name, a))

    def names(self) -> list[str]:
        return [n for n, _ in self.events]


async def test_lease_beyond_slots_is_refused_with_a_reason(peer: Peer, start_daemon: Any) -> None:
    await start_daemon(peer.url, slots=2)
    await peer.wait_type("hello")
    for i in range(3):
        await peer.send(make_lease(f"at_s{i}"))
    await peer.wait_type("lease_accept", where=lambda m: m.attempt_id == "at_s0")
    await peer.wait_type("lease_accept", where=lambda m: m.attempt_id == "at_s1")
    refuse = await peer.wait_type("lease_refuse")
    assert refuse.attempt_id == "at_s2"
    assert refuse.reason == "no free slot: 2 of 2 busy" and refuse.code is LeaseRefusal.NO_SLOT
    assert (await peer.wait_type("heartbeat", where=lambda m: m.busy == 2)).slots == 2
    # A slot frees when an attempt ends, and the next lease is accepted.
    await peer.send(TaskEnd(attempt_id="at_s0", answer="done"))
    await peer.wait_type("attempt_result")
    await peer.send(make_lease("at_s3"))
    await peer.wait_type("lease_accept", where=lambda m: m.attempt_id == "at_s3")


async def test_leases_for_missing_images_or_unsafe_ids_are_refused(peer: Peer, start_daemon: Any) -> None:
    await start_daemon(peer.url)
    await peer.wait_type("hello")
    await peer.send(make_lease("at_img", image="win10-22h2"))
    r = await peer.wait_type("lease_refuse", where=lambda m: m.attempt_id == "at_img")
    assert r.reason == "image 'win10-22h2' is not on this runner (it has: linux-tiny)"
    assert r.code is LeaseRefusal.IMAGE_MISSING
    await peer.send(make_lease("../../etc/passwd"))
    r = await peer.wait_type("lease_refuse", where=lambda m: m.attempt_id == "../../etc/passwd")
    assert "attempt id must be" in r.reason and r.code is LeaseRefusal.INVALID_LEASE


async def test_runs_on_matches_vm_or_one_of_the_runners_labels(peer: Peer, start_daemon: Any) -> None:
    await start_daemon(peer.url)  # labels lab, lenovo
    await peer.wait_type("hello")
    await peer.send(make_lease("at_lab", runs_on="lenovo"))
    await peer.wait_type("lease_accept", where=lambda m: m.attempt_id == "at_lab")
    await peer.send(make_lease("at_gpu", runs_on="gpu-rig"))
    r = await peer.wait_type("lease_refuse", where=lambda m: m.attempt_id == "at_gpu")
    assert r.reason == "runs_on 'gpu-rig' is not a label of this runner (labels: lab, lenovo; 'vm' always fits)"
    assert r.code is LeaseRefusal.LABEL_MISMATCH


async def test_every_other_refusal_carries_its_code(peer: Peer, start_daemon: Any) -> None:
    def failing_factory(lease: Any, *_: Any) -> Any:
        if lease.attempt_id == "at_broken":
            raise RuntimeError("no attempt for you")
        return ScriptedAttempt(lease, *_)

    peer.auto_ack = False
    await start_daemon(peer.url, attempt_factory=failing_factory)
    await peer.wait_type("hello")
    lease = make_lease("at_ver").model_copy(
        update={"start_state": StartStateRef(kind="state", image="linux-tiny", start_state_id="ss_1", version=3)})
    await peer.send(lease)
    r = await peer.wait_type("lease_refuse", where=lambda m: m.attempt_id == "at_ver")
    assert r.code is LeaseRefusal.VERSION_MISSING and "not held" in r.reason
    await peer.send(make_lease("at_broken"))
    r = await peer.wait_type("lease_refuse", where=lambda m: m.attempt_id == "at_broken")
    assert r.code is LeaseRefusal.START_FAILED and "no attempt for you" in r.reason
    await peer.send(make_lease("at_once"))
    await peer.send(TaskEnd(attempt_id="at_once", answer="done"))
    await peer.wait_type("attempt_result", where=lambda m: m.result.attempt_id == "at_once")
    await peer.send(make_lease("at_once"))  # the result is not acknowledged yet: a duplicate
    r = await peer.wait_type("lease_refuse", where=lambda m: m.attempt_id == "at_once")
    assert r.code is LeaseRefusal.DUPLICATE
    assert all(m.code is not None for m in peer.of_type("lease_refuse"))


async def test_same_lease_twice_is_accepted_once(peer: Peer, start_daemon: Any) -> None:
    r = await start_daemon(peer.url)
    await peer.wait_type("hello")
    await peer.send(make_lease("at_dup"))
    await peer.send(make_lease("at_dup"))
    await peer.wait_until(lambda: len(peer.of_type("lease_accept")) == 2)
    assert r.daemon.busy == 1
    assert r.provider.state["created"] == ["at_dup"]


async def test_requests_task_end_and_cancel_are_routed_to_the_attempt(peer: Peer, start_daemon: Any) -> None:
    rec = Recorder()
    r = await start_daemon(peer.url, observers=[rec])
    await peer.wait_type("hello")
    await peer.send(make_lease("at_r1"))
    await peer.send(make_lease("at_r2"))
    await peer.wait_type("attempt_status", where=lambda m: m.attempt_id == "at_r1" and m.phase == "task")
    await peer.send(MachineRequest(request_id="rq1", attempt_id="at_r1", op="screen"))
    resp = await peer.wait_type("machine_response", where=lambda m: m.request_id == "rq1")
    assert resp.ok and base64.b64decode(resp.png_b64) == r.provider.png
    frame = await peer.wait_type("replay_frame")
    assert frame.attempt_id == "at_r1" and frame.seq == 0
    await peer.send(MachineRequest(request_id="rq2", attempt_id="at_nope", op="screen"))
    resp = await peer.wait_type("machine_response", where=lambda m: m.request_id == "rq2")
    assert not resp.ok and resp.error == "attempt at_nope is not running on this runner"

    await peer.send(TaskEnd(attempt_id="at_r1", answer="fixed it"))
    await peer.send(Cancel(attempt_id="at_r2", reason="run cancelled by user"))
    res1 = (await peer.wait_type("attempt_result", where=lambda m: m.result.attempt_id == "at_r1")).result
    res2 = (await peer.wait_type("attempt_result", where=lambda m: m.result.attempt_id == "at_r2")).result
    assert (res1.outcome, res1.answer) == ("passed", "fixed it")
    assert (res2.outcome, res2.error) == ("error", "cancelled: run cancelled by user")
    assert sorted(r.provider.state["destroyed"]) == ["at_r1", "at_r2"]

    await peer.send(TaskEnd(attempt_id="at_gone"))
    err = await peer.wait_type("error", where=lambda m: m.ref_type == "task_end")
    assert err.code == "refused"
    await peer.wait_until(lambda: r.daemon.journal.pending_results() == [])
    names = rec.names()
    for hook in ("welcome", "connected", "attempt_started", "busy_changed", "attempt_finished", "journal_backlog"):
        assert hook in names, hook
    finished = [a[0] for n, a in rec.events if n == "attempt_finished"]
    assert {f.attempt_id for f in finished} == {"at_r1", "at_r2"}


async def test_results_reach_the_server_exactly_once_across_disconnects(
        peer: Peer, start_daemon: Any, tmp_path: Path) -> None:
    peer.auto_ack = False
    r = await start_daemon(peer.url)
    await peer.wait_type("hello")
    await peer.send(make_lease("at_x1"))
    await peer.wait_type("lease_accept")
    await peer.send(TaskEnd(attempt_id="at_x1", answer="a"))
    first = await peer.wait_type("attempt_result")
    # The result is on disk before it goes out, and stays there until acked.
    journal = Journal(tmp_path / "state")
    assert [p.attempt_id for p in journal.pending_results()] == ["at_x1"]
    assert journal.inflight() == []
    # The server goes away before acking; the runner resends after reconnecting.
    await peer.close_current(1012, "restart")
    again = await peer.wait_for(lambda rr: rr.conn == 2 and rr.msg.type == "attempt_result")
    assert again.msg.result == first.result
    # And on its timer while still unacked (result_resend=0.5 s in these tests).
    await peer.wait_until(lambda: peer.result_copies["at_x1"] >= 3)
    await peer.send(ResultAck(attempt_id="at_x1"))
    await peer.send(ResultAck(attempt_id="at_x1"))  # a repeated ack is harmless
    await peer.wait_until(lambda: journal.pending_results() == [] and not r.daemon.outbox.pending)
    copies = peer.result_copies["at_x1"]
    assert list(peer.applied) == ["at_x1"]  # applied once, whatever the copies
    # Nothing is resent after the ack, even across another reconnect.
    await peer.close_current(1012, "restart")
    await peer.wait_for(lambda rr: rr.conn == 3 and rr.msg.type == "heartbeat")
    assert peer.result_copies["at_x1"] == copies


async def test_restart_reports_interrupted_attempts_and_reaps_their_machines(
        peer: Peer, start_daemon: Any, tmp_path: Path) -> None:
    # What a runner killed with -9 during the task phase leaves: an in-flight record and a machine.
    # (The real kill -9 of the CLI process is in test_cli.py.)
    state = tmp_path / "state"
    provider_state = tmp_path / "provider.json"
    j = Journal(state)
    j.open()
    j.update_phase(j.record_inflight("at_k1", "at_k1"), "running", "task")
    provider_state.write_text(json.dumps({"existing": ["at_k1"], "created": ["at_k1"], "destroyed": [],
                                          "reap_calls": []}))

    start = len(peer.received)
    await start_daemon(peer.url, provider=FakeProvider(state_file=provider_state), state_dir=state)
    hello = await peer.wait_type("hello", start=start)
    assert hello.in_flight == []
    res = (await peer.wait_type("attempt_result", start=start)).result
    assert res.attempt_id == "at_k1" and res.outcome == "error"
    assert "interrupted" in (res.error or "") and "phase task" in (res.error or "")
    st = json.loads(provider_state.read_text())
    assert st["existing"] == []
    assert st["reap_calls"][-1] == {"keep": [], "reaped": ["at_k1"]}
    await peer.wait_until(lambda: Journal(state).pending_results() == [])


async def test_attempts_the_server_gave_up_during_a_disconnect_are_cancelled(peer: Peer, start_daemon: Any) -> None:
    await start_daemon(peer.url)
    await peer.wait_type("hello")
    await peer.send(make_lease("at_keep"))
    await peer.send(make_lease("at_drop"))
    await peer.wait_until(lambda: len(peer.of_type("lease_accept")) == 2)
    peer.resume = lambda hello: ["at_keep"]
    await peer.close_current(1012)
    res = (await peer.wait_type("attempt_result")).result
    assert res.attempt_id == "at_drop" and res.outcome == "error"
    assert "gave this attempt up" in (res.error or "")
    await peer.send(TaskEnd(attempt_id="at_keep", answer="ok"))
    res = (await peer.wait_type("attempt_result", where=lambda m: m.result.attempt_id == "at_keep")).result
    assert res.outcome == "passed"


async def test_drain_lets_attempts_finish_and_refuses_new_leases(peer: Peer, start_daemon: Any) -> None:
    rec = Recorder()
    r = await start_daemon(peer.url, drain_grace=60, observers=[rec])
    await peer.wait_type("hello")
    await peer.send(make_lease("at_d1"))
    await peer.wait_type("attempt_status", where=lambda m: m.phase == "task")
    r.daemon.request_stop()
    await peer.wait_type("heartbeat", where=lambda m: m.draining is True)
    await peer.send(make_lease("at_d2"))
    refuse = await peer.wait_type("lease_refuse")
    assert refuse.reason.startswith("draining") and refuse.code is LeaseRefusal.DRAINING
    assert not r.task.done()
    await peer.send(TaskEnd(attempt_id="at_d1", answer="done"))
    assert await r.stop() == 0
    assert peer.applied["at_d1"].outcome == "passed"
    assert ("draining", (1,)) in rec.events and rec.events[-1] == ("stopped", (0,))


async def test_drain_grace_running_out_cancels_with_a_reason(peer: Peer, start_daemon: Any) -> None:
    r = await start_daemon(peer.url, drain_grace=0.5)
    await peer.wait_type("hello")
    await peer.send(make_lease("at_g1"))
    await peer.wait_type("attempt_status", where=lambda m: m.phase == "task")
    assert await r.stop() == 0
    res = peer.applied["at_g1"]
    assert res.outcome == "error" and "drain grace period" in (res.error or "")
    assert r.provider.state["destroyed"] == ["at_g1"]


async def test_forced_stop_exits_non_zero_and_keeps_results(peer: Peer, start_daemon: Any, tmp_path: Path) -> None:
    peer.auto_ack = False
    r = await start_daemon(peer.url, drain_grace=60)
    await peer.wait_type("hello")
    await peer.send(make_lease("at_f1"))
    await peer.wait_type("attempt_status", where=lambda m: m.phase == "task")
    assert await r.stop(force=True) == 1
    pending = Journal(tmp_path / "state").pending_results()
    assert [p.attempt_id for p in pending] == ["at_f1"]
    assert "forced to stop" in (pending[0].error or "")
    # The next start delivers it; the server applies it once however many copies it got.
    peer.auto_ack = True
    start = len(peer.received)
    await start_daemon(peer.url)
    again = (await peer.wait_type("attempt_result", start=start)).result
    assert again == pending[0]
    await peer.wait_until(lambda: Journal(tmp_path / "state").pending_results() == [])
    assert list(peer.applied) == ["at_f1"] and peer.applied["at_f1"] == pending[0]


async def test_reaper_keeps_live_machines(peer: Peer, start_daemon: Any) -> None:
    provider = FakeProvider()
    provider.state["existing"] = ["at_old_leftover"]
    r = await start_daemon(peer.url, provider=provider, reap_interval=0.2)
    await peer.wait_type("hello")
    assert provider.state["reap_calls"][0] == {"keep": [], "reaped": ["at_old_leftover"]}
    await peer.send(make_lease("at_live"))
    await peer.wait_type("attempt_status", where=lambda m: m.phase == "task")
    n = len(provider.state["reap_calls"])
    await peer.wait_until(lambda: len(provider.state["reap_calls"]) > n + 1)
    assert provider.state["reap_calls"][-1]["keep"] == ["at_live"]
    assert provider.state["existing"] == ["at_live"]
    assert r.daemon.busy == 1


async def test_an_open_start_state_holds_a_slot_until_closed(peer: Peer, start_daemon: Any) -> None:
    from gh_runner.jobs import StartStateJobs
    from gh_wire.protocol import Job, StartStateRef

    provider = FakeProvider()
    r = await start_daemon(peer.url, provider=provider, jobs=StartStateJobs(provider), slots=1, reap_interval=0.2)
    await peer.wait_type("hello")
    await peer.send(Job(job_id="jb_1", op="open", start_state_id="ss_1",
                        source=StartStateRef(kind="image", image="linux-tiny")))
    assert (await peer.wait_type("job_result")).ok
    await peer.wait_type("heartbeat", where=lambda m: m.busy == 1)
    await peer.send(make_lease("at_j1"))
    assert (await peer.wait_type("lease_refuse")).reason == "no free slot: 1 of 1 busy"
    await peer.send(MachineRequest(request_id="rq_ss", start_state_id="ss_1", op="screen"))
    resp = await peer.wait_type("machine_response", where=lambda m: m.request_id == "rq_ss")
    assert resp.ok and base64.b64decode(resp.png_b64) == provider.png
    n = len(provider.state["reap_calls"])
    await peer.wait_until(lambda: len(provider.state["reap_calls"]) > n)
    assert provider.state["existing"] == ["jb_1"]  # the reaper keeps the open machine
    await peer.send(Job(job_id="jb_2", op="close", start_state_id="ss_1"))
    await peer.wait_type("job_result", where=lambda m: m.job_id == "jb_2")
    await peer.wait_until(lambda: r.daemon.busy == 0)
    await peer.send(make_lease("at_j2"))
    await peer.wait_type("lease_accept", where=lambda m: m.attempt_id == "at_j2")
    assert "jb_1" in provider.state["destroyed"]


async def test_observers_see_disconnects_reconnects_and_reaping(peer: Peer, start_daemon: Any) -> None:
    rec = Recorder()
    provider = FakeProvider()
    provider.state["existing"] = ["at_left_behind"]
    await start_daemon(peer.url, provider=provider, observers=[rec], tick_interval=0.05)
    await peer.wait_type("hello")
    await peer.wait_until(lambda: rec.names().count("tick") >= 3)  # the watchdog's heartbeat
    await peer.close_current(4004, "bye")
    await peer.wait_for(lambda rr: rr.conn == 2 and rr.msg.type == "hello")
    await peer.wait_until(lambda: rec.names().count("connected") == 2)
    names = rec.names()
    assert ("reaped", (["at_left_behind"],)) in rec.events
    assert names.index("disconnected") < names.index("reconnect_scheduled") < len(names) - 1
    reason = next(a[0] for n, a in rec.events if n == "disconnected")
    assert "4004" in reason


async def test_a_status_lost_with_the_link_reaches_the_server_in_the_next_hello(peer: Peer, start_daemon: Any) -> None:
    """Statuses are delivered at least once (docs/protocol.md). The runner notes each one in the attempt's
    in-flight record before sending it; whatever the link lost, the next hello carries (`in_flight_phases`),
    and the server's `status_ack` for `running` tells the attempt its agent came."""
    peer.status_acks = True
    r = await start_daemon(peer.url)
    hello = await peer.wait_type("hello")
    # `scores`: this runner reads a check's 0.5 as a score, so the server may lease it scored cases.
    assert hello.status_acks and hello.scores and hello.in_flight_phases == []
    await peer.send(make_lease("at_ph"))
    await peer.wait_type("attempt_status", where=lambda m: m.attempt_id == "at_ph" and m.status == "running")
    await peer.close_current(1001, "server restarting")
    again = await peer.wait_for(lambda m: m.conn == 2 and getattr(m.msg, "type", None) == "hello")
    [phase] = again.msg.in_flight_phases
    assert (phase.attempt_id, phase.status, phase.phase) == ("at_ph", "running", "task")
    assert again.msg.in_flight == ["at_ph"]
    attempt = r.daemon.leases.running["at_ph"].attempt
    assert not attempt.agent_acked
    await peer.send(StatusAck(attempt_id="at_ph", status="running", phase="task", late_seconds=3.0))
    await peer.wait_until(lambda: attempt.agent_acked)
    assert attempt.agent_late == 3.0
    await peer.send(TaskEnd(attempt_id="at_ph", answer="done"))
    await peer.wait_type("attempt_result", where=lambda m: m.result.attempt_id == "at_ph")


async def test_an_unreachable_hypervisor_pauses_the_runner_until_it_answers(peer: Peer, start_daemon: Any) -> None:
    """While the hypervisor does not answer, leases are refused with a typed reason and the
    heartbeats say the runner is paused (the server then offers it nothing); it resumes by itself."""
    rec = Recorder()
    r = await start_daemon(peer.url, probe_interval=0.2, observers=[rec])
    await peer.wait_type("hello")
    r.provider.hypervisor_down = "cannot reach libvirt: Failed to connect socket"
    await peer.wait_type("heartbeat", where=lambda m: m.paused == LeaseRefusal.HYPERVISOR_DOWN)
    await peer.send(make_lease("at_hv"))
    refused = await peer.wait_type("lease_refuse", where=lambda m: m.attempt_id == "at_hv")
    assert refused.code == LeaseRefusal.HYPERVISOR_DOWN and "does not answer" in refused.reason
    r.provider.hypervisor_down = None
    n = len(peer.received)
    await peer.wait_type("heartbeat", start=n, where=lambda m: m.paused is None)
    await peer.send(make_lease("at_hv2"))
    await peer.wait_type("lease_accept", where=lambda m: m.attempt_id == "at_hv2")
    assert [a[0] for name, a in rec.events if name == "hypervisor"] == [False, True]
