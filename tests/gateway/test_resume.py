"""An attempt goes on from its save point when its runner comes back without it (issue 51, part 3;
gh_server/attempts/resume.py), the same attempt and not a retry: the runner tells the server of each save
point as it is made, and its hello after a restart lists the save point among its start-state versions.
The agent, on the server, runs on through the loss: its request while the runner is away waits for the
machine, and its first action on the restored machine is answered 409 `machine_restored` (not done)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gh_wire import protocol

from .conftest import GwServer, await_for
from .simrunner import SimRunner
from .test_agents import agent_dir, cmd_agent, tiny_png


class LostMachine:
    """The machine before the loss: answers execs, makes a save point and tells the server of it, and
    sets `second_exec` once it answered the agent's second exec (the test then drops the runner)."""

    def __init__(self, r: SimRunner) -> None:
        self.r = r
        self.execs = 0
        self.point: protocol.SavePoint | None = None
        self.second_exec = asyncio.Event()
        r.on_message = self.handle

    async def handle(self, msg: Any) -> bool:
        if not isinstance(msg, protocol.MachineRequest):
            return False
        aid = msg.attempt_id or ""
        if msg.op == "save_point":
            self.point = protocol.SavePoint(save_point_id=f"ss_{aid[3:]}p1", step=self.execs, bytes=4096,
                                            created_at=datetime.now(UTC), task_seconds=12.5)
            await self.r.send(protocol.SavePointMade(attempt_id=aid, save_point=self.point))
            await self.r.send(protocol.MachineResponse(request_id=msg.request_id, ok=True, save_point=self.point))
            return True
        if msg.op == "exec" and self.execs < 2:
            self.execs += 1
            await self.r.send(protocol.MachineResponse(request_id=msg.request_id, ok=True, exit_code=0, stdout=""))
            if self.execs == 2:
                self.second_exec.set()
        return True  # the third never gets an answer here: the runner is lost under it


class RestoredMachine:
    """The machine made again from the save point: refuses the first action as the runner does."""

    def __init__(self, r: SimRunner, point: protocol.SavePoint) -> None:
        self.r = r
        self.point = point
        self.ops: list[str] = []
        r.on_message = self.handle

    async def handle(self, msg: Any) -> bool:
        if not isinstance(msg, protocol.MachineRequest):
            return False
        self.ops.append(msg.op)
        if msg.op == "screen":
            resp = protocol.MachineResponse(request_id=msg.request_id, ok=True, png_b64=tiny_png())
        elif self.ops.count("exec") == 1:
            resp = protocol.MachineResponse(request_id=msg.request_id, ok=False,
                                            refusal=protocol.MachineRefusal.RESTORED, save_point=self.point,
                                            error=f"not done: the machine went back to save point "
                                                  f"{self.point.save_point_id}; look again")
        else:
            resp = protocol.MachineResponse(request_id=msg.request_id, ok=True, exit_code=0, stdout="")
        await self.r.send(resp)
        return True


async def in_its_task(server: GwServer, r: SimRunner, agent: str) -> tuple[str, tuple[str, ...]]:
    """A run of one 30-minute case for `agent`, its attempt leased to `r` and in its task: (run id, (attempt id,))."""
    run_id, aids = server.add_run([{"limits": {"minutes": 30}}], agents=[agent])
    await r.expect("lease")
    await r.send(protocol.LeaseAccept(attempt_id=aids[0]))
    await r.status(aids[0], "preparing")
    await r.status(aids[0], "running", "task")
    return run_id, tuple(aids)


async def pass_resumed(server: GwServer, r: SimRunner, run_id: str, end: protocol.TaskEnd,
                       point: protocol.SavePoint) -> None:
    """The resumed attempt's check passes on `r` and its result comes in; the run completes."""
    aid = end.attempt_id
    await r.status(aid, "checking")
    result = protocol.AttemptResult(
        attempt_id=aid, outcome="passed", answer=end.answer,
        check_after=protocol.CheckOutput(exit_code=0, stdout_tail="True", verdict="True"),
        metrics=protocol.AttemptMetrics(steps=end.steps, resumed=1), save_points=[point])
    await r.send(protocol.AttemptFinished(result=result))
    await r.expect("result_ack", where=lambda m: m.attempt_id == aid)
    await await_for(lambda: server.run(run_id).status == "completed", what="run completed")


async def test_a_runner_back_without_the_attempt_resumes_it_from_its_save_point(server_factory: Any) -> None:
    with agent_dir() as d:
        server: GwServer = server_factory(agents=cmd_agent("resume", Path(d) / "doc.json"), runner_grace_seconds=60.0)
        _, token = server.add_runner()
        first = SimRunner(server.ws_url, token, images=["linux-tiny"])
        first.hello.restores = True
        await first.connect()
        assert first.welcome is not None and first.welcome.save_points_told
        lost = LostMachine(first)
        run_id, (aid,) = server.add_run([{"limits": {"minutes": 30}}], agents=["cmd"])
        lease = await first.expect("lease")
        await first.send(protocol.LeaseAccept(attempt_id=aid))
        await first.status(aid, "preparing")
        await first.status(aid, "running", "task")
        await asyncio.wait_for(lost.second_exec.wait(), 60)
        for seq in range(3):  # its replay so far: the resumed run's frames come after these
            await first.send(protocol.ReplayFrame(attempt_id=aid, seq=seq, at=datetime.now(UTC), label="exec",
                                                  png_b64=tiny_png()))
        point = lost.point
        assert point is not None
        await await_for(lambda: [p["save_point_id"] for p in server.attempt(aid).save_points or []]
                        == [point.save_point_id], what="the save point kept on the attempt as it was made")
        await first.close()  # the runner is lost (a crash: it never said goodbye)

        second = SimRunner(server.ws_url, token, images=["linux-tiny"], held=[(point.save_point_id, 1)])
        second.hello.restores = True
        await second.connect()
        try:
            machine = RestoredMachine(second, point)
            again: protocol.Lease = await second.expect("lease")
            assert again.attempt_id == aid and again.try_number == lease.try_number
            assert again.restore is not None and again.restore.save_point == point and again.restore.resumed == 1
            assert again.restore.kept == [point] and again.restore.replay_seq == 3
            assert (again.start_state.kind, again.start_state.start_state_id, again.start_state.version) == (
                "state", point.save_point_id, 1)
            row = server.attempt(aid)
            assert row.status == "running" and row.outcome is None and (row.metrics or {}).get("resumed") == 1
            await second.send(protocol.LeaseAccept(attempt_id=aid))
            await second.status(aid, "preparing")
            await second.status(aid, "running", "task")
            # The previous process's report of the attempt it left comes after the hello: not applied.
            interrupted = protocol.AttemptResult(attempt_id=aid, outcome="error", error="interrupted: the runner "
                                                 "stopped", interrupted=True)
            await second.send(protocol.AttemptFinished(result=interrupted))
            await second.expect("result_ack", where=lambda m: m.attempt_id == aid)
            assert server.attempt(aid).status == "running"
            end = await second.expect("task_end", timeout=60)
            assert end.error is None, end.error
            # The request that met the loss in flight is 503 link_lost (whether done is not known), one made
            # after it waited on the server for the machine; then the first one on the restored machine.
            seen, _, last = end.answer.partition("; then ")
            assert last == "200" and seen.split(", ")[-1] == "409 machine_restored", end.answer
            assert set(seen.split(", ")[:-1]) <= {"503 link_lost"}, end.answer
            assert machine.ops == ["exec", "screen", "exec"]
            assert end.steps == 2  # the one before the save point and the one after: those undone are not counted
            await pass_resumed(server, second, run_id, end, point)
            done = server.attempt(aid)
            assert (done.outcome, done.try_number, (done.metrics or {}).get("resumed")) == ("passed", 1, 1)
            assert [a.id for a in server.attempts_of(run_id)] == [aid]  # no retry
        finally:
            await second.close()


async def test_without_a_save_point_it_is_still_our_error_and_retried(server_factory: Any) -> None:
    server: GwServer = server_factory(runner_grace_seconds=60.0)
    _, token = server.add_runner()
    first = SimRunner(server.ws_url, token, images=["linux-tiny"])
    first.hello.restores = True
    await first.connect()
    _, (aid,) = server.add_run([{"limits": {"minutes": 30}}], agents=["noop"])
    await first.expect("lease")
    await first.send(protocol.LeaseAccept(attempt_id=aid))
    await first.status(aid, "preparing")
    await first.status(aid, "running", "task")
    await first.close()
    second = SimRunner(server.ws_url, token, images=["linux-tiny"], held=[(f"ss_{aid[3:]}p1", 1)])
    second.hello.restores = True
    await second.connect()
    try:
        # It holds a version of that name, but the server was never told of a save point: not resumed.
        retry: protocol.Lease = await second.expect("lease")
        assert retry.attempt_id != aid and retry.restore is None
        row = server.attempt(aid)
        assert row.outcome == "error" and "reconnected without this attempt" in (row.error or "")
    finally:
        await second.close()


async def test_a_runner_gone_past_its_grace_has_the_attempt_go_on_elsewhere_through_the_registry(
        server_factory: Any) -> None:
    """Its save point was pushed to a registry (the second `save_point_made` carries the reference): once
    the runner is gone past its grace, another runner pulling from that registry gets the attempt with
    `restore`, the agent's requests follow it there, and the attempt passes there: same attempt, no retry."""
    with agent_dir() as d:
        server: GwServer = server_factory(agents=cmd_agent("resume", Path(d) / "doc.json"), runner_grace_seconds=1.0)
        a_id, a_token = server.add_runner("a")
        b_id, b_token = server.add_runner("b")
        a = SimRunner(server.ws_url, a_token, name="a", images=["linux-tiny"])
        a.hello.restores = True
        a.hello.registry = "127.0.0.1:5000/gh"
        await a.connect()
        lost = LostMachine(a)
        run_id, (aid,) = await in_its_task(server, a, "cmd")
        await asyncio.wait_for(lost.second_exec.wait(), 60)
        assert lost.point is not None
        pushed = lost.point.model_copy(update={"registry_ref": "127.0.0.1:5000/gh/states@sha256:" + "ab" * 32})
        await a.send(protocol.SavePointMade(attempt_id=aid, save_point=pushed))
        await await_for(lambda: [p.get("registry_ref") for p in server.attempt(aid).save_points or []]
                        == [pushed.registry_ref], what="the pushed save point's reference kept on the attempt")

        b = SimRunner(server.ws_url, b_token, name="b", images=["linux-tiny"])
        b.hello.restores = True
        b.hello.registry = "127.0.0.1:5000/gh"
        await b.connect()  # connected before a is lost: nothing for it yet
        try:
            machine = RestoredMachine(b, pushed)
            await a.close()  # a is lost and does not come back
            again: protocol.Lease = await b.expect("lease", timeout=60)
            assert again.attempt_id == aid and again.restore is not None and again.restore.save_point == pushed
            assert again.restore.kept == [pushed]  # only the one it pulls goes along
            assert (again.start_state.kind, again.start_state.start_state_id) == ("state", pushed.save_point_id)
            row = server.attempt(aid)
            assert (row.status, row.runner_id, (row.metrics or {}).get("resumed")) == ("running", b_id, 1)
            await b.send(protocol.LeaseAccept(attempt_id=aid))
            await b.status(aid, "preparing")
            await b.status(aid, "running", "task")
            try:
                end = await b.expect("task_end", timeout=60)
            except AssertionError:
                raise AssertionError(f"ops {machine.ops}") from None
            assert end.error is None and end.answer.endswith("409 machine_restored; then 200"), end
            assert machine.ops == ["exec", "screen", "exec"]
            await pass_resumed(server, b, run_id, end, pushed)
            done = server.attempt(aid)
            assert (done.outcome, done.runner_id, done.try_number) == ("passed", b_id, 1)
            assert [x.id for x in server.attempts_of(run_id)] == [aid] and a_id != b_id
        finally:
            await b.close()


async def test_a_handoff_with_no_other_runner_leaves_the_attempt_running_where_it_is(server_factory: Any) -> None:
    """`drain --migrate` with no other runner that can take the attempt: no cancel, the attempt runs on its own
    runner (whose drain then waits for it as for any attempt), and the pushed save point is kept on it."""
    server: GwServer = server_factory(runner_grace_seconds=60.0)
    _, token = server.add_runner()
    a = SimRunner(server.ws_url, token, images=["linux-tiny"])
    a.hello.restores = True
    a.hello.registry = "127.0.0.1:5000/gh"
    await a.connect()
    try:
        _, (aid,) = await in_its_task(server, a, "noop")
        point = protocol.SavePoint(save_point_id=f"ss_{aid[3:]}p1", step=4, bytes=1, created_at=datetime.now(UTC),
                                   task_seconds=3.0, registry_ref="127.0.0.1:5000/gh/states@sha256:" + "cd" * 32)
        await a.send(protocol.AttemptHandoff(attempt_id=aid, save_point=point))
        await await_for(lambda: server.attempt(aid).save_points is not None, what="the handed-off save point kept")
        await a.sync()
        assert not [m for m in a.stash if m.type == "cancel"]
        row = server.attempt(aid)
        assert row.status == "running" and not (row.metrics or {}).get("resumed")
    finally:
        await a.close()


async def test_an_attempts_listed_save_points_are_bounded(server_factory: Any) -> None:
    """A runner telling of more save points than any runner keeps (50) lists only the newest 50."""
    server: GwServer = server_factory()
    _, token = server.add_runner()
    a = SimRunner(server.ws_url, token, images=["linux-tiny"])
    await a.connect()
    try:
        _, (aid,) = await in_its_task(server, a, "noop")
        for n in range(1, 61):
            await a.send(protocol.SavePointMade(attempt_id=aid, save_point=protocol.SavePoint(
                save_point_id=f"ss_{aid[3:]}p{n}", step=n, bytes=1, created_at=datetime.now(UTC))))
        await a.sync()
        ids = [p["save_point_id"] for p in server.attempt(aid).save_points or []]
        assert len(ids) == 50 and ids[0].endswith("p11") and ids[-1].endswith("p60")
    finally:
        await a.close()
