"""Matching a lease on a start-state version to a runner, when the version is in a registry (docs/start-states.md)."""

from __future__ import annotations

from gh_server.attempts.matching import Candidate, RunnerCaps, pick_runner, runner_can_run

REG = "registry.lab:5000/gh"
STATE = {"kind": "state", "image": "linux-tiny", "start_state_id": "ss_1", "version": 2}


def runner(rid: str, *, held: bool = False, registry: str | None = REG, images: tuple[str, ...] = ("linux-tiny",),
           free: int = 2, hot: bool = False) -> RunnerCaps:
    return RunnerCaps(rid, rid, frozenset(), frozenset(images), frozenset({("ss_1", 2)} if held else set()),
                      free=free, hot=frozenset({("state", "ss_1", "2")} if hot else set()), registry=registry)


def cand(**ss: object) -> Candidate:
    return Candidate("at_1", "vm", {**STATE, **ss}, None)


def never(_a: str, _r: str) -> bool:
    return False


def test_a_registry_version_fits_any_runner_with_that_registry_and_the_base_image() -> None:
    c = cand(registry=REG)
    assert runner_can_run(c, runner("holder", held=True, registry=None))
    assert runner_can_run(c, runner("puller"))
    assert not runner_can_run(c, runner("no-registry", registry=None))
    assert not runner_can_run(c, runner("other-registry", registry="other:5000/gh"))
    assert not runner_can_run(c, runner("no-image", images=("win10",)))
    # Not published: the holder only, as before.
    assert not runner_can_run(cand(), runner("puller"))


def test_holders_and_hot_runners_come_first_then_free_slots() -> None:
    c = cand(registry=REG)
    assert pick_runner(c, [runner("puller", free=4), runner("holder", held=True, free=1)], never).runner_id == "holder"
    picked = pick_runner(c, [runner("holder", held=True, free=4), runner("hot", held=True, hot=True, free=1)], never)
    assert picked is not None and picked.runner_id == "hot"
    # Holders full: a puller takes it rather than the attempt waiting.
    picked = pick_runner(c, [runner("holder", held=True, free=0), runner("puller", free=1)], never)
    assert picked is not None and picked.runner_id == "puller"
    # A puller that refused it (registry down) is skipped a while: the attempt waits for the holder.
    assert pick_runner(c, [runner("holder", held=True, free=0), runner("puller", free=1)],
                       lambda _a, r: r == "puller") is None
