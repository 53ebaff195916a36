"""Leases, results, retries and runs, through the real gateway and a simulated runner."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import update

from gh_server.attempts.completion import run_summary
from gh_server.models import Runner, TestRun
from gh_wire import protocol

from .conftest import GwServer, await_for
from .simrunner import SimRunner, now


@pytest.fixture
def server(any_db_server: GwServer) -> GwServer:
    return any_db_server


async def no_lease(r: SimRunner, within: float = 1.5) -> None:
    """Assert that no lease arrives for a while (negative check: the window is the assertion)."""
    try:
        m = await r.expect("lease", timeout=within)
    except AssertionError:
        return
    raise AssertionError(f"unexpected lease {m.attempt_id}")


async def test_leases_respect_free_slots(server: GwServer) -> None:
    _, token = server.add_runner()
    r = await SimRunner(server.ws_url, token, slots=2, images=["linux-tiny"]).connect()
    try:
        run_id, ids = server.add_run([{}] * 5)
        l1 = await r.expect("lease")
        l2 = await r.expect("lease")
        assert {l1.attempt_id, l2.attempt_id} <= set(ids)
        assert l1.case.check_script == "echo True" and l1.start_state.image == "linux-tiny"
        assert l1.test_run_id == run_id and l1.agent_id == "noop"
        await r.send(protocol.LeaseAccept(attempt_id=l1.attempt_id))
        await no_lease(r)  # 2 slots, 2 leased: nothing more, whatever the runner's self-reported busy
        assert server.run(run_id).status == "running"
        await r.finish(l1.attempt_id)
        l3 = await r.expect("lease")
        assert l3.attempt_id not in (l1.attempt_id, l2.attempt_id)
        await no_lease(r)
    finally:
        await r.close()


async def test_labels_and_vm(server: GwServer) -> None:
    _, t_vm = server.add_runner("vm-host")
    _, t_hw = server.add_runner("lenovo-host")
    vm = await SimRunner(server.ws_url, t_vm, name="vm-host", slots=4, labels=["lab"], images=["linux-tiny"]).connect()
    hw = await SimRunner(server.ws_url, t_hw, name="lenovo-host", slots=4, labels=["lenovo"]).connect()
    try:
        _, (hw_attempt,) = server.add_run([{"runs_on": "lenovo", "start_state": "bare-metal"}],
                                          start_state={"kind": "image", "image": "bare-metal"})
        # `lenovo` only goes to the runner with that label... which must also have the start state.
        await no_lease(hw)
        await no_lease(vm, 0.1)
        # `vm` needs a runner that advertises images: the hardware runner has none.
        _, (vm_attempt,) = server.add_run([{}])
        lease = await vm.expect("lease")
        assert lease.attempt_id == vm_attempt
        await no_lease(hw, 0.5)
        assert server.attempt(hw_attempt).status == "queued"
    finally:
        await vm.close()
        await hw.close()


async def test_label_with_matching_image(server: GwServer) -> None:
    _, token = server.add_runner()
    r = await SimRunner(server.ws_url, token, slots=1, labels=["lenovo"], images=["win10-22h2"]).connect()
    try:
        _, (other,) = server.add_run([{"runs_on": "lenovo"}])  # linux-tiny: not advertised here
        _, (good,) = server.add_run([{"runs_on": "lenovo", "start_state": "win10-22h2"}])
        lease = await r.expect("lease")
        assert lease.attempt_id == good
        assert server.attempt(other).status == "queued"
    finally:
        await r.close()


async def test_start_state_versions_and_pins(server: GwServer) -> None:
    rid_a, t_a = server.add_runner("a")
    _rid_b, t_b = server.add_runner("b")
    a = await SimRunner(server.ws_url, t_a, name="a", slots=2, images=["linux-tiny"], held=[("ss_1", 1)]).connect()
    b = await SimRunner(server.ws_url, t_b, name="b", slots=2, images=["linux-tiny"], held=[("ss_1", 2)]).connect()
    try:
        ss = {"kind": "state", "image": "linux-tiny", "start_state_id": "ss_1", "version": 2}
        _, (aid,) = server.add_run([{"start_state": "ss_1"}], start_state=ss)
        lease = await b.expect("lease")  # only b holds version 2
        assert lease.attempt_id == aid and lease.start_state.version == 2
        await no_lease(a, 0.5)
        # A pinned attempt goes to its runner even when another could run it.
        _, (pinned,) = server.add_run([{}], pin=rid_a)
        assert (await a.expect("lease")).attempt_id == pinned
        assert server.attempt(pinned).runner_id == rid_a
    finally:
        await a.close()
        await b.close()


async def test_refused_lease_goes_to_another_runner(server: GwServer) -> None:
    _, t1 = server.add_runner("picky")
    r1 = await SimRunner(server.ws_url, t1, name="picky", slots=1, images=["linux-tiny"]).connect()
    try:
        _, (aid,) = server.add_run([{}])
        lease = await r1.expect("lease")
        await r1.send(protocol.LeaseRefuse(attempt_id=aid, reason="disk full"))
        await await_for(lambda: server.attempt(aid).status == "queued", what="back to queued")
        await no_lease(r1)  # skipped for it for a while
        _, t2 = server.add_runner("other")
        r2 = await SimRunner(server.ws_url, t2, name="other", slots=1, images=["linux-tiny"]).connect()
        try:
            assert (await r2.expect("lease")).attempt_id == lease.attempt_id
        finally:
            await r2.close()
    finally:
        await r1.close()


async def test_runner_refusing_as_unwell_gets_no_other_attempt(server: GwServer) -> None:
    """The server reads a refusal's code: a runner low on disk is skipped for every attempt a while."""
    _, t1 = server.add_runner("lowdisk")
    r1 = await SimRunner(server.ws_url, t1, name="lowdisk", slots=2, images=["linux-tiny"]).connect()
    try:
        _, (aid,) = server.add_run([{}])
        assert (await r1.expect("lease")).attempt_id == aid
        await r1.send(protocol.LeaseRefuse(attempt_id=aid, reason="disk low", code=protocol.LeaseRefusal.DISK_LOW))
        await await_for(lambda: server.attempt(aid).status == "queued", what="back to queued")
        await r1.send(protocol.Heartbeat(at=now(), busy=0))  # says nothing of its disk: still skipped
        _, (other,) = server.add_run([{}])
        await no_lease(r1)
        _, t2 = server.add_runner("healthy")
        r2 = await SimRunner(server.ws_url, t2, name="healthy", slots=2, images=["linux-tiny"]).connect()
        try:
            got = {(await r2.expect("lease")).attempt_id for _ in range(2)}
            assert got == {aid, other}
        finally:
            await r2.close()
    finally:
        await r1.close()


async def test_results_applied_once_across_resends(server: GwServer) -> None:
    _, token = server.add_runner()
    r = await SimRunner(server.ws_url, token, slots=1, images=["linux-tiny"]).connect()
    try:
        run_id, (aid,) = server.add_run([{}])
        await r.expect("lease")
        await r.status(aid, "preparing")
        await r.status(aid, "checking")
        ack = await r.finish(aid, "failed", answer="first", check_after="False")
        assert ack.attempt_id == aid
        first = server.attempt(aid)
        assert first.status == "done" and first.outcome == "failed" and first.answer == "first"
        assert first.check == {"before": "False", "after": "False", "passed": False, "before_score": 0.0}
        assert first.metrics is not None and first.metrics["steps"] == 2
        # The runner did not see the ack (say) and resends, even with different content: acked, ignored.
        ack2 = await r.finish(aid, "passed", answer="second")
        assert ack2.attempt_id == aid
        again = server.attempt(aid)
        assert again.outcome == "failed" and again.answer == "first" and again.finished_at == first.finished_at
        # A late status never moves a done attempt back.
        await r.status(aid, "running")
        await r.finish(aid)  # round trip so the status was handled
        assert server.attempt(aid).status == "done"
        await await_for(lambda: server.run(run_id).status == "completed", what="run completed")
    finally:
        await r.close()


async def test_result_for_unknown_attempt_is_acked_not_applied(server: GwServer) -> None:
    _, token = server.add_runner()
    r = await SimRunner(server.ws_url, token, slots=1, images=["linux-tiny"]).connect()
    try:
        ack = await r.finish("at_doesnotexist")
        assert ack.attempt_id == "at_doesnotexist"
    finally:
        await r.close()


async def test_errors_retried_twice_with_retry_of(server: GwServer) -> None:
    _, token = server.add_runner()
    r = await SimRunner(server.ws_url, token, slots=1, images=["linux-tiny"]).connect()
    try:
        run_id, (first,) = server.add_run([{}])
        seen = []
        for _ in range(3):
            lease = await r.expect("lease")
            seen.append(lease.attempt_id)
            assert lease.try_number == 1
            await r.finish(lease.attempt_id, "error", error="setup script exited 1")
        await no_lease(r)  # 3 attempts a try: no fourth
        assert seen[0] == first
        rows = {a.id: a for a in server.attempts_of(run_id)}
        assert len(rows) == 3
        assert rows[seen[1]].retry_of == seen[0] and rows[seen[2]].retry_of == seen[1]
        assert [rows[i].is_last for i in seen] == [False, False, True]
        assert all(rows[i].outcome == "error" and rows[i].error == "setup script exited 1" for i in seen)
        await await_for(lambda: server.run(run_id).status == "completed", what="run completed")
        with server.session() as s:
            progress, rate = run_summary(s, run_id)
        assert progress == {"total": 1, "queued": 0, "running": 0, "passed": 0, "failed": 0, "error": 1,
                            "assisted": 0}
        assert rate == {"noop": None}  # errors never count against an agent
    finally:
        await r.close()


async def test_error_then_pass_counts_the_retry(server: GwServer) -> None:
    _, token = server.add_runner()
    r = await SimRunner(server.ws_url, token, slots=2, images=["linux-tiny"]).connect()
    try:
        run_id, ids = server.add_run([{}, {}], tries=2)
        outcomes = {ids[0]: "error", ids[1]: "passed", ids[2]: "failed", ids[3]: "passed"}
        done = 0
        while done < 5:
            lease = await r.expect("lease")
            await r.finish(lease.attempt_id, outcomes.get(lease.attempt_id, "passed"))
            done += 1
        await await_for(lambda: server.run(run_id).status == "completed", what="run completed")
        run = server.run(run_id)
        assert run.started_at is not None and run.finished_at is not None
        with server.session() as s:
            progress, rate = run_summary(s, run_id)
        assert progress == {"total": 4, "queued": 0, "running": 0, "passed": 3, "failed": 1, "error": 0,
                            "assisted": 0}
        assert rate == {"noop": 0.75}
    finally:
        await r.close()


async def test_disconnect_grace_then_error_and_retry(server: GwServer) -> None:
    rid, token = server.add_runner("flaky")
    r = await SimRunner(server.ws_url, token, name="flaky", slots=1, images=["linux-tiny"]).connect()
    run_id, (aid,) = server.add_run([{}])
    await r.expect("lease")
    await r.send(protocol.LeaseAccept(attempt_id=aid))
    await r.status(aid, "preparing")
    await r.sync()
    await r.close()
    # Disconnected, but within the grace period (2 s here): the attempt stays the runner's.
    await await_for(lambda: server.runner_row(rid).disconnected_at is not None, what="disconnect recorded")
    assert server.attempt(aid).status == "preparing"
    gone = await await_for(lambda: server.attempt(aid).status == "done" and server.attempt(aid), timeout=30,
                           what="attempt errored after grace")
    assert gone.outcome == "error"
    assert gone.error == "runner flaky disconnected and did not come back within 2 s"
    # A lost attempt carries the phase the results page counts it under, and where it was.
    assert (gone.metrics or {}).get("error_phase") == "runner"
    assert (gone.metrics or {}).get("lost_in_status") == "preparing"
    retry = [a for a in server.attempts_of(run_id) if a.retry_of == aid]
    assert len(retry) == 1 and retry[0].status == "queued" and retry[0].is_last
    # Coming back, the runner gets the retry; its journal's late result for the old one is acked, ignored.
    r2 = await SimRunner(server.ws_url, token, name="flaky", slots=1, images=["linux-tiny"]).connect()
    try:
        assert (await r2.expect("lease")).attempt_id == retry[0].id
        await r2.finish(aid, "passed")
        assert server.attempt(aid).outcome == "error"
    finally:
        await r2.close()


async def test_reconnect_within_grace_keeps_listed_attempts_and_errors_lost_ones(server: GwServer) -> None:
    _, token = server.add_runner("restarts")
    r = await SimRunner(server.ws_url, token, name="restarts", slots=2, images=["linux-tiny"]).connect()
    run_id, _ids = server.add_run([{}, {}])
    leased = [(await r.expect("lease")).attempt_id for _ in range(2)]
    for aid in leased:
        await r.status(aid, "preparing")
    await r.sync()  # both really started before the runner goes away
    await r.close()
    kept, lost = leased
    r2 = SimRunner(server.ws_url, token, name="restarts", slots=2, images=["linux-tiny"], in_flight=[kept, "at_ghost"])
    await r2.connect()
    try:
        assert r2.welcome is not None and r2.welcome.resume == [kept]
        cancel = await r2.expect("cancel")  # an attempt the server does not know: drop it
        assert cancel.attempt_id == "at_ghost"
        assert server.attempt(kept).status == "preparing"
        gone = server.attempt(lost)
        assert gone.outcome == "error" and "reconnected without this attempt" in (gone.error or "")
        retry = await r2.expect("lease")
        assert server.attempt(retry.attempt_id).retry_of == lost
    finally:
        await r2.close()
    assert run_id


async def test_cancelled_run_sends_cancel(server: GwServer) -> None:
    _, token = server.add_runner()
    r = await SimRunner(server.ws_url, token, slots=1, images=["linux-tiny"]).connect()
    try:
        run_id, (aid, queued) = server.add_run([{}, {}])
        await r.expect("lease")
        await r.status(aid, "running")
        with server.session() as s:  # what POST /v1/test_runs/{id}/cancel does
            s.execute(update(TestRun).where(TestRun.id == run_id).values(status="cancelled"))
            s.commit()
        server.state.wake()
        cancel = await r.expect("cancel", timeout=15)
        assert cancel.attempt_id == aid
        await await_for(lambda: server.attempt(aid).status == "cancelled", what="attempt cancelled")
        assert server.attempt(queued).status == "cancelled"
        await no_lease(r)  # the slot is free but nothing of a cancelled run is leased
        ack = await r.finish(aid, "failed")  # the runner's result after the cancel: acked, ignored
        assert ack.attempt_id == aid and server.attempt(aid).outcome is None
        assert server.run(run_id).status == "cancelled"
    finally:
        await r.close()


async def test_revoked_runner_is_closed_4001(server: GwServer) -> None:
    rid, token = server.add_runner()
    r = await SimRunner(server.ws_url, token, slots=1).connect()
    try:
        # Another gh-server process deleting it only leaves the row: the liveness write notices.
        with server.session() as s:
            s.execute(update(Runner).where(Runner.id == rid).values(revoked_at=protocol.datetime.now().astimezone()))
            s.commit()
        assert await r.wait_closed(timeout=15) == protocol.CLOSE_TOKEN_REVOKED
    finally:
        await r.close()
    again = SimRunner(server.ws_url, token)
    await again.connect(send_hello=False)
    assert await again.wait_closed() == protocol.CLOSE_TOKEN_REVOKED
    await again.close()


async def test_reconnect_without_an_unstarted_lease_requeues_it(server: GwServer) -> None:
    _, token = server.add_runner("restarts")
    r = await SimRunner(server.ws_url, token, name="restarts", slots=1, images=["linux-tiny"]).connect()
    run_id, (aid,) = server.add_run([{}])
    await r.expect("lease")  # ... and the runner dies before accepting or starting it
    await r.close()
    r2 = await SimRunner(server.ws_url, token, name="restarts", slots=1, images=["linux-tiny"]).connect()
    try:
        again = await r2.expect("lease")
        assert again.attempt_id == aid  # the same attempt: nothing ran, so no error and no retry
        assert len(server.attempts_of(run_id)) == 1
    finally:
        await r2.close()


async def test_draining_runner_gets_no_leases(server: GwServer) -> None:
    _, token = server.add_runner()
    r = await SimRunner(server.ws_url, token, slots=2, images=["linux-tiny"]).connect()
    try:
        await r.send(protocol.Heartbeat(at=now(), busy=0, draining=True))
        await r.sync()
        server.add_run([{}])
        await no_lease(r)
        await r.send(protocol.Heartbeat(at=now(), busy=0))  # drain called off (say): back in business
        await r.expect("lease")
    finally:
        await r.close()


async def test_runner_refusing_in_a_row_is_paused_until_its_heartbeat(server: GwServer) -> None:
    _, token = server.add_runner()
    # Silent between its own frames: any heartbeat, an answer to the server's too, ends the pause.
    r = await SimRunner(server.ws_url, token, slots=4, images=["linux-tiny"], answer_heartbeats=False).connect()
    try:
        _, ids = server.add_run([{}] * 3)
        first = [(await r.expect("lease")).attempt_id for _ in range(3)]
        assert sorted(first) == sorted(ids)
        for aid in first[:2]:
            await r.send(protocol.LeaseRefuse(attempt_id=aid, reason="no free slot: 4 of 4 busy"))
        await r.sync()
        _, (late,) = server.add_run([{}])
        await no_lease(r)  # paused: it said twice that it is full
        await r.send(protocol.Heartbeat(at=now(), busy=1))
        assert (await r.expect("lease")).attempt_id == late  # the refused two stay skipped for a while
    finally:
        await r.close()


async def test_frozen_case_no_runner_could_take_is_an_error_not_a_stall(server: GwServer) -> None:
    _, token = server.add_runner()
    r = await SimRunner(server.ws_url, token, slots=2, images=["linux-tiny"]).connect()
    try:
        run_id, (bad, good) = server.add_run([{"limits": {"minutes": 2000, "steps": None}}, {}])
        assert (await r.expect("lease")).attempt_id == good
        a = await await_for(lambda: server.attempt(bad).status == "done" and server.attempt(bad), what="errored")
        assert a.outcome == "error" and "frozen test case cannot be sent" in (a.error or "")
        assert "minutes: Input should be less than or equal to 1440" in (a.error or "")
        assert len(server.attempts_of(run_id)) == 2  # not retried: the same copy would fail again
        await no_lease(r)
    finally:
        await r.close()


async def test_a_retry_after_our_error_waits_and_prefers_another_runner(server_factory: Any) -> None:
    """An error of ours (a hypervisor restarting) must not burn a try's retries within
    milliseconds on the same runner. The retry is held back (`retry_backoff_seconds`), and the runner
    the error came from waits twice as long, so the other runner takes it."""
    server: GwServer = server_factory(retry_backoff_seconds=[2.0, 4.0])
    _, token_a = server.add_runner("a")
    _, token_b = server.add_runner("b")
    # Both stay alive past the server's 3 s dead-peer bound: the retry waits 2 s, and on a loaded host
    # the scheduler's next pass may come later than b's silence would be allowed (CI saw b dropped).
    a = (await SimRunner(server.ws_url, token_a, slots=1, images=["linux-tiny"], name="a").connect()).keep_alive()
    try:
        server.add_run([{}])
        first = await a.expect("lease")
        b = (await SimRunner(server.ws_url, token_b, slots=1, images=["linux-tiny"], name="b").connect()).keep_alive()
        try:
            await a.finish(first.attempt_id, "error", error="cannot reach libvirt")
            await no_lease(b, within=1.0)  # held back on every runner at first
            retry = await b.expect("lease", timeout=30)
            assert retry.try_number == 1 and retry.attempt_id != first.attempt_id
            await no_lease(a, within=0.5)  # the runner it failed on is not offered it
        finally:
            await b.close()
    finally:
        await a.close()
