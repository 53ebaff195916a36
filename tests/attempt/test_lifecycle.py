"""The attempt lifecycle against a provider double (a fake Machine at the Provider boundary)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping

import pytest
import structlog

from gh_runner import attempt as attempt_mod
from gh_runner.attempt import Attempt
from gh_runner.config import Timeouts
from gh_wire.input import KeyEvent, TypeEvent
from gh_wire.protocol import Checkpoint, MachineRefusal, MachineRequest, TaskEnd
from gh_wire.vocab import ErrorCause
from providers.base import ScriptResult

from .fakes import WAIT, FakeLink, FakeMachine, FakeProvider, is_mosaic, make_lease, ok

FAST = Timeouts(machine=5, ready=5, setup=5, check=5, task_grace=0.3, screen=5, teardown=5)


def exec_req(script: str, rid: str = "r1", **kw: object) -> MachineRequest:
    return MachineRequest(request_id=rid, attempt_id="at_test1", op="exec", script=script, **kw)  # type: ignore[arg-type]


async def start(attempt: Attempt) -> asyncio.Task:
    return asyncio.create_task(attempt.run())


async def finish(task: asyncio.Task):
    return await asyncio.wait_for(task, WAIT)


async def test_passing_attempt_full_sequence(provider: FakeProvider, link: FakeLink) -> None:
    a = Attempt(make_lease(), provider, link, FAST)
    run = await start(a)
    await link.reached("task")
    resp = await a.handle_request(exec_req("fix"))
    assert resp.ok and resp.exit_code == 0 and resp.stdout == "fixed\n"
    a.task_end(TaskEnd(attempt_id="at_test1", answer="done", steps=7, questions=2, approvals=1))
    result = await finish(run)

    assert result.outcome == "passed", result.error
    assert result.error is None and result.error_phase is None
    assert link.statuses == [
        ("preparing", "machine"), ("preparing", "ready"), ("preparing", "setup"),
        ("checking", "check_before"), ("running", "task"), ("checking", "check_after"), ("done", "done"),
    ]
    assert link.labels()[0] == "first" and link.labels()[-1] == "last"
    assert result.check_before is not None and result.check_before.verdict == "False"
    assert result.check_after is not None and result.check_after.verdict == "True"
    assert result.check_after.stdout_tail == "checking...\nTrue"
    assert result.answer == "done" and not result.check_absent and not result.task_limit_reached
    m = result.metrics
    assert (m.steps, m.questions, m.approvals) == (7, 2, 1)
    assert set(m.phase_seconds) == {"machine", "ready", "setup", "check_before", "first_screen", "task",
                                    "check_after", "last_screen", "teardown"}
    assert m.active_seconds == m.phase_seconds["task"] or abs(m.active_seconds - m.phase_seconds["task"]) < 0.05
    machine = provider.machines[0]
    assert machine.machine_id == a.machine_id == "at_test1"
    assert machine.destroyed == 1
    envs = [env for script, env in machine.scripts_run if script == "check"]
    answer_file = "/tmp/gh-answer-1"
    assert envs == [{"GH_CHECK_PHASE": "before", "GH_AGENT_ANSWER": "", "GH_AGENT_ANSWER_FILE": answer_file},
                    {"GH_CHECK_PHASE": "after", "GH_AGENT_ANSWER": "done", "GH_AGENT_ANSWER_FILE": answer_file}]
    assert machine.files[answer_file] == "done"  # the check's copy of the answer, written by the preamble
    assert result.started_at is not None and result.finished_at is not None
    assert result.started_at <= result.finished_at


async def test_failing_attempt_and_answer_reaches_the_check(provider: FakeProvider, link: FakeLink) -> None:
    a = Attempt(make_lease(), provider, link, FAST)
    run = await start(a)
    a.task_end(TaskEnd(attempt_id="at_test1", answer="41"))  # early: before the task phase even starts
    result = await finish(run)
    assert result.outcome == "failed" and result.error is None
    assert result.check_after is not None and result.check_after.verdict == "False"

    a2 = Attempt(make_lease(), provider, FakeLink(), FAST)
    run2 = await start(a2)
    a2.task_end(TaskEnd(attempt_id="at_test1", answer="42"))
    assert (await finish(run2)).outcome == "passed"


async def test_state_start_source(provider: FakeProvider, link: FakeLink) -> None:
    a = Attempt(make_lease(kind="state"), provider, link, FAST)
    a.task_end(TaskEnd(attempt_id="at_test1"))
    await finish(await start(a))
    src = provider.sources[0]
    assert (src.image, src.start_state_id, src.version) == ("linux-tiny", "ss_x", 3)


async def test_setup_fails(provider: FakeProvider, link: FakeLink) -> None:
    provider.scripts["break"] = lambda m, env, t: ok(stdout="step 1\n", stderr="rm: cannot remove '/x'\n", code=2)
    result = await finish(await start(Attempt(make_lease(), provider, link, FAST)))
    assert result.outcome == "error" and result.error_phase == "setup"
    assert result.error_cause == ErrorCause.CASE  # the author's setup failed, not the platform
    assert result.error is not None
    assert "exited with code 2" in result.error and "cannot remove '/x'" in result.error and "step 1" in result.error
    assert [s for s, _ in provider.machines[0].scripts_run] == ["break"]  # no check after a broken setup
    assert provider.machines[0].destroyed == 1
    assert ("running", "task") not in link.statuses and link.statuses[-1] == ("done", "done")
    assert link.labels() == ["last"]  # the screen at the failure, for the operator


async def test_setup_times_out_in_the_guest(provider: FakeProvider, link: FakeLink) -> None:
    provider.scripts["break"] = lambda m, env, t: ScriptResult(None, "half\n", "", timed_out=True)
    result = await finish(await start(Attempt(make_lease(script_timeout=42), provider, link, FAST)))
    assert result.outcome == "error" and result.error_phase == "setup"
    assert result.error_cause == ErrorCause.INFRASTRUCTURE  # it could not finish: never blamed on the author
    # The lease's script_timeout is tighter than the runner's own: it is the one applied and named.
    assert result.error is not None and "did not finish within 5 s" in result.error and "half" in result.error


async def test_setup_hangs_when_the_guest_stops_answering(provider: FakeProvider, link: FakeLink,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attempt_mod, "SCRIPT_SLACK", 0.2)
    gate = asyncio.Event()

    async def hang(m: FakeMachine, env: Mapping[str, str], t: float) -> ScriptResult:
        await gate.wait()  # never set: a provider that does not honour its own timeout
        return ok()

    provider.scripts["break"] = hang
    t = Timeouts(machine=5, ready=5, setup=0.3, check=5, task_grace=0.3, screen=5, teardown=5)
    result = await finish(await start(Attempt(make_lease(), provider, link, t)))
    assert result.outcome == "error" and result.error_phase == "setup"
    assert result.error is not None and "stopped answering" in result.error and "0.3 s" in result.error
    assert provider.machines[0].destroyed == 1


@pytest.mark.parametrize(
    ("stdout", "code", "phrase"),
    [("True\n", 0, "printed True before the task"),
     ("hello\n", 0, "'hello'"),
     ("", 0, "printed nothing"),
     ("False\n", 1, "exited with code 1")],
    ids=["prints True", "garbage", "empty", "crash"],
)
async def test_check_before_must_print_false(provider: FakeProvider, link: FakeLink, stdout: str, code: int,
                                             phrase: str) -> None:
    provider.scripts["check"] = lambda m, env, t: ok(stdout=stdout, code=code)
    result = await finish(await start(Attempt(make_lease(), provider, link, FAST)))
    assert result.outcome == "error" and result.error_phase == "check_before"
    assert result.error_cause == ErrorCause.CASE
    assert result.error is not None and phrase in result.error
    assert result.check_before is not None and result.check_before.exit_code == code
    assert result.check_after is None
    assert ("running", "task") not in link.statuses
    assert provider.machines[0].destroyed == 1


async def test_check_after_garbage_is_error(provider: FakeProvider, link: FakeLink) -> None:
    def check(m: FakeMachine, env: Mapping[str, str], t: float) -> ScriptResult:
        return ok(stdout="False\n" if env["GH_CHECK_PHASE"] == "before" else "true\n")

    provider.scripts["check"] = check
    a = Attempt(make_lease(), provider, link, FAST)
    a.task_end(TaskEnd(attempt_id="at_test1"))
    result = await finish(await start(a))
    assert result.outcome == "error" and result.error_phase == "check_after"
    assert result.error_cause == ErrorCause.CASE
    assert result.error is not None and "'true'" in result.error
    assert result.check_after is not None and result.check_after.verdict is None


async def test_task_limit_reached_is_still_checked(provider: FakeProvider, link: FakeLink) -> None:
    # limits.minutes=1 scaled to 2 s by the test hook; the agent fixes the machine and never says so.
    a = Attempt(make_lease(minutes=1), provider, link, FAST, seconds_per_minute=2.0)
    run = await start(a)
    await link.reached("task")
    assert (await a.handle_request(exec_req("fix"))).ok
    result = await finish(run)
    assert result.task_limit_reached
    assert result.outcome == "passed"  # checked after the limit: the machine was fixed anyway
    assert result.check_after is not None and result.check_after.verdict == "True"
    assert result.answer is None
    assert 1.9 <= result.metrics.active_seconds < WAIT
    # After the limit the machine is no longer the agent's.
    late = await a.handle_request(exec_req("fix", "r2"))
    assert not late.ok and late.error is not None


async def test_task_end_during_grace_gives_the_answer(provider: FakeProvider, link: FakeLink) -> None:
    t = Timeouts(machine=5, ready=5, setup=5, check=5, task_grace=WAIT, screen=5, teardown=5)
    a = Attempt(make_lease(minutes=1), provider, link, t, seconds_per_minute=0.2)
    run = await start(a)
    await link.reached("task")
    refused = None
    deadline = asyncio.get_running_loop().time() + WAIT
    while asyncio.get_running_loop().time() < deadline:  # poll until the limit closes the machine to the agent
        refused = await a.handle_request(exec_req("fix"))
        if not refused.ok:
            break
        await asyncio.sleep(0.02)
    assert refused is not None and not refused.ok and "limit of 1 minute" in (refused.error or "")
    a.task_end(TaskEnd(attempt_id="at_test1", answer="42", steps=3))
    result = await finish(run)
    assert result.task_limit_reached and result.answer == "42" and result.metrics.steps == 3
    assert result.outcome == "passed"


async def test_cancel_mid_task(provider: FakeProvider, link: FakeLink) -> None:
    started = asyncio.Event()

    async def slow(m: FakeMachine, env: Mapping[str, str], t: float) -> ScriptResult:
        started.set()
        await asyncio.Event().wait()  # runs until cancelled
        return ok()

    provider.scripts["slow"] = slow
    a = Attempt(make_lease(), provider, link, FAST)
    run = await start(a)
    await link.reached("task")
    pending = asyncio.create_task(a.handle_request(exec_req("slow")))
    await asyncio.wait_for(started.wait(), WAIT)
    a.cancel("run cancelled by the user")
    result = await finish(run)
    assert result.outcome == "error" and result.error == "cancelled: run cancelled by the user"
    assert result.error_phase == "task"
    resp = await asyncio.wait_for(pending, WAIT)
    assert not resp.ok and "cancelled" in (resp.error or "")
    assert provider.machines[0].destroyed == 1
    assert [s for s, _ in provider.machines[0].scripts_run].count("check") == 1  # no check after
    assert "checking" not in [s for s, p in link.statuses if p == "check_after"]
    a.cancel("again")  # after the end: no effect, no error


async def test_cancel_while_the_machine_is_being_made(provider: FakeProvider, link: FakeLink) -> None:
    provider.create_gate = asyncio.Event()
    a = Attempt(make_lease(), provider, link, FAST)
    run = await start(a)
    await asyncio.wait_for(provider.creating.wait(), WAIT)
    a.cancel("shutdown")
    await asyncio.sleep(0)  # let the cancel land while creation is still blocked
    provider.create_gate.set()  # creation completes after the cancel: the machine must still go
    result = await finish(run)
    assert result.outcome == "error" and result.error == "cancelled: shutdown" and result.error_phase == "machine"
    assert len(provider.machines) == 1 and provider.machines[0].destroyed == 1


async def test_cancel_before_run(provider: FakeProvider, link: FakeLink) -> None:
    a = Attempt(make_lease(), provider, link, FAST)
    a.cancel("server said so")
    result = await finish(await start(a))
    assert result.outcome == "error" and result.error == "cancelled: server said so"
    assert provider.machines == []


async def test_outer_cancellation_propagates_and_destroys(provider: FakeProvider, link: FakeLink) -> None:
    a = Attempt(make_lease(), provider, link, FAST)
    run = await start(a)
    await link.reached("task")
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(run, WAIT)
    assert provider.machines[0].destroyed == 1


async def test_machine_that_never_gets_ready(provider: FakeProvider, link: FakeLink) -> None:
    provider.never_ready = True
    t = Timeouts(machine=5, ready=0.2, setup=5, check=5, task_grace=0.3, screen=5, teardown=5)
    result = await finish(await start(Attempt(make_lease(), provider, link, t)))
    assert result.outcome == "error" and result.error_phase == "ready"
    assert result.error is not None and "guest channel never came up" in result.error and "0.2 s" in result.error
    assert provider.machines[0].destroyed == 1
    assert provider.machines[0].scripts_run == []


async def test_machine_that_cannot_be_made(provider: FakeProvider, link: FakeLink) -> None:
    provider.create_error = "image linux-tiny not found in /var/tmp/images"
    result = await finish(await start(Attempt(make_lease(), provider, link, FAST)))
    assert result.outcome == "error" and result.error_phase == "machine"
    assert result.error_cause == ErrorCause.INFRASTRUCTURE
    assert result.error == "machine: could not make the machine: image linux-tiny not found in /var/tmp/images"
    assert link.statuses[-1] == ("done", "done")


@pytest.mark.parametrize("where", ["setup", "check_before", "task", "check_after", "passed"])
async def test_destroy_always_called_even_when_it_fails(provider: FakeProvider, link: FakeLink, where: str) -> None:
    provider.destroy_error = True
    if where == "setup":
        provider.scripts["break"] = lambda m, env, t: ok(code=1)
    if where == "check_before":
        provider.scripts["check"] = lambda m, env, t: ok("True")
    if where == "check_after":
        provider.scripts["check"] = lambda m, env, t: ok("False" if env["GH_CHECK_PHASE"] == "before" else "?")
    a = Attempt(make_lease(), provider, link, FAST)
    a.task_end(TaskEnd(attempt_id="at_test1", answer="42", error="model API down" if where == "task" else None))
    result = await finish(await start(a))
    assert result.outcome == ("passed" if where == "passed" else "error")
    if where != "passed":
        assert result.error_phase == where
    if where == "task":
        assert "model API down" in (result.error or "")
    assert provider.machines[0].destroyed == 1


async def test_requests_refused_outside_the_task(provider: FakeProvider, link: FakeLink) -> None:
    in_setup = asyncio.Event()
    release = asyncio.Event()

    async def brk(m: FakeMachine, env: Mapping[str, str], t: float) -> ScriptResult:
        in_setup.set()
        await release.wait()
        return ok()

    provider.scripts["break"] = brk
    a = Attempt(make_lease(), provider, link, FAST)
    before = await a.handle_request(exec_req("fix", "r0"))
    assert not before.ok and before.request_id == "r0" and "not task" in (before.error or "")
    run = await start(a)
    await asyncio.wait_for(in_setup.wait(), WAIT)
    for op in ("screen", "exec", "input"):
        r = await a.handle_request(MachineRequest(request_id="r1", op=op, script="fix",  # type: ignore[arg-type]
                                                  events=[KeyEvent(keys=["ENTER"])]))
        assert not r.ok and r.error == "attempt is in phase setup, not task"
    assert provider.machines[0].files.get("/root/fixed") is None
    release.set()
    await link.reached("task")
    screen = await a.handle_request(MachineRequest(request_id="r2", op="screen"))
    assert screen.ok and base64.b64decode(screen.png_b64 or "").startswith(b"\x89PNG")
    a.task_end(TaskEnd(attempt_id="at_test1"))
    result = await finish(run)
    assert result.outcome == "failed"
    after = await a.handle_request(exec_req("fix", "r3"))
    assert not after.ok and after.error is not None and "task" in after.error
    assert provider.machines[0].files.get("/root/fixed") is None


async def test_bad_requests_get_reasons(provider: FakeProvider, link: FakeLink) -> None:
    a = Attempt(make_lease(), provider, link, FAST)
    run = await start(a)
    await link.reached("task")
    r = await a.handle_request(MachineRequest(request_id="a", op="exec"))
    assert not r.ok and r.error == "an exec request needs a script"
    r = await a.handle_request(MachineRequest(request_id="b", op="input"))
    assert not r.ok and r.error == "an input request needs at least one event"
    r = await a.handle_request(exec_req("no-such-script"))
    assert r.ok and r.exit_code == 127  # a failing script is an answer, not a refusal
    provider.screen_error = True
    r = await a.handle_request(MachineRequest(request_id="c", op="screen"))
    assert not r.ok and r.error == "screendump failed"
    provider.screen_error = False
    a.task_end(TaskEnd(attempt_id="at_test1"))
    assert (await finish(run)).outcome == "failed"


async def test_input_frames_and_redaction(provider: FakeProvider, link: FakeLink) -> None:
    secret = "hunter2-Pa55"
    a = Attempt(make_lease(), provider, link, FAST)
    run = await start(a)
    await link.reached("task")
    with structlog.testing.capture_logs() as logs:
        r = await a.handle_request(MachineRequest(
            request_id="i1", op="input", redact=[secret, ""],
            events=[TypeEvent(text="admin"), KeyEvent(keys=["TAB"]), TypeEvent(text=secret),
                    TypeEvent(text=f"pw={secret}!"), KeyEvent(keys=["ENTER"])]))
        assert r.ok, r.error
        # An event the provider cannot deliver: its message would quote the text; for a secret it must not.
        bad = await a.handle_request(MachineRequest(request_id="i2", op="input", redact=[f"{secret}\u2603"],
                                                    events=[KeyEvent(keys=["A"]), TypeEvent(text=f"{secret}\u2603")]))
        plain = await a.handle_request(MachineRequest(request_id="i3", op="input",
                                                      events=[TypeEvent(text="snow\u2603")]))
        a.task_end(TaskEnd(attempt_id="at_test1"))
        result = await finish(run)
    assert result.outcome == "failed"
    assert not bad.ok and bad.error == "input event 2 of 2 (type) could not be delivered; events 1-1 were delivered"
    assert not plain.ok and "not in keymap" in (plain.error or "")  # not a secret: the detail helps
    inputs = [f for f in link.frames if f[0] == "input"]
    assert [f[2] for f in inputs] == [
        {"type": "type", "text": "admin"}, {"type": "key", "keys": ["TAB"]},
        {"type": "type", "text": "•••", "masked": True},  # the first masked frame says so (watchers see frames)
        {"type": "type", "text": "•••"}, {"type": "key", "keys": ["ENTER"]}, {"type": "key", "keys": ["A"]},
    ]
    # Each input frame shows the screen after its event (the fake's screen changes with every event).
    assert len({f[1] for f in inputs}) == len(inputs)
    # From the first secret on, a frame shows the screen only as a mosaic: a guest may echo what was typed.
    assert [is_mosaic(f[1]) for f in inputs] == [False, False, True, True, True, True]
    assert is_mosaic(next(f[1] for f in link.frames if f[0] == "last"))
    # The secret reached the machine, and nowhere else.
    assert [e.text for e in provider.machines[0].inputs if e.type == "type"][1] == secret
    assert secret not in repr(link.frames) and secret not in repr(logs) and secret not in repr(result)


async def test_every_request_of_the_task_leaves_a_frame(provider: FakeProvider, link: FakeLink) -> None:
    """The screen an agent saw, each exec (script, exit code, output tail) and what the agent
    meant by a request (its note) are in the replay, secrets redacted; an undeliverable event is a typed
    refusal (the request's fault, not the machine's)."""
    secret = "hunter2-Pa55"
    provider.scripts["echo " + secret] = lambda *_a: ok(f"{secret}\n" + "x" * 3000, code=3)
    a = Attempt(make_lease(), provider, link, FAST)
    run = await start(a)
    await link.reached("task")
    note = {"agent": "model", "step": 1, "text": f"I will type {secret}"}
    seen = await a.handle_request(MachineRequest(request_id="s1", attempt_id="at_test1", op="screen",
                                                 note={"step": 1, "seen_by_model": True}))
    ran = await a.handle_request(exec_req("echo " + secret, "e1", redact=[secret], note=note))
    typed = await a.handle_request(MachineRequest(request_id="i1", attempt_id="at_test1", op="input", redact=[secret],
                                                  note=note, events=[KeyEvent(keys=["A"]), KeyEvent(keys=["B"])]))
    bad = await a.handle_request(MachineRequest(request_id="i2", attempt_id="at_test1", op="input",
                                                events=[TypeEvent(text="snow\u2603")]))
    a.task_end(TaskEnd(attempt_id="at_test1"))
    await finish(run)
    assert seen.ok and ran.ok and ran.exit_code == 3 and typed.ok
    assert not bad.ok and bad.refusal == MachineRefusal.INPUT_NOT_SUPPORTED
    frames = {label: event for label, _png, event in link.frames if label in ("screen", "exec")}
    assert frames["screen"] == {"type": "screen", "note": {"step": 1, "seen_by_model": True}}
    ex = frames["exec"]
    assert ex["type"] == "exec" and ex["exit_code"] == 3 and ex["script"] == "echo •••" and not ex["timed_out"]
    assert ex["stdout_tail"] == "x" * 1000 and ex["note"]["text"] == "I will type •••"
    inputs = [event for label, _png, event in link.frames if label == "input"]
    assert inputs[0]["note"]["step"] == 1 and "note" not in inputs[1]
    assert secret not in repr(link.frames)


async def test_frames_are_best_effort(provider: FakeProvider, link: FakeLink) -> None:
    link.frame_error = True
    provider.screen_error = True
    a = Attempt(make_lease(), provider, link, FAST)
    run = await start(a)
    await link.reached("task")
    provider.screen_error = False
    r = await a.handle_request(MachineRequest(request_id="i", op="input", events=[KeyEvent(keys=["ENTER"])]))
    assert r.ok
    a.task_end(TaskEnd(attempt_id="at_test1", answer="42"))
    result = await finish(run)
    assert result.outcome == "passed" and link.frames == []


async def test_change_frames_at_most_one_per_interval(provider: FakeProvider, link: FakeLink,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from .fakes import png

    monkeypatch.setattr(attempt_mod, "WATCH_INTERVAL", 0.1)
    a = Attempt(make_lease(), provider, link, FAST)
    run = await start(a)
    await link.reached("frame:first")
    await link.reached("task")
    await asyncio.sleep(0.35)  # the screen is still: several polls, no change frames
    assert "change" not in link.labels()
    provider.machines[0].screen = png(box=(0, 0, 100, 100))  # something opened
    await link.reached("frame:change")
    n = link.labels().count("change")
    provider.machines[0].screen = png(box=(0, 0, 100, 100), color=(0, 0, 1))  # invisible difference
    await asyncio.sleep(0.35)
    assert link.labels().count("change") == n == 1
    a.task_end(TaskEnd(attempt_id="at_test1"))
    await finish(run)


async def test_rubric_only_case(provider: FakeProvider, link: FakeLink) -> None:
    a = Attempt(make_lease(check=None), provider, link, FAST)
    a.task_end(TaskEnd(attempt_id="at_test1", answer="I refused"))
    result = await finish(await start(a))
    assert result.outcome == "passed" and result.check_absent
    assert result.check_before is None and result.check_after is None
    assert result.answer == "I refused"
    assert [s for s, _ in provider.machines[0].scripts_run] == ["break"]
    assert ("checking", "check_before") not in link.statuses


async def test_no_setup_script(provider: FakeProvider, link: FakeLink) -> None:
    a = Attempt(make_lease(setup=None), provider, link, FAST)
    a.task_end(TaskEnd(attempt_id="at_test1"))
    result = await finish(await start(a))
    assert result.outcome == "failed" and "setup" not in result.metrics.phase_seconds


async def test_cancel_after_the_work_is_done_keeps_the_result(provider: FakeProvider, link: FakeLink) -> None:
    destroying = asyncio.Event()
    release = asyncio.Event()
    a = Attempt(make_lease(), provider, link, FAST)

    async def slow_destroy() -> None:
        destroying.set()
        await release.wait()

    a.task_end(TaskEnd(attempt_id="at_test1", answer="42"))
    run = await start(a)
    await link.reached("check_after")
    machine = provider.machines[0]
    machine.destroy = slow_destroy  # type: ignore[method-assign]
    await asyncio.wait_for(destroying.wait(), WAIT)
    a.cancel("too late")  # the verdict is in; only teardown is left
    release.set()
    result = await finish(run)
    assert result.outcome == "passed" and result.error is None


async def test_machine_made_after_teardown_gave_up_is_still_destroyed(provider: FakeProvider,
                                                                       link: FakeLink) -> None:
    provider.create_gate = asyncio.Event()
    t = Timeouts(machine=5, ready=5, setup=5, check=5, task_grace=0.3, screen=5, teardown=0.2)
    a = Attempt(make_lease(), provider, link, t)
    run = await start(a)
    await asyncio.wait_for(provider.creating.wait(), WAIT)
    a.cancel("shutdown")
    result = await finish(run)  # teardown stops waiting for the slow creation after 0.2 s
    assert result.error == "cancelled: shutdown" and provider.machines == []
    provider.create_gate.set()  # the machine appears after everyone stopped waiting: it must still go
    await asyncio.wait_for(provider.destroyed.wait(), WAIT)
    assert provider.machines[0].destroyed == 1


async def test_task_ends_even_when_a_screenshot_swallows_the_watchers_cancel(
    provider: FakeProvider, link: FakeLink, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On Python 3.11, asyncio.wait_for around a call that completes as the cancel lands returns the
    # result and loses the cancel. Simulate that in the screenshot the replay watcher takes: the
    # attempt must still leave its task phase and finish.
    swallowed = asyncio.Event()

    async def screenshot_losing_cancels(self: FakeMachine) -> bytes:
        try:
            # Long against the watcher's interval, so the task's end lands inside a screenshot (~99.8%).
            await asyncio.sleep(0.5)
        except asyncio.CancelledError:
            swallowed.set()
        return self.screen

    monkeypatch.setattr(FakeMachine, "screenshot", screenshot_losing_cancels)
    monkeypatch.setattr(attempt_mod, "WATCH_INTERVAL", 0.001)
    a = Attempt(make_lease(), provider, link, FAST)
    run = await start(a)
    await link.reached("task")
    await asyncio.sleep(0.1)  # let the watcher loop a few times (not synchronisation: any moment works)
    a.task_end(TaskEnd(attempt_id="at_test1", answer="done"))
    result = await finish(run)
    assert swallowed.is_set()  # the race really happened
    assert result.outcome == "failed" and result.error is None  # nothing fixed the machine: checked, not hung
    assert provider.machines[0].destroyed == 1


async def test_checkpoints_score_their_weighted_mean(provider: FakeProvider, link: FakeLink) -> None:
    """Each checkpoint's script runs before and after the task; the try scores their weighted mean and
    passes only when every checkpoint scores 1 (gh_runner/attempt.py, _check_after_scored)."""
    provider.scripts["cp_half"] = lambda m, env, t: ok(stdout="0.5\n" if "/root/fixed" in m.files else "0\n")
    provider.scripts["cp_some"] = lambda m, env, t: ok(stdout="True\n" if "/root/fixed" in m.files else ".25\n")
    lease = make_lease()
    lease.case.checkpoints = [Checkpoint(name="check", check_script="check"),
                              Checkpoint(name="half", check_script="cp_half", weight=2),
                              Checkpoint(name="some", check_script="cp_some")]
    a = Attempt(lease, provider, link, FAST)
    run = await start(a)
    await link.reached("task")
    assert (await a.handle_request(exec_req("fix"))).ok
    a.task_end(TaskEnd(attempt_id="at_test1", answer="done"))
    result = await finish(run)
    assert result.outcome == "failed" and result.error is None
    assert [(c.name, c.weight, c.score, c.before_score) for c in result.checkpoints or []] == [
        ("check", 1.0, 1.0, 0.0), ("half", 2.0, 0.5, 0.0), ("some", 1.0, 1.0, 0.25)]
    assert result.check_after is not None and result.check_after.score == pytest.approx(0.75)
    assert result.check_after.verdict == "False"
    assert result.check_before is not None and result.check_before.score == pytest.approx(0.0625)
    assert result.check_after.stdout_tail == "check: True\nhalf: 0.5\nsome: True"
    ran = [s for s, _ in provider.machines[0].scripts_run if s.startswith(("check", "cp_"))]
    assert ran == ["check", "cp_half", "cp_some"] * 2


async def test_a_checkpoint_that_prints_garbage_is_the_cases_error(provider: FakeProvider, link: FakeLink) -> None:
    provider.scripts["cp_bad"] = lambda m, env, t: ok(stdout="0,5\n" if "/root/fixed" in m.files else "0\n")
    lease = make_lease()
    lease.case.checkpoints = [Checkpoint(name="check", check_script="check"),
                              Checkpoint(name="bad", check_script="cp_bad")]
    a = Attempt(lease, provider, link, FAST)
    run = await start(a)
    await link.reached("task")
    assert (await a.handle_request(exec_req("fix"))).ok
    a.task_end(TaskEnd(attempt_id="at_test1", answer="done"))
    result = await finish(run)
    assert result.outcome == "error" and result.error_phase == "check_after"
    assert result.error_cause == ErrorCause.CASE and result.checkpoints is None
    assert result.error is not None and "checkpoint 'bad'" in result.error and "'0,5'" in result.error


async def test_a_fractional_check_scores_and_fails(provider: FakeProvider, link: FakeLink) -> None:
    provider.scripts["check"] = lambda m, env, t: ok(stdout="0.957\n" if "/root/fixed" in m.files else "0.1\n")
    a = Attempt(make_lease(), provider, link, FAST)
    run = await start(a)
    await link.reached("task")
    assert (await a.handle_request(exec_req("fix"))).ok
    a.task_end(TaskEnd(attempt_id="at_test1", answer="done"))
    result = await finish(run)
    assert result.outcome == "failed" and result.checkpoints is None
    assert result.check_after is not None and result.check_after.score == 0.957
    assert result.check_before is not None and result.check_before.score == 0.1
