"""Why a queued attempt waits (`queued_reason`): the rule row by row, then through the real gateway,
simulated runners and the API (attempt objects), and the once-a-minute log."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import httpx
import pytest

from gh_server import queue_wait
from gh_server.attempts.lease import needs_scores
from gh_server.attempts.matching import Candidate, RunnerCaps
from gh_wire import protocol
from gh_wire.vocab import QueueWait

from .conftest import GwServer, await_for
from .simrunner import SimRunner, now

IMAGE = {"kind": "image", "image": "linux-tiny"}


def caps(name: str, *, labels: tuple[str, ...] = (), images: tuple[str, ...] = ("linux-tiny",),
         held: tuple[tuple[str, int], ...] = (), free: int = 1) -> RunnerCaps:
    return RunnerCaps(f"rn_{name}", name, frozenset(labels), frozenset(images), frozenset(held), free)


@pytest.mark.parametrize(("runs_on", "source", "pin", "runners", "code", "says"), [
    ("vm", IMAGE, None, [], QueueWait.NO_RUNNER, "no runner is online"),
    ("vm", IMAGE, "rn_gone", [caps("lab-1")], QueueWait.PINNED_RUNNER_OFFLINE, "rn_gone"),
    ("gpu", IMAGE, None, [caps("lab-1", labels=("lab",))], QueueWait.NO_LABEL,
     "none has the label 'gpu' (their labels: lab)"),
    ("vm", {"kind": "image", "image": "linux-tinyy"}, None, [caps("lab-1")], QueueWait.NO_IMAGE,
     "none has the image 'linux-tinyy' (they have: linux-tiny)"),
    ("vm", {"kind": "state", "image": "linux-tiny", "start_state_id": "ss_1", "version": 3}, None,
     [caps("lab-1", held=(("ss_1", 2),))], QueueWait.NO_VERSION, "none holds start state ss_1 version 3"),
    ("vm", IMAGE, None, [caps("lab-1", free=0)], QueueWait.NO_FREE_SLOT, "every slot of lab-1 is busy"),
    ("vm", IMAGE, None, [caps("lab-1")], QueueWait.NEXT_PASS, "lab-1 can take it"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_explain_names_the_runners_and_what_none_of_them_has(
        runs_on: str, source: dict[str, object], pin: str | None, runners: list[RunnerCaps], code: QueueWait,
        says: str) -> None:
    r = queue_wait.explain(Candidate("at_1", runs_on, source, pin), runners)
    assert r.code == code and says in r.message, r
    if runners:
        assert "1 runner online (lab-1)" in r.message


@pytest.fixture
def server(any_db_server: GwServer) -> GwServer:
    return any_db_server


def _attempts(server: GwServer, run_id: str) -> dict[str, dict[str, object]]:
    r = httpx.get(f"{server.base_url}/v1/test_runs/{run_id}/attempts",
                  headers={"Authorization": f"Bearer {server.admin_key}"}, timeout=30)
    assert r.status_code == 200, r.text
    return {a["attempt_id"]: a for a in r.json()["data"]}


async def _heartbeats(r: SimRunner) -> None:
    # A simulated runner sends no heartbeats of its own; the gateway drops a silent one after dead_after.
    while True:
        await r.send(protocol.Heartbeat(at=now(), busy=0, slots=1))
        await asyncio.sleep(0.3)


async def test_queued_attempts_say_why_in_the_api_and_the_log(server: GwServer,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    _, token = server.add_runner("lab-1")
    r = await SimRunner(server.ws_url, token, name="lab-1", slots=1, labels=["lab"], images=["linux-tiny"]).connect()
    beat = asyncio.create_task(_heartbeats(r))
    try:
        run_id, (typo,) = server.add_run([{"start_state": "linux-tinyy"}],
                                         start_state={"kind": "image", "image": "linux-tinyy"})
        _, (gpu,) = server.add_run([{"runs_on": "gpu"}])
        _, (win,) = server.add_run([{"start_state": "win10-22h2"}],
                                   start_state={"kind": "image", "image": "win10-22h2"})
        await await_for(lambda: server.attempt(typo).status == "queued", what="the run's attempts")
        got = (await asyncio.to_thread(_attempts, server, run_id))[typo]["queued_reason"]
        assert isinstance(got, dict) and got["code"] == "no_image" and got["runners_online"] == ["lab-1"]
        assert "none has the image 'linux-tinyy' (they have: linux-tiny)" in str(got["message"])
        r2 = (await asyncio.to_thread(httpx.get, f"{server.base_url}/v1/attempts/{gpu}",
                                      headers={"Authorization": f"Bearer {server.admin_key}"}, timeout=30)).json()
        assert r2["queued_reason"]["code"] == "no_label" and "'gpu'" in r2["queued_reason"]["message"]
        assert server.attempt(win).status == "queued"
        # The log: one line per run and reason for attempts queued past the bound (here: any).
        with caplog.at_level(logging.WARNING, logger="gh_server.queue"), server.session() as s:
            n = queue_wait.log_waiting(s, older_than_s=0, window_s=60)
        assert n == 3
        lines = [m for m in caplog.messages if "queued over" in m]
        assert len(lines) == 3 and any("no_image" in m and "linux-tinyy" in m for m in lines), lines
    finally:
        beat.cancel()
        await r.close()
    # No runner online any more: it says that, not a stale list.
    await await_for(lambda: _attempts(server, run_id)[typo]["queued_reason"]["code"] == "no_runner",  # type: ignore[index]
                    timeout=120, what="the runner to count as offline")


async def test_queue_timeout_ends_attempts_that_waited_too_long_with_the_reason(server: GwServer) -> None:
    _, token = server.add_runner("lab-1")
    r = await SimRunner(server.ws_url, token, name="lab-1", slots=1, images=["linux-tiny"]).connect()
    beat = asyncio.create_task(_heartbeats(r))
    http = httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {server.admin_key}"}, timeout=30)
    try:
        case = {"key": "QT-1", "name": "n", "prompt": "p", "start_state": "win10-22h2",
                "success": {"check_script": "echo False"}, "allow_unknown_image": True}
        made = await asyncio.to_thread(http.post, "/v1/test_cases", json=case)
        assert made.status_code == 200, made.text
        run = (await asyncio.to_thread(http.post, "/v1/test_runs", json={
            "test_case_ids": ["QT-1"], "agents": ["noop"], "queue_timeout": 1})).json()
        assert run["queue_timeout"] == 1
        rid = run["test_run_id"]
        await await_for(lambda: http.get(f"/v1/test_runs/{rid}").json()["status"] == "completed",
                        timeout=60, what="the run to end by its queue timeout")
        (a,) = (await asyncio.to_thread(http.get, f"/v1/test_runs/{rid}/attempts")).json()["data"]
        assert a["outcome"] == "error" and a["error_cause"] == "infrastructure" and a["retry_of"] is None
        assert a["error"].startswith("queued longer than the run's queue_timeout (1 s): 1 runner online (lab-1); "
                                     "none has the image 'win10-22h2'"), a["error"]
    finally:
        beat.cancel()
        await asyncio.to_thread(http.close)
        await r.close()


def test_a_scored_case_waits_for_a_runner_that_reads_scores() -> None:
    """A runner from before scores reads a check's `0.5` as the case's error: the matching rule keeps
    a case that may score between 0 and 1 from it, and the reason names it (not `next_pass`)."""
    old, new = caps("lab-1"), replace(caps("lab-2"), scores=True)
    scored = Candidate("at_1", "vm", IMAGE, None, scored=True)
    r = queue_wait.explain(scored, [old])
    assert r.code == QueueWait.NO_SCORES and "lab-1 runs a gh-runner from before scores" in r.message, r
    assert queue_wait.explain(Candidate("at_1", "vm", IMAGE, None), [old]).code == QueueWait.NEXT_PASS
    assert queue_wait.explain(scored, [old, new]).code == QueueWait.NEXT_PASS
    # The image is still told first: an old runner without it is `no_image`, not `no_scores`.
    r = queue_wait.explain(replace(scored, start_state={"kind": "image", "image": "win10"}), [old])
    assert r.code == QueueWait.NO_IMAGE, r


@pytest.mark.parametrize(("case", "scored"), [
    ({"success": {"check_script": "echo True"}}, False),
    ({"success": {"check_script": "echo True", "checkpoints": []}}, False),
    ({"success": {"check_script": None, "checkpoints": [{"name": "a", "check_script": "echo 1"}]}}, True),
    ({"success": {"check_script": "python3 -m gh_osworld spec.json"}, "metadata": {"benchmark": "osworld"}}, True),
    ({"success": {"check_script": "echo True"}, "metadata": {"benchmark": "other"}}, False),
])
def test_which_cases_need_a_runner_that_reads_scores(case: dict[str, object], scored: bool) -> None:
    assert needs_scores(case) is scored


async def test_an_older_runner_is_offered_no_scored_case_and_the_api_says_why(server: GwServer) -> None:
    """Through the real gateway: a simulated runner with the hello of a runner from before scores (no
    `scores`) is leased the plain case, while the checkpoints case and the OSWorld import wait as
    `no_scores`; a runner of this version then takes them."""
    _, old_token = server.add_runner("old-1")
    old = await SimRunner(server.ws_url, old_token, name="old-1", slots=4, images=["linux-tiny"],
                          scores=False).connect()
    new: SimRunner | None = None
    try:
        assert server.runner_row(old.welcome.runner_id).scores is False  # type: ignore[union-attr]
        run_id, (plain, checkpoints, imported) = server.add_run([
            {},
            {"success": {"check_script": "echo True", "rubric": None,
                         "checkpoints": [{"name": "half", "check_script": "echo 0.5", "weight": 1.0}]}},
            {"metadata": {"benchmark": "osworld", "osworld_id": "4f07fbe9"}},
        ])
        lease = await old.expect("lease", timeout=60)
        assert lease.attempt_id == plain
        got = await asyncio.to_thread(_attempts, server, run_id)
        for aid in (checkpoints, imported):
            reason = got[aid]["queued_reason"]
            assert isinstance(reason, dict) and reason["code"] == "no_scores", reason
            assert "old-1 runs a gh-runner from before scores" in str(reason["message"]), reason
        server.wake()
        with pytest.raises(AssertionError, match="no lease within"):
            await old.expect("lease", timeout=2)
        assert {server.attempt(a).status for a in (checkpoints, imported)} == {"queued"}
        _, new_token = server.add_runner("new-1")
        new = await SimRunner(server.ws_url, new_token, name="new-1", slots=4, images=["linux-tiny"]).connect()
        assert server.runner_row(new.welcome.runner_id).scores is True  # type: ignore[union-attr]
        server.wake()
        leased = {(await new.expect("lease", timeout=60)).attempt_id for _ in range(2)}
        assert leased == {checkpoints, imported}
    finally:
        await old.close()
        if new is not None:
            await new.close()
