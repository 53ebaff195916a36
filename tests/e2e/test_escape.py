"""No way out of the score on the real linux-tiny guest: the short version of bench/escape.py (tests/e2e/escape.py,
`gh-runner local`, one run, one slot: each try follows the last on the same runner). Hostile command agents
answer with a NUL or 297 KB of UTF-8, send an exec with a NUL, and kill, stop and remove the guest agent and
gh-execd as root. Every try ends `failed` (by its check or by the channel rule), none is an error, none is
retried, nothing is left behind.

The guest's init (busybox, /etc/inittab `respawn`) brings a killed qemu-ga and gh-execd back: the check then
runs as usual. A stopped or removed one stays dead: `check_channel_lost_in_task`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.scratch import scratch_dir

from . import escape

SHORT = ["answer-nul", "answer-long", "exec-nul-script", "kill-guest-agent", "stop-guest-agent",
         "remove-guest-agent"]

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def campaign(images_dir: Path) -> Iterator[escape.Campaign]:
    with scratch_dir("gh-escape-test-") as work:
        yield escape.run(work, images_dir, SHORT, timeout=1700)


def test_no_hostile_agent_becomes_our_error(campaign: escape.Campaign) -> None:
    rows = {r.input: r for r in campaign.rows()}
    assert sorted(rows) == sorted(SHORT)
    for r in rows.values():
        assert r.outcome == "failed" and r.retries == 0, r
    assert campaign.errors_of_ours() == 0
    assert campaign.report["results"]["totals"]["infrastructure"]["errors"] == 0
    assert campaign.leftover == []


def test_each_ends_for_its_own_reason(campaign: escape.Campaign) -> None:
    by = {a["agent_id"]: a for a in campaign.report["attempts"]}
    assert by["answer-nul"]["metrics"]["task_end"]["fault"] == "answer_has_nul"
    assert by["answer-long"]["metrics"]["task_end"]["fault"] == "answer_too_long"
    for mode in ("answer-nul", "answer-long", "exec-nul-script", "kill-guest-agent"):
        assert by[mode]["check"]["after"] is not None, mode  # the check ran (and found its answer file)
    assert by["kill-guest-agent"]["metrics"].get("failed_reason") is None  # init brought it back
    for mode in ("stop-guest-agent", "remove-guest-agent"):
        assert by[mode]["metrics"]["failed_reason"] == "check_channel_lost_in_task", by[mode]
