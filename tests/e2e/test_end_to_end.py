"""The whole system through the official SDK: the quick start of the Evals API docs on this host.

One scenario, shared by the tests below (it is the expensive part: real gh-server, real gh-runner,
real linux-tiny guests under TCG). It registers a runner, starts `gh-runner` with its token,
batch-creates the example cases plus three special ones, and starts three runs:

- the example set against `noop` and `reference`, 2 tries each;
- a case whose setup does not break the machine and one whose check prints garbage, against `noop`;
- a case whose agent (tests/e2e/agents/slow_fixer.py) fixes the machine and then works on far past
  `limits.minutes`.

While the example run is going, `gh-runner` is killed with SIGKILL and started again on the same
state directory: every run must still complete with the right outcomes, and nothing may be left in
libvirt or on disk. The tests then read results, attempts and replays as an eval author would.
"""

from __future__ import annotations

import secrets
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from agentfiles import agent_command
from guidinghand import Eager
from kit.libvirt import domains
from kit.scratch import traversable_tmpdir
from PIL import Image
from replaypage import replay_data

from . import chromium
from .procs import Runner, Server, tear_down

pytestmark = pytest.mark.timeout(1800)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "linux-basics.yaml"
SLOW_AGENT = Path(__file__).parent / "agents" / "slow_fixer.py"
RUN_DEADLINE = 1200.0  # the three runs together take 5-7 min on 2 TCG slots, a runner restart included

NOBREAK: dict[str, Any] = {
    "key": "E2E-NOBREAK", "name": "Setup forgets to break anything", "prompt": "Nothing is wrong, I think.",
    "start_state": "linux-tiny", "setup_script": "true",
    "success": {"check_script": "echo True"}, "limits": {"minutes": 1}, "tags": ["e2e"], "category": "Broken cases",
}
GARBAGE: dict[str, Any] = {
    "key": "E2E-GARBAGE", "name": "Check prints garbage after the task", "prompt": "Is it fixed?",
    "start_state": "linux-tiny", "setup_script": "true",
    "success": {"check_script": 'if [ "$GH_CHECK_PHASE" = before ]; then echo False; else echo maybe; fi'},
    "limits": {"minutes": 1}, "tags": ["e2e"], "category": "Broken cases",
}


def _slow_case(examples: list[dict[str, Any]]) -> dict[str, Any]:
    base = next(c for c in examples if c["key"] == "PRM-01")
    return {**base, "key": "E2E-SLOW", "name": "Agent works past the time limit", "tags": ["e2e", "slow"],
            "category": "Time limit", "limits": {"minutes": 1}}


@dataclass
class Scenario:
    client: Eager
    server: Server
    runner_name: str
    state_dir: Path
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # label -> finished test_run
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    attempts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # every attempt, retries too
    example_keys: list[str] = field(default_factory=list)
    killed_in_flight: list[str] = field(default_factory=list)
    interrupted: set[str] = field(default_factory=set)  # in flight in any run when the runner was killed
    domains_after_kill: list[str] = field(default_factory=list)
    restart_exit: int | None = None
    leftover_domains: list[str] = field(default_factory=list)
    leftover_files: list[str] = field(default_factory=list)
    secrets_in_logs: list[str] = field(default_factory=list)


def _complete_warm_snapshot(rel: Path) -> bool:
    return len(rel.parts) == 4 and rel.parts[0] == "warm" and not rel.parts[2].endswith(".partial")


def _wait_online(client: Eager, name: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["name"] == name and r["status"] == "online" for r in client.runners.list()["data"]):
            return
        time.sleep(0.5)
    raise AssertionError(f"runner {name} did not come online within {timeout:.0f} s")


def _running_attempts(client: Eager, run_id: str) -> list[str]:
    return [a["attempt_id"] for a in client.test_runs.list_all_attempts(run_id)
            if a["status"] in ("leased", "preparing", "running", "checking")]


@pytest.fixture(scope="module")
def scenario(images_dir: Path) -> Iterator[Scenario]:
    work = traversable_tmpdir("gh-e2e-")  # libvirt-qemu must traverse it to reach the overlays in the state dir
    state_dir = work / "runner-state"
    state_dir.mkdir(mode=0o755)
    config = work / "server.yaml"
    config.write_text(yaml.safe_dump({
        "agents": {"slow-fixer": {"id": "slow-fixer", "kind": "command", "command": agent_command(SLOW_AGENT)}},
        "runner_grace_seconds": 120,
    }))
    server = Server(work / "server", config, "gh_live_" + secrets.token_urlsafe(24))
    runner_name = "e2e" + secrets.token_hex(3)
    runners: list[Runner] = []
    client: Eager | None = None
    try:
        server.wait_healthy()
        client = Eager(api_key=server.api_key, base_url=server.base_url, timeout=60)
        sc = Scenario(client, server, runner_name, state_dir)

        token = client.runners.create(runner_name)["token"]
        assert token.startswith("gh_rn_")
        runners.append(Runner(server.base_url, token, runner_name, images_dir, state_dir))
        _wait_online(client, runner_name)

        examples = yaml.safe_load(EXAMPLES.read_text())["cases"]
        sc.example_keys = [c["key"] for c in examples]
        cases: list[Any] = [*examples, NOBREAK, GARBAGE, _slow_case(examples)]
        batch = client.test_cases.batch(cases)
        assert batch["created"] == len(examples) + 3
        ids = {c["key"]: c["test_case_id"] for c in batch["data"]}
        test_set = client.test_sets.create("linux basics", repeat=2,
                                           cases=[{"test_case_id": ids[k]} for k in sc.example_keys])

        # The slow one first, so its long task overlaps the others instead of trailing them.
        started = {
            "slow": client.test_runs.create(test_case_ids=[ids["E2E-SLOW"]], agents=["slow-fixer"], name="slow"),
            "broken": client.test_runs.create(test_case_ids=[ids["E2E-NOBREAK"], ids["E2E-GARBAGE"]],
                                              agents=["noop"], repeat=1, name="broken cases"),
            "examples": client.test_sets.run(test_set["test_set_id"], agents=["noop", "reference"], name="examples"),
        }
        assert started["examples"]["progress"]["total"] == 2 * 2 * len(examples)

        # Kill the runner mid-run, once some tries are done and some are on machines.
        ex_id = started["examples"]["test_run_id"]
        deadline = time.monotonic() + RUN_DEADLINE
        while time.monotonic() < deadline:
            prog = client.test_runs.retrieve(ex_id)["progress"]
            done = prog["passed"] + prog["failed"] + prog["error"]
            if done >= 4 and (in_flight := _running_attempts(client, ex_id)):
                sc.killed_in_flight = in_flight
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the example run never got going")
        # The other runs share the runner: whatever of theirs is on a machine dies with it too.
        sc.interrupted = {aid for run in started.values() for aid in _running_attempts(client, run["test_run_id"])}
        runners[0].kill()
        sc.domains_after_kill = domains(f"gh-{runner_name}-")
        runners.append(Runner(server.base_url, token, runner_name, images_dir, state_dir))

        for label, run in started.items():
            left = max(60.0, deadline - time.monotonic())
            sc.runs[label] = dict(client.test_runs.wait(run["test_run_id"], timeout=left, poll_interval=2))
            sc.results[label] = dict(client.test_runs.results(run["test_run_id"]))
            sc.attempts[label] = [dict(a) for a in client.test_runs.list_all_attempts(run["test_run_id"])]

        sc.restart_exit = runners[1].stop()
        sc.leftover_domains = domains(f"gh-{runner_name}-")
        # The image's warm snapshot is the runner's kept cache (providers/qemu/warm.py), not a leftover; a half-built
        # one (`<key>.partial`, a kill during its build) would be.
        sc.leftover_files = [str(p.relative_to(state_dir)) for p in state_dir.rglob("*")
                             if p.is_file() and (p.suffix in (".qcow2", ".save") or "machines" in p.parts)
                             and not _complete_warm_snapshot(p.relative_to(state_dir))]
        for r in runners:
            r.stop(timeout=120)
        logs = [runners[0].log.name, server.log.name]
        for path in logs:
            text = Path(path).read_text(errors="replace")
            sc.secrets_in_logs += [f"{what} in {path}" for what, value in
                                   (("runner token", token), ("admin API key", server.api_key)) if value in text]
        yield sc
    finally:
        tear_down(runners, client, server, runner_name, work)


def _last(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in attempts if a.get("is_last", True)]


def test_every_run_completes(scenario: Scenario) -> None:
    for label, run in scenario.runs.items():
        assert run["status"] == "completed", (label, run["status"], run["progress"])
        assert run["progress"]["queued"] == 0 and run["progress"]["running"] == 0


def test_noop_fails_and_reference_passes_every_example(scenario: Scenario) -> None:
    counted = _last(scenario.attempts["examples"])
    assert len(counted) == 2 * 2 * len(scenario.example_keys)
    outcomes = Counter((a["agent_id"], a["outcome"]) for a in counted)
    detail = [(a["key"], a["agent_id"], a["outcome"], a["error"]) for a in counted
              if (a["agent_id"], a["outcome"]) not in (("noop", "failed"), ("reference", "passed"))]
    assert not detail, detail
    assert outcomes == {("noop", "failed"): 2 * len(scenario.example_keys),
                        ("reference", "passed"): 2 * len(scenario.example_keys)}
    for a in counted:
        assert a["check"]["before"] == "False"
        assert a["check"]["after"] == ("True" if a["agent_id"] == "reference" else "False")
    run = scenario.runs["examples"]
    assert run["pass_rate"] == {"noop": 0.0, "reference": 1.0}


def _in_order(chain: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A try's attempts from the first to the last retry (each retry names the attempt it retries)."""
    (first,) = [a for a in chain if a["retry_of"] is None]
    by_retry = {a["retry_of"]: a for a in chain if a["retry_of"]}
    ordered = [first]
    while ordered[-1]["attempt_id"] in by_retry:
        ordered.append(by_retry[ordered[-1]["attempt_id"]])
    assert len(ordered) == len(chain), chain
    return ordered


def _retried_as_the_rules_say(ordered: list[dict[str, Any]]) -> None:
    """Errors are retried up to 2 times, except that an author's case error (`error_cause: case`) that
    repeats in the same phase on a fresh machine is not retried again: then the try ends at 2 attempts.
    An error of ours in between (the SIGKILL above) is retried as before."""
    assert 2 <= len(ordered) <= 3, [(a["attempt_id"], a["error_cause"], a["error"]) for a in ordered]
    if len(ordered) == 2:
        assert [a["error_cause"] for a in ordered] == ["case", "case"], ordered
    assert [a.get("is_last") for a in ordered] == [False] * (len(ordered) - 1) + [True]
    assert all(a["try"] == 1 for a in ordered)


def test_setup_that_breaks_nothing_is_an_error_of_the_case_not_retried_once_it_repeats(scenario: Scenario) -> None:
    chain = [a for a in scenario.attempts["broken"] if a["key"] == "E2E-NOBREAK"]
    assert all(a["outcome"] == "error" for a in chain)
    ordered = _in_order(chain)
    _retried_as_the_rules_say(ordered)
    # An operator can tell what happened: the check printed True before the task, the author's case.
    told = [a for a in ordered if not _interrupted_by_the_kill(scenario, a)]
    assert told  # at least one attempt of the chain ran its check
    for a in told:
        assert "True" in (a["error"] or "") and "before" in (a["error"] or ""), a["error"]
        assert a["error_cause"] == "case", a


def _interrupted_by_the_kill(scenario: Scenario, a: dict[str, Any]) -> bool:
    """Attempts that ended as errors of ours before their case ran: interrupted by the SIGKILL above, or
    a machine that could not be made (an infrastructure error, retried like any other)."""
    error = a["error"] or ""
    return a["attempt_id"] in scenario.interrupted or error.startswith(("interrupted: the runner stopped",
                                                                       "machine:")) or (
        "reconnected without this attempt" in error)


def test_check_printing_garbage_is_an_error(scenario: Scenario) -> None:
    chain = [a for a in scenario.attempts["broken"] if a["key"] == "E2E-GARBAGE"]
    assert all(a["outcome"] == "error" for a in chain)
    _retried_as_the_rules_say(_in_order(chain))
    # An attempt the SIGKILL above interrupted is an error of its own (the runner's, with no check).
    checked = [a for a in chain if not _interrupted_by_the_kill(scenario, a)]
    assert checked  # at least one attempt of the chain ran its checks
    for a in checked:
        assert a["check"]["before"] == "False"
        assert a["check"]["after"] == "maybe" or "maybe" in (a["error"] or "")
    results = scenario.results["broken"]
    assert results["by_agent"]["noop"]["error"] == 2 and results["by_agent"]["noop"]["pass_rate"] is None


def test_task_past_its_time_limit_is_still_checked(scenario: Scenario) -> None:
    (a,) = _last(scenario.attempts["slow"])
    assert a["outcome"] == "passed", (a["outcome"], a["error"])
    assert a["check"]["after"] == "True"
    phases = (a["metrics"] or {}).get("phase_seconds") or {}
    # The agent sleeps 10 minutes: the task ended at the 1-minute limit (plus the runner's grace).
    assert 55.0 <= phases["task"] <= 60.0 + 30.0 + 15.0, phases


def test_results_totals_and_breakdowns_add_up(scenario: Scenario) -> None:
    for label, res in scenario.results.items():
        rows = res["data"]
        totals = res["totals"]
        assert totals["tries"] == sum(r["tries"] for r in rows) == scenario.runs[label]["progress"]["total"]
        for k in ("passed", "failed", "error"):
            assert totals[k] == sum(r[k] for r in rows), (label, k)
        assert totals["passed"] + totals["failed"] + totals["error"] == totals["tries"]
        assert totals["attempts"] == len(scenario.attempts[label]), label
        for r in rows:
            assert r["passed"] + r["failed"] + r["error"] + r.get("cancelled", 0) == r["tries"], r
            assert r["all_passed"] == (r["passed"] == r["tries"])
        for agent, tally in res["by_agent"].items():
            mine = [r for r in rows if r["agent_id"] == agent]
            for k in ("tries", "passed", "failed", "error"):
                assert tally[k] == sum(r[k] for r in mine), (label, agent, k)
        for dim, field_ in (("by_tag", "tags"), ("by_category", "category")):
            for value, per_agent in res[dim].items():
                for agent, tally in per_agent.items():
                    mine = [r for r in rows if r["agent_id"] == agent and
                            (value in r[field_] if field_ == "tags" else r[field_] == value)]
                    for k in ("tries", "passed"):
                        assert tally[k] == sum(r[k] for r in mine), (label, dim, value, agent, k)
    # Every counted attempt appears in exactly one results row.
    ex = scenario.results["examples"]
    assert {(r["key"], r["agent_id"]) for r in ex["data"]} == \
        {(k, a) for k in scenario.example_keys for a in ("noop", "reference")}


def test_runner_killed_mid_run_recovers_and_leaves_nothing(scenario: Scenario) -> None:
    assert scenario.killed_in_flight, "the runner was killed with no attempt in flight"
    everything = [a for run in scenario.attempts.values() for a in run]
    by_id = {a["attempt_id"]: a for a in everything}
    # Each attempt that was on a machine when the runner died ended as an error and was retried.
    for aid in scenario.killed_in_flight:
        a = by_id[aid]
        if a["outcome"] == "error":
            assert any(b["retry_of"] == aid for b in everything), aid
    assert scenario.restart_exit == 0
    assert scenario.leftover_domains == []
    assert scenario.leftover_files == []


def test_no_token_or_api_key_reaches_a_log(scenario: Scenario) -> None:
    assert scenario.secrets_in_logs == []


def test_each_attempt_has_a_replay_that_loads(scenario: Scenario) -> None:
    everything = [a for run in scenario.attempts.values() for a in run]
    shown: dict[str, dict[str, Any]] = {}
    with httpx.Client(timeout=60) as http:
        for a in everything:
            url = a["replay_url"]
            assert url and url.startswith(scenario.server.base_url), a
            page = http.get(url)
            assert page.status_code == 200, (a["attempt_id"], page.status_code, page.text[:200])
            data = replay_data(page.text)
            assert data["attempt_id"] == a["attempt_id"] and data["outcome"] == a["outcome"]
            if a["outcome"] in ("passed", "failed"):
                labels = [f["label"] for f in data["frames"]]
                assert "first" in labels and "last" in labels, (a["attempt_id"], labels)
                frame = http.get(scenario.server.base_url + data["frames"][0]["src"])
                assert frame.status_code == 200 and frame.content[:8] == b"\x89PNG\r\n\x1a\n"
                assert {p["name"] for p in data["phases"]} >= {"machine", "setup", "task", "check_after"}
            if a["agent_id"] == "slow-fixer" and a["outcome"] in ("passed", "failed"):
                assert any(f["event"] and f["event"]["type"] == "type" for f in data["frames"])
            shown.setdefault(a["outcome"], a)
        # Without its token the page is refused.
        first = everything[0]
        assert http.get(first["replay_url"].split("?")[0]).status_code == 401
    if chromium.chromium() is None:
        pytest.fail("chromium is not installed: apt-get install chromium")
    for outcome, a in sorted(shown.items()):
        shot = chromium.OUTPUT_DIR / "e2e" / f"replay-{outcome}-{a['key']}-{a['agent_id']}.png"
        loaded = chromium.load(a["replay_url"], shot)
        assert 'data-ready="1"' in loaded.dom, outcome
        assert a["attempt_id"] in loaded.dom
        with Image.open(loaded.screenshot) as im:
            assert im.size[0] >= 800
